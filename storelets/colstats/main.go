// colstats: a storelet, and an active-file handler, that prints statistics of every
// numeric column of a CSV file with a header row, so that opening
// `colstats@data.csv` on a Locus export computes them at the server and only the
// answer crosses the network.
//
//	colstats FILE [COLUMN...]
//
// Prints one CSV line per column, `column,count,mean,min,max,stddev`, for the named
// columns or, without names, for every column whose values all parse as numbers
// (empty cells are skipped). Exits 66 (EX_NOINPUT) when FILE cannot be opened and 65
// (EX_DATAERR) when it is not CSV, which Locus reports as ENOENT and EINVAL.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -o colstats.wasm .
package main

import (
	"bufio"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
)

type column struct {
	name     string
	numeric  bool
	count    int64
	mean, m2 float64 // Welford's running mean and sum of squared deviations
	min, max float64
}

func (c *column) add(x float64) {
	c.count++
	if c.count == 1 || x < c.min {
		c.min = x
	}
	if c.count == 1 || x > c.max {
		c.max = x
	}
	d := x - c.mean
	c.mean += d / float64(c.count)
	c.m2 += d * (x - c.mean)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: colstats FILE [COLUMN...]")
		os.Exit(64)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "colstats:", err)
		os.Exit(66)
	}
	r := csv.NewReader(bufio.NewReaderSize(f, 1<<20))
	r.ReuseRecord = true
	header, err := r.Read()
	if err != nil {
		fmt.Fprintln(os.Stderr, "colstats: reading the header:", err)
		os.Exit(65)
	}
	cols := make([]column, len(header))
	for i, h := range header {
		cols[i] = column{name: h, numeric: true}
	}
	wanted := map[string]bool{}
	for _, name := range os.Args[2:] {
		wanted[name] = true
	}
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "colstats:", err)
			os.Exit(65)
		}
		for i := range cols {
			if i >= len(rec) || !cols[i].numeric || rec[i] == "" {
				continue
			}
			x, err := strconv.ParseFloat(rec[i], 64)
			if err != nil {
				cols[i].numeric = false
				continue
			}
			cols[i].add(x)
		}
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	fmt.Fprintln(out, "column,count,mean,min,max,stddev")
	for _, c := range cols {
		if len(wanted) > 0 && !wanted[c.name] || len(wanted) == 0 && (!c.numeric || c.count == 0) {
			continue
		}
		sd := 0.0
		if c.count > 1 {
			sd = math.Sqrt(c.m2 / float64(c.count-1))
		}
		g := func(x float64) string { return strconv.FormatFloat(x, 'g', 10, 64) }
		fmt.Fprintf(out, "%s,%d,%s,%s,%s,%s\n", c.name, c.count, g(c.mean), g(c.min), g(c.max), g(sd))
	}
}
