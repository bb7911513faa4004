package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestScenarios checks the numbers the chart shows against what each algorithm promises.
func TestScenarios(t *testing.T) {
	for _, sc := range scenarios() {
		for _, a := range algorithms {
			r, err := simulate(a.alg, sc)
			if err != nil {
				t.Fatal(err)
			}
			if r.admitted+r.denied != len(sc.arrivals) {
				t.Errorf("%s/%s: %d admitted + %d denied of %d", sc.name, a.name, r.admitted, r.denied, len(sc.arrivals))
			}
			limit := int(rule.Limit)
			switch a.name {
			case "slidinglog": // never more than the limit in any period
				if r.maxInPeriod > limit {
					t.Errorf("%s: the sliding log admitted %d in one period", sc.name, r.maxInPeriod)
				}
			case "leakybucket": // admitted requests leave at most one per interval
				interval := rule.Period / time.Duration(rule.Limit)
				for i := 1; i < len(r.leave); i++ {
					if gap := r.leave[i] - r.leave[i-1]; gap < interval {
						t.Errorf("%s: the leaky bucket let two leave %v apart", sc.name, gap)
						break
					}
				}
			case "tokenbucket": // at most the capacity plus what refills
				if most := limit + int(sc.length/rule.Period)*limit; r.admitted > most {
					t.Errorf("%s: the token bucket admitted %d, more than %d", sc.name, r.admitted, most)
				}
			}
			if sc.name == "steady" && r.denied != 0 {
				t.Errorf("steady traffic under the limit: %s denied %d", a.name, r.denied)
			}
		}
	}
	// the boundary burst: 2x in one period for the fixed window, the limit for the others
	var boundary scenario
	for _, sc := range scenarios() {
		if sc.name == "boundary" {
			boundary = sc
		}
	}
	for _, a := range algorithms {
		r, _ := simulate(a.alg, boundary)
		want := int(rule.Limit)
		switch a.name {
		case "fixedwindow":
			want = 2 * want
		case "tokenbucket":
			want++ // 10 from the full bucket, and the one token refilled in the 100ms between
		}
		if r.maxInPeriod != want {
			t.Errorf("boundary: %s admitted %d in one period; want %d", a.name, r.maxInPeriod, want)
		}
	}
}

// TestDeterministic: two runs print the same and write the same chart, valid SVG with a
// panel per scenario.
func TestDeterministic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "compare.svg")
	var out [2]bytes.Buffer
	var charts [2][]byte
	for i := range 2 {
		if err := run(&out[i], path); err != nil {
			t.Fatal(err)
		}
		charts[i], _ = os.ReadFile(path)
	}
	if !bytes.Equal(charts[0], charts[1]) || out[0].String() != out[1].String() {
		t.Fatal("two runs differ")
	}
	dec := xml.NewDecoder(bytes.NewReader(charts[0]))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the chart is not valid XML: %v", err)
		}
	}
	for _, sc := range scenarios() {
		if !strings.Contains(string(charts[0]), ">"+sc.name+"<") {
			t.Errorf("no panel for %s", sc.name)
		}
	}
}

// TestCommittedChart: the chart in the README is what the program draws now.
func TestCommittedChart(t *testing.T) {
	committed, err := os.ReadFile("compare.svg")
	if err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(t.TempDir(), "compare.svg")
	if err := run(io.Discard, fresh); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.ReadFile(fresh); !bytes.Equal(committed, now) {
		t.Error("examples/compare/compare.svg is stale: go run ./examples/compare -o examples/compare/compare.svg")
	}
}
