package main

import (
	"fmt"
	"io"
	"strings"
)

// Chart layout, in SVG user units: one group of bars per algorithm, in it a pair per
// class (without priorities, then with them), heights the share admitted.
const (
	chartWidth   = 960
	chartHeight  = 420
	marginLeft   = 50
	marginRight  = 20
	marginTop    = 70
	marginBottom = 60
)

var (
	classNames  = [classes]string{"critical", "normal", "sheddable"}
	classColors = [classes]string{"#c0392b", "#2e86c1", "#95a5a6"}
)

// writeSVG draws the share of each class admitted, by algorithm: a pale bar without
// priorities, a full one with them.
func writeSVG(w io.Writer, rs results) error {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, chartHeight, chartWidth, chartHeight)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="15" font-weight="bold">Shedding by priority: one key limited to %v, offered 3x (%d%% critical, %d%% normal, %d%% sheddable)</text>`+"\n",
		rule, weights[0], weights[1], weights[2])
	fmt.Fprintf(&b, `<text x="10" y="38" fill="#555">share of each class admitted; pale: without priorities, full: with reserves of %d%%, %d%% and %d%% (ratelimit.WithReserves)</text>`+"\n",
		reserves[0], reserves[1], reserves[2])
	for c := range classes { // legend
		x := marginLeft + c*120
		fmt.Fprintf(&b, `<rect x="%d" y="48" width="12" height="12" fill="%s"/><text x="%d" y="59">%s</text>`+"\n", x, classColors[c], x+16, classNames[c])
	}
	plotW := float64(chartWidth - marginLeft - marginRight)
	plotH := float64(chartHeight - marginTop - marginBottom)
	bottom := float64(chartHeight - marginBottom)
	for pct := 0; pct <= 100; pct += 25 { // gridlines
		y := bottom - plotH*float64(pct)/100
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end" fill="#555">%d%%</text>`+"\n",
			marginLeft, y, chartWidth-marginRight, y, marginLeft-6, y+4, pct)
	}
	group := plotW / float64(len(rs))
	bar := group / float64(2*classes+2)
	for i, r := range rs {
		x0 := marginLeft + group*float64(i) + bar
		for c := range classes {
			for k, o := range []outcome{r.plain, r.shaped} {
				h := plotH * o.share(c) / 100
				x := x0 + bar*float64(2*c+k)
				opacity := "0.35"
				if k == 1 {
					opacity = "1"
				}
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="%s"><title>%s, %s, %s: %.0f%% admitted</title></rect>`+"\n",
					x, bottom-h, bar-1, h, classColors[c], opacity, r.name, classNames[c], []string{"without priorities", "with priorities"}[k], o.share(c))
			}
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x0+bar*classes, bottom+18, r.name)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
