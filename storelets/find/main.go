// find: a storelet that walks the preopened directory and prints the paths that match
// every test given, like GNU `find DIR [-name GLOB] [-type f|d|l] [-size [+-]N[cbkMG]]`
// (sizes in units rounded up, as find counts them; no unit means 512-byte blocks).
// Build: GOOS=wasip1 GOARCH=wasm go build -o find.wasm .
package main

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
)

// sizeTest is a parsed -size argument: compare the size in units, rounded up, with n.
type sizeTest struct {
	sign byte
	n    int64
	unit int64
}

func parseSize(s string) (sizeTest, error) {
	t := sizeTest{unit: 512}
	if s != "" && (s[0] == '+' || s[0] == '-') {
		t.sign, s = s[0], s[1:]
	}
	if s != "" {
		switch s[len(s)-1] {
		case 'c':
			t.unit, s = 1, s[:len(s)-1]
		case 'b':
			t.unit, s = 512, s[:len(s)-1]
		case 'k':
			t.unit, s = 1<<10, s[:len(s)-1]
		case 'M':
			t.unit, s = 1<<20, s[:len(s)-1]
		case 'G':
			t.unit, s = 1<<30, s[:len(s)-1]
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	t.n = n
	return t, err
}

func (t sizeTest) match(size int64) bool {
	units := (size + t.unit - 1) / t.unit
	switch t.sign {
	case '+':
		return units > t.n
	case '-':
		return units < t.n
	}
	return units == t.n
}

func main() {
	root, glob, kind := "/", "", ""
	var sizes []sizeTest
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		flag := args[i]
		if flag == "-name" || flag == "-type" || flag == "-size" {
			if i+1 == len(args) {
				fail("find: " + flag + " needs an argument")
			}
			i++
		}
		switch flag {
		case "-name":
			glob = args[i]
		case "-type":
			kind = args[i]
		case "-size":
			t, err := parseSize(args[i])
			if err != nil {
				fail("find: bad -size " + args[i])
			}
			sizes = append(sizes, t)
		default:
			root = args[i]
		}
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	defer out.Flush()
	err := fs.WalkDir(os.DirFS(root), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		t := d.Type()
		if kind == "f" && !t.IsRegular() || kind == "d" && !d.IsDir() || kind == "l" && t&fs.ModeSymlink == 0 {
			return nil
		}
		if len(sizes) > 0 {
			info, err := d.Info()
			if err != nil {
				return nil
			}
			for _, s := range sizes {
				if !s.match(info.Size()) {
					return nil
				}
			}
		}
		name := d.Name()
		if p == "." {
			name = path.Base(root)
		}
		if ok, _ := path.Match(glob, name); ok || glob == "" {
			fmt.Fprintln(out, path.Join(root, p))
		}
		return nil
	})
	if err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(1)
}
