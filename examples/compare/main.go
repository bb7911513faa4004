// Compare runs the same traffic through the five algorithms, in memory on a simulated
// clock (instant and deterministic), prints what each admits, and draws it:
//
//	go run ./examples/compare                # the chart in the temporary directory
//	go run ./examples/compare -o compare.svg # or where -o says
//
// For each scenario and algorithm it reports the requests admitted and denied, the most
// admitted in any interval of one period (the fixed window's 2x shows here), how evenly
// the admitted requests are spread (the coefficient of variation of the gaps between
// them: 0 is an even pace), and the most state a key held, in memory and in Redis.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
)

func main() {
	out := flag.String("o", filepath.Join(os.TempDir(), "ratelimit-compare.svg"),
		"where to write the chart (SVG); empty for none")
	flag.Parse()
	if err := run(os.Stdout, *out); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, chart string) error {
	scs := scenarios()
	results := make([][]result, len(scs))
	for i, sc := range scs {
		for _, a := range algorithms {
			r, err := simulate(a.alg, sc)
			if err != nil {
				return fmt.Errorf("%s on %s: %w", a.name, sc.name, err)
			}
			results[i] = append(results[i], r)
		}
	}
	fmt.Fprintf(w, "Every algorithm enforces %v on one key.\n", rule)
	for i, sc := range scs {
		fmt.Fprintf(w, "\n%s: %s (%d requests)\n", sc.name, sc.about, len(sc.arrivals))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "algorithm\tadmitted\tdenied\tmost in 1s\tunevenness\tstate in memory\tstate in Redis\t")
		for j, a := range algorithms {
			r := results[i][j]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f\t%d B\t%d B\t\n",
				a.name, r.admitted, r.denied, r.maxInPeriod, r.smoothness, r.memoryBytes, r.redisBytes)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\nWhen to choose which:")
	for _, a := range algorithms {
		fmt.Fprintf(w, "  %-14s %s\n", a.name, a.choose)
	}
	if chart == "" {
		return nil
	}
	f, err := os.Create(chart)
	if err != nil {
		return err
	}
	if err := writeSVG(f, scs, results); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nChart: %s\n", chart)
	return nil
}
