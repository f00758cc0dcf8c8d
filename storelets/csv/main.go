// csv: a storelet that filters and aggregates a CSV file with a header row, so that
// only the answer crosses the network.
//
//	csv FILE [-where COLUMN OP VALUE]... [-select COL,COL...] [-count] [-sum COLUMN] [-by COLUMN]
//
// OP is one of = != < <= > >= (numeric when both sides are numbers, else string
// comparison) or ~ (substring). Without -count or -sum the selected rows are printed
// as CSV (all columns unless -select). -count and -sum print one value, or with -by one
// `key,value` line per distinct key in key order. Numbers print in their shortest form.
// Build: GOOS=wasip1 GOARCH=wasm go build -o csv.wasm .
package main

import (
	"bufio"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

type predicate struct {
	col   int
	op    string
	value string
}

func main() {
	args := os.Args[1:]
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fail("usage: csv FILE [-where COLUMN OP VALUE]... [-select COLS] [-count] [-sum COLUMN] [-by COLUMN]")
	}
	f, err := os.Open(args[0])
	if err != nil {
		fail("csv: " + err.Error())
	}
	r := csv.NewReader(bufio.NewReaderSize(f, 1<<16))
	r.ReuseRecord = true
	header, err := r.Read()
	if err != nil {
		fail("csv: reading the header: " + err.Error())
	}
	header = append([]string(nil), header...)
	column := func(name string) int {
		for i, h := range header {
			if h == name {
				return i
			}
		}
		fail("csv: no column " + strconv.Quote(name))
		return -1
	}
	var where []predicate
	var selected []int
	count, sumCol, byCol := false, -1, -1
	for i := 1; i < len(args); i++ {
		need := func(n int) {
			if i+n >= len(args) {
				fail("csv: " + args[i] + " needs " + strconv.Itoa(n) + " argument(s)")
			}
		}
		switch args[i] {
		case "-where":
			need(3)
			p := predicate{column(args[i+1]), args[i+2], args[i+3]}
			switch p.op {
			case "=", "!=", "<", "<=", ">", ">=", "~":
			default:
				fail("csv: unknown operator " + p.op)
			}
			where = append(where, p)
			i += 3
		case "-select":
			need(1)
			for _, name := range strings.Split(args[i+1], ",") {
				selected = append(selected, column(name))
			}
			i++
		case "-count":
			count = true
		case "-sum":
			need(1)
			sumCol = column(args[i+1])
			i++
		case "-by":
			need(1)
			byCol = column(args[i+1])
			i++
		default:
			fail("csv: unknown argument " + args[i])
		}
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	defer out.Flush()
	w := csv.NewWriter(out)
	if !count && sumCol < 0 {
		w.Write(pick(header, selected))
	}
	totals := map[string]float64{}
	for line := 2; ; line++ {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			out.Flush()
			fail("csv: " + err.Error())
		}
		if !matches(rec, where) {
			continue
		}
		if !count && sumCol < 0 {
			w.Write(pick(rec, selected))
			continue
		}
		key := ""
		if byCol >= 0 {
			key = rec[byCol]
		}
		add := 1.0
		if sumCol >= 0 {
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[sumCol]), 64)
			if err != nil {
				out.Flush()
				fail(fmt.Sprintf("csv: line %d: %s is not a number: %q", line, header[sumCol], rec[sumCol]))
			}
			add = v
		}
		totals[key] += add
	}
	w.Flush()
	if !count && sumCol < 0 {
		return
	}
	if byCol < 0 {
		fmt.Fprintln(out, number(totals[""]))
		return
	}
	keys := make([]string, 0, len(totals))
	for k := range totals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(out, "%s,%s\n", k, number(totals[k]))
	}
}

func pick(rec []string, cols []int) []string {
	if cols == nil {
		return rec
	}
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = rec[c]
	}
	return out
}

func matches(rec []string, where []predicate) bool {
	for _, p := range where {
		v := rec[p.col]
		if p.op == "~" {
			if !strings.Contains(v, p.value) {
				return false
			}
			continue
		}
		cmp := strings.Compare(v, p.value)
		a, errA := strconv.ParseFloat(strings.TrimSpace(v), 64)
		b, errB := strconv.ParseFloat(p.value, 64)
		if errA == nil && errB == nil {
			cmp = 0
			if a < b {
				cmp = -1
			} else if a > b {
				cmp = 1
			}
		}
		ok := map[string]bool{"=": cmp == 0, "!=": cmp != 0, "<": cmp < 0, "<=": cmp <= 0, ">": cmp > 0, ">=": cmp >= 0}[p.op]
		if !ok {
			return false
		}
	}
	return true
}

func number(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(2)
}
