// Loadgen drives the gateway with N tenants, at a set rate or as fast as a set number of
// workers can, for a set time; it shows a live progress line and ends with a table per
// tenant: requests sent, answered 200 and 429, and latency at p50 and p99.
//
//	go run ./examples/loadgen -tenants 10 -rate 2000 -duration 10s
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

type config struct {
	url         string
	method      string
	tenants     int
	rate        int // requests per second in all; 0: as fast as the workers go
	concurrency int
	duration    time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.url, "url", "http://localhost:8080/orders", "URL to send requests to")
	flag.StringVar(&c.method, "method", "GET", "HTTP method")
	flag.IntVar(&c.tenants, "tenants", 10, "tenants (X-Api-Key: tenant-1 ... tenant-N), taken in turn")
	flag.IntVar(&c.rate, "rate", 0, "requests per second in all (0: as fast as -concurrency workers go)")
	flag.IntVar(&c.concurrency, "concurrency", 32, "workers sending requests")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "how long to send")
	flag.Parse()
	if c.tenants < 1 || c.concurrency < 1 || c.rate < 0 || c.duration <= 0 {
		fmt.Fprintln(os.Stderr, "loadgen: -tenants, -concurrency and -duration must be positive, -rate not negative")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.duration)
	defer cancel()
	stats := run(ctx, c, os.Stderr)
	report(os.Stdout, stats)
}

// tenantStats are one tenant's results.
type tenantStats struct {
	mu                     sync.Mutex
	sent, ok, limited, bad int
	latencies              []time.Duration
}

// run sends requests until ctx ends, printing progress to progress twice a second.
func run(ctx context.Context, c config, progress io.Writer) []*tenantStats {
	stats := make([]*tenantStats, c.tenants)
	for i := range stats {
		stats[i] = &tenantStats{}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.concurrency}, Timeout: 10 * time.Second}
	var next, sent, limited, failed atomic.Int64
	tickets := make(chan struct{})
	go func() { // hand out one ticket per request: paced at -rate, or as fast as taken
		defer close(tickets)
		var pace <-chan time.Time
		if c.rate > 0 { // every millisecond, the tickets due by then: a ticker alone drops ticks
			t := time.NewTicker(time.Millisecond)
			defer t.Stop()
			pace = t.C
		}
		start, issued := time.Now(), 0
		for {
			due := issued + 1
			if pace != nil {
				select {
				case <-pace:
				case <-ctx.Done():
					return
				}
				due = int(time.Since(start).Seconds() * float64(c.rate))
			}
			for ; issued < due; issued++ {
				select {
				case tickets <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for range c.concurrency {
		wg.Go(func() {
			for range tickets {
				i := int(next.Add(1)-1) % c.tenants
				status, took := send(ctx, client, c, fmt.Sprint("tenant-", i+1))
				if ctx.Err() != nil && status == 0 {
					return // cut off at the end: not a failure
				}
				s := stats[i]
				s.mu.Lock()
				s.sent++
				switch status {
				case http.StatusOK:
					s.ok++
				case http.StatusTooManyRequests:
					s.limited++
					limited.Add(1)
				default:
					s.bad++
					failed.Add(1)
				}
				s.latencies = append(s.latencies, took)
				s.mu.Unlock()
				sent.Add(1)
			}
		})
	}
	start := time.Now()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			fmt.Fprintf(progress, "\r%5.1fs  sent %d  429 %d  failed %d  done\n", time.Since(start).Seconds(), sent.Load(), limited.Load(), failed.Load())
			return stats
		case <-t.C:
			elapsed := time.Since(start).Seconds()
			fmt.Fprintf(progress, "\r%5.1fs  sent %d (%.0f/s)  429 %d  failed %d ", elapsed, sent.Load(), float64(sent.Load())/elapsed, limited.Load(), failed.Load())
		}
	}
}

func send(ctx context.Context, client *http.Client, c config, tenant string) (status int, took time.Duration) {
	req, err := http.NewRequestWithContext(ctx, c.method, c.url, nil)
	if err != nil {
		return 0, 0
	}
	req.Header.Set("X-Api-Key", tenant)
	start := time.Now()
	res, err := client.Do(req)
	if err != nil {
		return 0, time.Since(start)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, time.Since(start)
}

// report prints a row per tenant and one for all.
func report(w io.Writer, stats []*tenantStats) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tenant\tsent\t200\t429\tother\tp50\tp99\t")
	var all tenantStats
	for i, s := range stats {
		fmt.Fprintf(tw, "tenant-%d\t%d\t%d\t%d\t%d\t%v\t%v\t\n", i+1, s.sent, s.ok, s.limited, s.bad,
			quantile(s.latencies, 0.50), quantile(s.latencies, 0.99))
		all.sent, all.ok, all.limited, all.bad = all.sent+s.sent, all.ok+s.ok, all.limited+s.limited, all.bad+s.bad
		all.latencies = append(all.latencies, s.latencies...)
	}
	fmt.Fprintf(tw, "all\t%d\t%d\t%d\t%d\t%v\t%v\t\n", all.sent, all.ok, all.limited, all.bad,
		quantile(all.latencies, 0.50), quantile(all.latencies, 0.99))
	tw.Flush()
}

// quantile is the q-quantile of ds (nearest rank), rounded to the microsecond.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))].Round(time.Microsecond)
}
