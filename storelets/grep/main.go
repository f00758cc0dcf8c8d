// grep: a storelet that searches files beneath the preopened directory for lines that
// match a pattern and prints them as `grep -rn` does: `path:line:text`.
//
//	grep [-F] [-i] [-l] [-c] PATTERN [PATH...]
//
// -F takes PATTERN as a fixed string (default: a Go regular expression, which agrees
// with `grep -E` on common patterns); -i ignores case; -l prints only the names of
// files that match; -c prints `path:count` for every file searched. Files holding a
// NUL byte in their first 8 KiB are binary and skipped. Exit status: 0 if a line
// matched, 1 if none did, 2 on error, as grep's.
// Build: GOOS=wasip1 GOARCH=wasm go build -o grep.wasm .
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strings"
)

type options struct {
	fixed, fold, names, count bool
}

func main() {
	var o options
	args := os.Args[1:]
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && len(args[0]) > 1 {
		for _, c := range args[0][1:] {
			switch c {
			case 'F':
				o.fixed = true
			case 'i':
				o.fold = true
			case 'l':
				o.names = true
			case 'c':
				o.count = true
			case 'r', 'n', 'E':
				// always recursive, always numbered, always extended
			default:
				fail(fmt.Sprintf("grep: unknown option -%c", c))
			}
		}
		args = args[1:]
	}
	if len(args) == 0 {
		fail("usage: grep [-F] [-i] [-l] [-c] PATTERN [PATH...]")
	}
	expr := args[0]
	if o.fixed {
		expr = regexp.QuoteMeta(expr)
	}
	if o.fold {
		expr = "(?i)" + expr
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		fail("grep: " + err.Error())
	}
	roots := args[1:]
	if len(roots) == 0 {
		roots = []string{"/"}
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	matched := false
	for _, root := range roots {
		err := fs.WalkDir(os.DirFS(root), ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			name := path.Join(root, p)
			if search(re, &o, os.DirFS(root), p, name, out) {
				matched = true
			}
			return nil
		})
		if err != nil {
			out.Flush()
			fail("grep: " + err.Error())
		}
	}
	out.Flush()
	if !matched {
		os.Exit(1)
	}
}

// search prints the matches of one file and says whether there were any.
func search(re *regexp.Regexp, o *options, fsys fs.FS, p, name string, out *bufio.Writer) bool {
	f, err := fsys.Open(p)
	if err != nil {
		fmt.Fprintln(os.Stderr, "grep:", name+":", err)
		return false
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	if head, _ := r.Peek(8192); bytes.IndexByte(head, 0) >= 0 {
		return false
	}
	count := 0
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			text := bytes.TrimSuffix(line, []byte("\n"))
			if re.Match(text) {
				count++
				if o.names {
					break
				}
				if !o.count {
					fmt.Fprintf(out, "%s:%d:%s\n", name, n, text)
				}
			}
		}
		if err != nil {
			break
		}
	}
	switch {
	case o.names && count > 0:
		fmt.Fprintln(out, name)
	case o.count:
		fmt.Fprintf(out, "%s:%d\n", name, count)
	}
	return count > 0
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(2)
}
