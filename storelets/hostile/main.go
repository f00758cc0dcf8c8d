// hostile: a storelet that misbehaves on purpose, for tests and the denial-of-service
// benchmark. Its first argument picks how:
//
//	spin          busy loop forever
//	grow          allocate memory forever
//	flood         write to stdout forever
//	open PATH     open and close PATH forever
//	read PATH     read PATH from the start, forever
//	write PATH    append to PATH forever
//
// Build: GOOS=wasip1 GOARCH=wasm go build -o hostile.wasm .
package main

import (
	"fmt"
	"os"
)

var sink [][]byte

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hostile spin|grow|flood|open PATH|read PATH|write PATH")
		os.Exit(2)
	}
	arg := func() string {
		if len(os.Args) < 3 {
			fmt.Fprintln(os.Stderr, "hostile: "+os.Args[1]+" needs a PATH")
			os.Exit(2)
		}
		return os.Args[2]
	}
	switch os.Args[1] {
	case "spin":
		x := 0
		for {
			x++
		}
	case "grow":
		for {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			sink = append(sink, b)
		}
	case "flood":
		line := []byte("flood flood flood flood flood flood flood flood flood flood flood flood\n")
		for {
			os.Stdout.Write(line)
		}
	case "open":
		p := arg()
		for {
			f, err := os.Open(p)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			f.Close()
		}
	case "read":
		p := arg()
		buf := make([]byte, 1<<16)
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for {
			if n, _ := f.ReadAt(buf, 0); n == 0 {
				fmt.Fprintln(os.Stderr, "hostile: nothing to read")
				os.Exit(1)
			}
		}
	case "write":
		p := arg()
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		buf := make([]byte, 1<<16)
		for {
			if _, err := f.Write(buf); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
	default:
		fmt.Fprintln(os.Stderr, "hostile: unknown mode "+os.Args[1])
		os.Exit(2)
	}
}
