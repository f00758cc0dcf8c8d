// find: a storelet that walks the preopened directory and prints the paths whose base
// name matches a glob, like `find DIR -name GLOB`, with optional -type f|d.
// Build: GOOS=wasip1 GOARCH=wasm go build -o find.wasm .
package main

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path"
)

func main() {
	root, glob, kind := "/", "*", ""
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "-name":
			i++
			glob = args[i]
		case "-type":
			i++
			kind = args[i]
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
		if kind == "f" && !d.Type().IsRegular() || kind == "d" && !d.IsDir() {
			return nil
		}
		if ok, _ := path.Match(glob, d.Name()); ok {
			fmt.Fprintln(out, path.Join(root, p))
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
