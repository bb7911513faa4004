package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestShares: without priorities every class gets about a third of its requests; with
// them, critical requests are (nearly) all admitted and sheddable ones lose the most,
// in every algorithm. The token bucket's numbers are pinned: the run is deterministic.
func TestShares(t *testing.T) {
	rs, err := simulateAll()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		for c := range classes {
			if s := r.plain.share(c); s < 25 || s > 40 {
				t.Errorf("%s without priorities: %s got %.0f%%; want about a third", r.name, classNames[c], s)
			}
		}
		crit, norm, shed := r.shaped.share(0), r.shaped.share(1), r.shaped.share(2)
		if crit < 95 || !(crit > norm && norm > shed) || shed > r.plain.share(2)/2 {
			t.Errorf("%s with priorities: %.0f%% / %.0f%% / %.0f%%; want critical kept, then normal, sheddable shed", r.name, crit, norm, shed)
		}
		if total := r.shaped.admitted[0] + r.shaped.admitted[1] + r.shaped.admitted[2]; total > int(rule.Limit)*11 {
			t.Errorf("%s with priorities admitted %d in 10s; the rule allows about 1000", r.name, total)
		}
	}
	tb := rs[0]
	if tb.name != "tokenbucket" || tb.shaped.admitted != [classes]int{295, 730, 52} || tb.shaped.offered != [classes]int{295, 892, 1813} {
		t.Errorf("the token bucket with priorities: %+v", tb.shaped)
	}
}

// TestSameEveryRun: the text and the chart are the same on every run, and the chart is
// well-formed XML.
func TestSameEveryRun(t *testing.T) {
	dir := t.TempDir()
	var outs [2][]byte
	var charts [2][]byte
	for i := range 2 {
		var b bytes.Buffer
		chart := filepath.Join(dir, "chart.svg")
		if err := run(&b, chart); err != nil {
			t.Fatal(err)
		}
		outs[i] = bytes.ReplaceAll(b.Bytes(), []byte(chart), nil)
		var err error
		if charts[i], err = os.ReadFile(chart); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(outs[0], outs[1]) || !bytes.Equal(charts[0], charts[1]) {
		t.Error("two runs differ")
	}
	dec := xml.NewDecoder(bytes.NewReader(charts[0]))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the chart is not well-formed: %v", err)
		}
	}
}
