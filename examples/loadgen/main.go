// Loadgen drives one server or several instances of one (a list of targets) with N
// tenants, at a set rate or as fast as a set number of workers can, for a set time; it
// shows a live progress line and ends with a table per tenant and one per instance:
// requests sent, answered 200 and 429, and latency at p50 and p99. With -llm it sends a
// language model's chat completions (a share of them streamed) and counts the tokens each
// answer was charged, as examples/llmproxy reports them with -report-usage.
//
//	go run ./examples/loadgen -tenants 10 -rate 2000 -duration 10s
//	go run ./examples/loadgen -llm -url http://127.0.0.1:8081,http://127.0.0.1:8082 -split 50,50 -stream 0.5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

type config struct {
	urls        []string // the targets: instances of one service
	split       []int    // each target's share of the requests, in the targets' order
	method      string
	tenants     int
	rate        int // requests per second in all; 0: as fast as the workers go
	concurrency int
	duration    time.Duration

	llm       bool    // send chat completions, and count their tokens
	model     string  // the model they name
	prompt    int     // their prompt's words
	maxTokens int     // their max_tokens
	stream    float64 // the share of them streamed
}

// usageHeader is where examples/llmproxy reports the tokens an answer was charged, with
// -report-usage: a header of a JSON answer, a trailer of a stream.
const usageHeader = "X-Usage-Total-Tokens"

func main() {
	var c config
	var urls, split string
	flag.StringVar(&urls, "url", "http://localhost:8080/orders", "URL to send requests to; several, comma-separated, for several instances")
	flag.StringVar(&split, "split", "", "each URL's share of the requests, comma-separated (50,25,15,10); even when empty")
	flag.StringVar(&c.method, "method", "GET", "HTTP method (POST with -llm)")
	flag.IntVar(&c.tenants, "tenants", 10, "tenants (X-Api-Key: tenant-1 ... tenant-N), taken in turn")
	flag.IntVar(&c.rate, "rate", 0, "requests per second in all (0: as fast as -concurrency workers go)")
	flag.IntVar(&c.concurrency, "concurrency", 32, "workers sending requests")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "how long to send")
	flag.BoolVar(&c.llm, "llm", false, "send chat completions (to each URL, or its /v1/chat/completions when it has no path) and count their tokens")
	flag.StringVar(&c.model, "model", "gpt-4o", "with -llm, the model the requests name")
	flag.IntVar(&c.prompt, "prompt-words", 20, "with -llm, the words of each prompt")
	flag.IntVar(&c.maxTokens, "max-tokens", 200, "with -llm, each request's max_tokens")
	flag.Float64Var(&c.stream, "stream", 0, "with -llm, the share of the requests streamed (0 to 1)")
	flag.Parse()
	if err := c.parse(urls, split); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.duration)
	defer cancel()
	stats := run(ctx, c, os.Stderr)
	report(os.Stdout, c, stats)
}

// parse completes c from the -url and -split flags, and checks it.
func (c *config) parse(urls, split string) error {
	for _, u := range strings.Split(urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			if c.llm && !strings.Contains(strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://"), "/") {
				u += "/v1/chat/completions"
			}
			c.urls = append(c.urls, u)
		}
	}
	if len(c.urls) == 0 {
		return errors.New("-url: no URL")
	}
	if split == "" {
		c.split = slices.Repeat([]int{1}, len(c.urls))
	} else {
		for _, s := range strings.Split(split, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 0 {
				return fmt.Errorf("-split %q: shares are whole numbers, not below 0", split)
			}
			c.split = append(c.split, n)
		}
		total := 0
		for _, n := range c.split {
			total += n
		}
		if len(c.split) != len(c.urls) || total == 0 {
			return fmt.Errorf("-split %q: a share for each of the %d URLs, not all 0", split, len(c.urls))
		}
	}
	if c.llm && c.method == "GET" {
		c.method = "POST"
	}
	switch {
	case c.tenants < 1 || c.concurrency < 1 || c.duration <= 0:
		return errors.New("-tenants, -concurrency and -duration must be positive")
	case c.rate < 0:
		return errors.New("-rate must not be negative")
	case c.stream < 0 || c.stream > 1:
		return errors.New("-stream is a share, from 0 to 1")
	case c.prompt < 0 || c.maxTokens < 0:
		return errors.New("-prompt-words and -max-tokens must not be negative")
	}
	return nil
}

// target is the index of the URL request i goes to: the URLs in turn by their shares.
func (c config) target(i int) int {
	total := 0
	for _, n := range c.split {
		total += n
	}
	at := i % total
	for t, n := range c.split {
		if at < n {
			return t
		}
		at -= n
	}
	return 0
}

// stats are one tenant's or one instance's results.
type stats struct {
	mu                     sync.Mutex
	sent, ok, limited, bad int
	tokens                 int64 // charged, with -llm
	latencies              []time.Duration
}

func (s *stats) add(status int, tokens int64, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent++
	switch status {
	case http.StatusOK:
		s.ok++
		s.tokens += tokens
	case http.StatusTooManyRequests:
		s.limited++
	default:
		s.bad++
	}
	s.latencies = append(s.latencies, took)
}

// results are a run's: per tenant, and per instance (target).
type results struct {
	tenants, instances []*stats
}

// run sends requests until ctx ends, printing progress to progress twice a second.
func run(ctx context.Context, c config, progress io.Writer) results {
	res := results{tenants: make([]*stats, c.tenants), instances: make([]*stats, len(c.urls))}
	for i := range res.tenants {
		res.tenants[i] = &stats{}
	}
	for i := range res.instances {
		res.instances[i] = &stats{}
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
				n := int(next.Add(1) - 1)
				tenant, target := n%c.tenants, c.target(n)
				streamed := c.llm && c.stream > 0 && float64(n%100) < c.stream*100
				status, tokens, took := send(ctx, client, c, c.urls[target], fmt.Sprint("tenant-", tenant+1), streamed)
				if ctx.Err() != nil && status == 0 {
					return // cut off at the end: not a failure
				}
				res.tenants[tenant].add(status, tokens, took)
				res.instances[target].add(status, tokens, took)
				switch status {
				case http.StatusOK:
				case http.StatusTooManyRequests:
					limited.Add(1)
				default:
					failed.Add(1)
				}
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
			return res
		case <-t.C:
			elapsed := time.Since(start).Seconds()
			fmt.Fprintf(progress, "\r%5.1fs  sent %d (%.0f/s)  429 %d  failed %d ", elapsed, sent.Load(), float64(sent.Load())/elapsed, limited.Load(), failed.Load())
		}
	}
}

// send sends one request to url as tenant (a chat completion with -llm, streamed or
// not), and returns its status, the tokens it was charged, and how long it took, its
// answer read whole.
func send(ctx context.Context, client *http.Client, c config, url, tenant string, streamed bool) (status int, tokens int64, took time.Duration) {
	var body io.Reader
	if c.llm {
		body = strings.NewReader(fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":%q}]}`,
			c.model, c.maxTokens, streamed, strings.TrimSpace(strings.Repeat("word ", c.prompt))))
	}
	req, err := http.NewRequestWithContext(ctx, c.method, url, body)
	if err != nil {
		return 0, 0, 0
	}
	req.Header.Set("X-Api-Key", tenant)
	if c.llm {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	res, err := client.Do(req)
	if err != nil {
		return 0, 0, time.Since(start)
	}
	io.Copy(io.Discard, res.Body) // a stream to its end: its trailer follows
	res.Body.Close()
	used := res.Header.Get(usageHeader)
	if used == "" {
		used = res.Trailer.Get(usageHeader)
	}
	tokens, _ = strconv.ParseInt(used, 10, 64)
	return res.StatusCode, tokens, time.Since(start)
}

// report prints a row per tenant and one for all, then a row per instance.
func report(w io.Writer, c config, res results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "\tsent\t200\t429\tother\tp50\tp99\t"
	if c.llm {
		head += "tokens\t"
	}
	row := func(name string, s *stats) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%v\t%v\t", name, s.sent, s.ok, s.limited, s.bad,
			quantile(s.latencies, 0.50), quantile(s.latencies, 0.99))
		if c.llm {
			fmt.Fprintf(tw, "%d\t", s.tokens)
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintln(tw, "tenant"+head)
	var all stats
	for i, s := range res.tenants {
		row(fmt.Sprint("tenant-", i+1), s)
		all.sent, all.ok, all.limited, all.bad, all.tokens = all.sent+s.sent, all.ok+s.ok, all.limited+s.limited, all.bad+s.bad, all.tokens+s.tokens
		all.latencies = append(all.latencies, s.latencies...)
	}
	row("all", &all)
	fmt.Fprintln(tw, "\t\t\t\t\t\t\t")
	fmt.Fprintln(tw, "instance"+head)
	for i, s := range res.instances {
		row(c.urls[i], s)
	}
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
