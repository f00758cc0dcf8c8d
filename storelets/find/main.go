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
	"strings"
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
	nameMatches := globMatcher(glob)
	match := func(dir string, name string, t fs.FileMode, info func() (fs.FileInfo, error)) {
		if kind == "f" && !t.IsRegular() || kind == "d" && !t.IsDir() || kind == "l" && t&fs.ModeSymlink == 0 {
			return
		}
		if !nameMatches(name) {
			return
		}
		if len(sizes) > 0 {
			fi, err := info()
			if err != nil {
				return
			}
			for _, s := range sizes {
				if !s.match(fi.Size()) {
					return
				}
			}
		}
		if dir != "" {
			out.WriteString(dir)
			if dir != "/" {
				out.WriteByte('/')
			}
		}
		out.WriteString(name)
		out.WriteByte('\n')
	}
	fi, err := os.Lstat(root)
	if err != nil {
		out.Flush()
		fail(err.Error())
	}
	match("", root, fi.Mode().Type(), func() (fs.FileInfo, error) { return fi, nil })
	if fi.IsDir() {
		walk(root, match)
	}
}

// globMatcher returns a test of base names against glob: path.Match in general, with
// fast paths for the common shapes `*`, `*SUFFIX`, `PREFIX*` and a literal name.
func globMatcher(glob string) func(string) bool {
	if glob == "" || glob == "*" {
		return func(string) bool { return true }
	}
	special := func(s string) bool { return strings.ContainsAny(s, "*?[\\") }
	switch {
	case glob[0] == '*' && !special(glob[1:]):
		suffix := glob[1:]
		return func(name string) bool { return strings.HasSuffix(name, suffix) }
	case glob[len(glob)-1] == '*' && !special(glob[:len(glob)-1]):
		prefix := glob[:len(glob)-1]
		return func(name string) bool { return strings.HasPrefix(name, prefix) }
	case !special(glob):
		return func(name string) bool { return name == glob }
	}
	return func(name string) bool {
		ok, _ := path.Match(glob, name)
		return ok
	}
}

// walk visits the entries of dir in directory order (no sorting: find does not sort
// either), depth first, without following symbolic links.
func walk(dir string, match func(dir, name string, t fs.FileMode, info func() (fs.FileInfo, error))) {
	f, err := os.Open(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "find:", err)
		return
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "find:", err)
	}
	for _, e := range entries {
		match(dir, e.Name(), e.Type(), e.Info)
		if e.IsDir() {
			if dir == "/" {
				walk("/"+e.Name(), match)
			} else {
				walk(dir+"/"+e.Name(), match)
			}
		}
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(1)
}
