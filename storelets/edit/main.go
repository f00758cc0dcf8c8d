// edit: a storelet that changes the files of its directory, for writable runs; each
// edit applies to every file whose name ends in SUFFIX, so that a run split over many
// data nodes does on each what one run would do on the whole directory:
//
//	upper SUFFIX       rewrite each such file in upper case
//	copy SUFFIX EXT    write a copy of each such file, named with EXT appended
//	rm SUFFIX          remove each such file
//
// Edits apply in order; each file changed is printed as "EDIT PATH".
// Build: GOOS=wasip1 GOARCH=wasm go build -o edit.wasm .
package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

func fail(err error) {
	fmt.Fprintln(os.Stderr, "edit:", err)
	os.Exit(1)
}

// files answers every regular file under the directory whose name ends in suffix.
func files(suffix string) []string {
	var out []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.HasSuffix(p, suffix) {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		fail(err)
	}
	return out
}

func main() {
	args := os.Args[1:]
	need := func(n int) {
		if len(args) < n {
			fmt.Fprintln(os.Stderr, "usage: edit [upper SUFFIX | copy SUFFIX EXT | rm SUFFIX]...")
			os.Exit(2)
		}
	}
	for len(args) > 0 {
		need(2)
		op, suffix := args[0], args[1]
		switch op {
		case "upper":
			for _, p := range files(suffix) {
				data, err := os.ReadFile(p)
				if err != nil {
					fail(err)
				}
				if err := os.WriteFile(p, bytes.ToUpper(data), 0o644); err != nil {
					fail(err)
				}
				fmt.Println("upper", p)
			}
			args = args[2:]
		case "copy":
			need(3)
			for _, p := range files(suffix) {
				data, err := os.ReadFile(p)
				if err != nil {
					fail(err)
				}
				if err := os.WriteFile(p+args[2], data, 0o644); err != nil {
					fail(err)
				}
				fmt.Println("copy", p)
			}
			args = args[3:]
		case "rm":
			for _, p := range files(suffix) {
				if err := os.Remove(p); err != nil {
					fail(err)
				}
				fmt.Println("rm", p)
			}
			args = args[2:]
		default:
			need(1 << 30)
		}
	}
}
