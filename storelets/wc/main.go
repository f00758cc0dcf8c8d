// wc: a storelet that counts lines, words and bytes of every regular file beneath the
// given paths, as `wc` prints them (`lines words bytes path`, then a `total` line), or
// with -sha256 prints each file's SHA-256 as `sha256sum` does (`hex  path`).
//
//	wc [-sha256] [PATH...]
//
// Build: GOOS=wasip1 GOARCH=wasm go build -o wc.wasm .
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
)

type counts struct{ lines, words, bytes int64 }

func main() {
	args := os.Args[1:]
	sum := false
	if len(args) > 0 && args[0] == "-sha256" {
		sum, args = true, args[1:]
	}
	if len(args) == 0 {
		args = []string{"/"}
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	defer out.Flush()
	var total counts
	failed := false
	for _, root := range args {
		fsys := os.DirFS(root)
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			name := path.Join(root, p)
			f, err := fsys.Open(p)
			if err != nil {
				fmt.Fprintln(os.Stderr, "wc:", name+":", err)
				failed = true
				return nil
			}
			defer f.Close()
			if sum {
				h := sha256.New()
				if _, err := io.Copy(h, f); err != nil {
					fmt.Fprintln(os.Stderr, "wc:", name+":", err)
					failed = true
					return nil
				}
				fmt.Fprintf(out, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), name)
				return nil
			}
			c, err := count(f)
			if err != nil {
				fmt.Fprintln(os.Stderr, "wc:", name+":", err)
				failed = true
				return nil
			}
			fmt.Fprintf(out, "%d %d %d %s\n", c.lines, c.words, c.bytes, name)
			total.lines, total.words, total.bytes = total.lines+c.lines, total.words+c.words, total.bytes+c.bytes
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "wc:", err)
			failed = true
		}
	}
	if !sum {
		fmt.Fprintf(out, "%d %d %d total\n", total.lines, total.words, total.bytes)
	}
	if failed {
		out.Flush()
		os.Exit(1)
	}
}

// count counts as wc does in the C locale: newlines, runs of non-space bytes, bytes.
func count(r io.Reader) (counts, error) {
	var c counts
	buf := make([]byte, 1<<16)
	inWord := false
	for {
		n, err := r.Read(buf)
		for _, b := range buf[:n] {
			space := b == ' ' || b == '\n' || b == '\t' || b == '\r' || b == '\v' || b == '\f'
			if b == '\n' {
				c.lines++
			}
			if !space && !inWord {
				c.words++
			}
			inWord = !space
		}
		c.bytes += int64(n)
		if err == io.EOF {
			return c, nil
		}
		if err != nil {
			return c, err
		}
	}
}
