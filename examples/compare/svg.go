package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Chart layout, in SVG user units: one panel per scenario; in it, one strip for the
// offered load and one per algorithm, on a shared time axis.
const (
	chartWidth  = 960
	marginLeft  = 110 // the strips' labels
	marginRight = 20
	headerSpace = 40
	titleSpace  = 26
	stripHeight = 26
	axisSpace   = 22
	bucket      = 100 * time.Millisecond // requests are counted per bucket
)

var panelHeight = titleSpace + stripHeight*(1+len(algorithms)) + axisSpace

// writeSVG draws the chart: per scenario, the requests offered (grey) and the requests
// each algorithm admits (its colour), per 100ms, bar heights on one scale per scenario.
func writeSVG(w io.Writer, scs []scenario, results [][]result) error {
	var b strings.Builder
	height := headerSpace + panelHeight*len(scs)
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="10" y="18" font-size="15" font-weight="bold">Five rate-limiting algorithms under %v: requests per 100 ms</text>`+"\n", rule)
	fmt.Fprintf(&b, `<text x="10" y="34" fill="#555">grey: offered; colour: admitted (the leaky bucket's when they leave its queue). Bars share one scale per scenario.</text>`+"\n")
	for i, sc := range scs {
		panel(&b, headerSpace+i*panelHeight, sc, results[i])
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func panel(b *strings.Builder, top int, sc scenario, rs []result) {
	buckets := int(sc.length / bucket)
	offered := perBucket(sc.arrivals, buckets)
	peak := 1
	for _, n := range offered {
		peak = max(peak, n)
	}
	plotWidth := float64(chartWidth - marginLeft - marginRight)
	bx := func(i int) float64 { return marginLeft + plotWidth*float64(i)/float64(buckets) }

	fmt.Fprintf(b, `<text x="10" y="%d" font-weight="bold">%s</text><text x="%d" y="%d" fill="#555">%s (bars up to %d per 100 ms)</text>`+"\n",
		top+18, sc.name, marginLeft, top+18, sc.about, peak)
	stripsTop := top + titleSpace
	stripsBottom := stripsTop + stripHeight*(1+len(algorithms))
	for s := 0; s <= int(sc.length/time.Second); s++ { // a gridline and label per second
		x := bx(s * int(time.Second/bucket))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle" fill="#555">%ds</text>`+"\n",
			x, stripsTop, x, stripsBottom, x, stripsBottom+14, s)
	}
	strip(b, stripsTop, "offered", "#9a9a9a", offered, peak, bx)
	for j, a := range algorithms {
		strip(b, stripsTop+stripHeight*(j+1), a.name, a.color, perBucket(rs[j].leave, buckets), peak, bx)
	}
}

// strip draws one row of bars, counts scaled to peak, with its label on the left.
func strip(b *strings.Builder, top int, label, color string, counts []int, peak int, bx func(int) float64) {
	base := float64(top + stripHeight - 3)
	fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end" fill="%s">%s</text>`+"\n", marginLeft-8, base-4, color, label)
	fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", marginLeft, base, chartWidth-marginRight, base)
	for i, n := range counts {
		if n == 0 {
			continue
		}
		h := float64(stripHeight-6) * float64(n) / float64(peak)
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", bx(i)+0.5, base-h, bx(i+1)-bx(i)-1, h, color)
	}
}

// perBucket counts instants per bucket, up to n buckets.
func perBucket(at []time.Duration, n int) []int {
	counts := make([]int, n)
	for _, t := range at {
		if i := int(t / bucket); i < n {
			counts[i]++
		}
	}
	return counts
}
