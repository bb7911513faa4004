// Shedding drives one key at three times its limit, with 10% critical, 30% normal and
// 60% sheddable requests, through each of the five algorithms twice: without priorities,
// and with reserves of 0, 20 and 50 percent (ratelimit.WithReserves). It prints what each
// class got, and draws it:
//
//	go run ./examples/shedding                 # the chart in the temporary directory
//	go run ./examples/shedding -o shedding.svg # or where -o says
//
// Everything runs in memory on a fake clock, so every run prints and draws the same.
// Without priorities every class loses two thirds of its requests; with them, critical
// requests are all admitted, normal ones take most of what is left, and sheddable ones
// absorb the overload.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// The simulation: rule on one key, offered three times over for length, each request of
// a class drawn with these weights (critical, normal, sheddable).
var (
	rule     = ratelimit.Rule{Limit: 100, Period: time.Second}
	length   = 10 * time.Second
	offered  = 3 * rule.Limit // per Period
	weights  = [classes]int{10, 30, 60}
	reserves = []int64{0, 20, 50}
)

const classes = 3 // Critical, Normal, Sheddable

var algorithms = []struct {
	name string
	new  func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (ratelimit.Limiter, error)
}{
	{"tokenbucket", wrap(tokenbucket.New)},
	{"leakybucket", wrap(leakybucket.New)},
	{"fixedwindow", wrap(fixedwindow.New)},
	{"slidingwindow", wrap(slidingwindow.New)},
	{"slidinglog", wrap(slidinglog.New)},
}

func wrap[L ratelimit.Limiter](f func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (L, error)) func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (ratelimit.Limiter, error) {
	return func(s ratelimit.Store, r ratelimit.Rule, opts ...ratelimit.Option) (ratelimit.Limiter, error) {
		return f(s, r, opts...)
	}
}

// outcome is what each class was offered and admitted in one run.
type outcome struct {
	offered, admitted [classes]int
}

// share is the part of class c's requests admitted, in percent.
func (o outcome) share(c int) float64 {
	if o.offered[c] == 0 {
		return 0
	}
	return 100 * float64(o.admitted[c]) / float64(o.offered[c])
}

// arrivals are the requests' classes, evenly spaced over the run: the same every run.
func arrivals() []ratelimit.Priority {
	rng := rand.New(rand.NewPCG(1, 2))
	n := int(offered) * int(length/rule.Period)
	out := make([]ratelimit.Priority, n)
	total := weights[0] + weights[1] + weights[2]
	for i := range out {
		w := rng.IntN(total)
		switch {
		case w < weights[0]:
			out[i] = ratelimit.Critical
		case w < weights[0]+weights[1]:
			out[i] = ratelimit.Normal
		default:
			out[i] = ratelimit.Sheddable
		}
	}
	return out
}

// simulate runs the arrivals through a limiter made by newLimiter, with opts, on a fake
// clock.
func simulate(newLimiter func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (ratelimit.Limiter, error), opts ...ratelimit.Option) (outcome, error) {
	clk := clock.NewFake(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	l, err := newLimiter(localstore.New(localstore.WithClock(clk)), rule, append(opts, ratelimit.WithNamespace("shedding"))...)
	if err != nil {
		return outcome{}, err
	}
	reqs := arrivals()
	gap := length / time.Duration(len(reqs))
	var o outcome
	for _, p := range reqs {
		d, err := l.Allow(ratelimit.WithPriority(context.Background(), p), "tenant")
		if err != nil {
			return outcome{}, err
		}
		o.offered[p]++
		if d.Allowed {
			o.admitted[p]++
		}
		clk.Advance(gap)
	}
	return o, nil
}

func main() {
	out := flag.String("o", filepath.Join(os.TempDir(), "ratelimit-shedding.svg"), "where to write the chart (SVG); empty for none")
	flag.Parse()
	if err := run(os.Stdout, *out); err != nil {
		fmt.Fprintln(os.Stderr, "shedding:", err)
		os.Exit(1)
	}
}

// results are each algorithm's outcomes, without priorities and with them.
type results []struct {
	name          string
	plain, shaped outcome
}

func simulateAll() (results, error) {
	var rs results
	for _, a := range algorithms {
		plain, err := simulate(a.new)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a.name, err)
		}
		shaped, err := simulate(a.new, ratelimit.WithReserves(reserves...))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a.name, err)
		}
		rs = append(rs, struct {
			name          string
			plain, shaped outcome
		}{a.name, plain, shaped})
	}
	return rs, nil
}

func run(w io.Writer, chart string) error {
	rs, err := simulateAll()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "One key limited to %v, offered %d per %v for %v: %d%% critical, %d%% normal, %d%% sheddable.\n",
		rule, offered, rule.Period, length, weights[0], weights[1], weights[2])
	fmt.Fprintf(w, "Admitted, per class, without priorities and with reserves of %d%%, %d%% and %d%% (ratelimit.WithReserves):\n\n",
		reserves[0], reserves[1], reserves[2])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "algorithm\tcritical\tnormal\tsheddable\t\twith priorities: critical\tnormal\tsheddable\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%.0f%%\t%.0f%%\t%.0f%%\t\t%.0f%%\t%.0f%%\t%.0f%%\t\n", r.name,
			r.plain.share(0), r.plain.share(1), r.plain.share(2), r.shaped.share(0), r.shaped.share(1), r.shaped.share(2))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if chart == "" {
		return nil
	}
	f, err := os.Create(chart)
	if err != nil {
		return err
	}
	if err := writeSVG(f, rs); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nChart: %s\n", chart)
	return nil
}
