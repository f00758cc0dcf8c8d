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
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
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

// readRecord reads one CSV line into fields (reusing rec's slice). Lines without quotes,
// the common case, are split in place; a line with a quote goes to encoding/csv.
func readRecord(in *bufio.Reader, rec [][]byte) ([][]byte, error) {
	line, err := in.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// A line longer than the buffer: collect it whole.
		long := append([]byte(nil), line...)
		for err == bufio.ErrBufferFull {
			line, err = in.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	if len(line) == 0 && err != nil {
		return rec, err
	}
	line = bytes.TrimRight(line, "\r\n")
	if bytes.IndexByte(line, '"') >= 0 {
		fields, err := csv.NewReader(bytes.NewReader(line)).Read()
		if err != nil {
			return rec, err
		}
		rec = rec[:0]
		for _, f := range fields {
			rec = append(rec, []byte(f))
		}
		return rec, nil
	}
	rec = rec[:0]
	for {
		i := bytes.IndexByte(line, ',')
		if i < 0 {
			return append(rec, line), nil
		}
		rec = append(rec, line[:i])
		line = line[i+1:]
	}
}

// pow10 holds the powers of ten that a float64 represents exactly.
var pow10 = [...]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// parseNumber parses a decimal number. Plain decimals with at most 15 digits take the
// exact fast path (an integer and a power of ten, both exact, divided once, which
// rounds correctly); anything else goes to strconv.ParseFloat.
func parseNumber(b []byte) (float64, bool) {
	neg, i := false, 0
	if b[0] == '-' || b[0] == '+' {
		neg, i = b[0] == '-', 1
	}
	var mant uint64
	digits, frac, dot := 0, 0, false
	for ; i < len(b); i++ {
		c := b[i]
		switch {
		case c >= '0' && c <= '9':
			mant = mant*10 + uint64(c-'0')
			digits++
			if dot {
				frac++
			}
		case c == '.' && !dot:
			dot = true
		default:
			x, err := strconv.ParseFloat(string(b), 64)
			return x, err == nil
		}
	}
	if digits == 0 || digits > 15 {
		x, err := strconv.ParseFloat(string(b), 64)
		return x, err == nil
	}
	x := float64(mant) / pow10[frac]
	if neg {
		x = -x
	}
	return x, true
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
	in := bufio.NewReaderSize(f, 1<<20)
	header, err := readRecord(in, nil)
	if err != nil || len(header) == 0 {
		fmt.Fprintln(os.Stderr, "colstats: reading the header:", err)
		os.Exit(65)
	}
	cols := make([]column, len(header))
	for i, h := range header {
		cols[i] = column{name: string(h), numeric: true}
	}
	wanted := map[string]bool{}
	for _, name := range os.Args[2:] {
		wanted[name] = true
	}
	var rec [][]byte
	for {
		rec, err = readRecord(in, rec)
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "colstats:", err)
			os.Exit(65)
		}
		for i := range cols {
			if i >= len(rec) || !cols[i].numeric || len(rec[i]) == 0 {
				continue
			}
			x, ok := parseNumber(rec[i])
			if !ok {
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
		name := c.name
		if strings.ContainsAny(name, ",\"\r\n") {
			name = `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
		}
		fmt.Fprintf(out, "%s,%d,%s,%s,%s,%s\n", name, c.count, g(c.mean), g(c.min), g(c.max), g(sd))
	}
}
