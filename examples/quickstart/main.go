// Quickstart runs the same small burst through the five algorithms, in memory on a fake
// clock, and prints what each one admits:
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
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

type algorithm struct {
	name string
	new  func(ratelimit.Store, ratelimit.Rule) (ratelimit.Limiter, error)
}

func adapt[L ratelimit.Limiter](f func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (L, error)) func(ratelimit.Store, ratelimit.Rule) (ratelimit.Limiter, error) {
	return func(s ratelimit.Store, r ratelimit.Rule) (ratelimit.Limiter, error) { return f(s, r) }
}

var algorithms = []algorithm{
	{"tokenbucket", adapt(tokenbucket.New)},
	{"leakybucket", adapt(leakybucket.New)},
	{"fixedwindow", adapt(fixedwindow.New)},
	{"slidingwindow", adapt(slidingwindow.New)},
	{"slidinglog", adapt(slidinglog.New)},
}

// The traffic: a burst at 0.8 s (just before a window boundary), then one request every
// 200 ms until 2.6 s.
const (
	burstAt   = 800 * time.Millisecond
	burstSize = 6
	every     = 200 * time.Millisecond
	until     = 2600 * time.Millisecond
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	rule := ratelimit.PerSecond(4)
	fmt.Printf("Rule: %v. Traffic: %d requests at once at %v, then one every %v until %v.\n",
		rule, burstSize, burstAt, every, until)
	fmt.Println("+ allowed   . denied   (the leaky bucket admits with a delay, to pace what it admits)")
	fmt.Println()

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "algorithm\tburst at %v\tthen every %v\tallowed\tdenied\tlongest delay\n", burstAt, every)
	for _, alg := range algorithms {
		r, err := simulate(alg, rule)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%v\n", alg.name, r.burst, r.steady, r.allowed, r.denied, r.longestDelay)
	}
	return w.Flush()
}

type result struct {
	burst, steady   string // one mark per request
	allowed, denied int
	longestDelay    time.Duration
}

// simulate runs the traffic through one algorithm on a fresh store and fake clock.
func simulate(alg algorithm, rule ratelimit.Rule) (result, error) {
	var r result
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start.Add(burstAt))
	limiter, err := alg.new(localstore.New(localstore.WithClock(clk)), rule)
	if err != nil {
		return r, err
	}
	ask := func(marks *strings.Builder) error {
		d, err := limiter.Allow(context.Background(), "client")
		if err != nil {
			return err
		}
		if d.Allowed {
			r.allowed++
			r.longestDelay = max(r.longestDelay, d.Delay)
			marks.WriteByte('+')
		} else {
			r.denied++
			marks.WriteByte('.')
		}
		return nil
	}
	var burst, steady strings.Builder
	for range burstSize {
		if err := ask(&burst); err != nil {
			return r, err
		}
	}
	for at := burstAt + every; at <= until; at += every {
		clk.Set(start.Add(at))
		if err := ask(&steady); err != nil {
			return r, err
		}
	}
	r.burst, r.steady = burst.String(), steady.String()
	return r, nil
}
