package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
	"github.com/ratelimit-go/ratelimit/examples/llmlimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// The fleet's limits, per API key, one family of models each so that each is measured
// alone: "t" is bound by its tokens a minute, "r" by its requests a minute, "d" by its
// tokens a day.
func fleetConfig(tpm, rpm, tpd int64) config {
	return config{Models: llmlimit.Table{
		"t": {TokensPerMinute: tpm},
		"r": {RequestsPerMinute: rpm},
		"d": {TokensPerDay: tpd},
	}}
}

// fleetRequest is the fleet's request: a prompt of 20 words and max_tokens 280, which the
// fake model answers with 80 words: 100 tokens used of an estimate of 300.
const (
	fleetPrompt   = 20
	fleetMax      = 280
	fleetUsed     = 100
	fleetEstimate = fleetPrompt + fleetMax
)

// fleet is four instances of the proxy, as its README's recipe runs them (-redis,
// -instances 4, -leases, or without -leases): each with its own client and stack, on one Redis, before one
// fake model; the policies of its config, on instance 0's store, for the test to reach
// the keys.
type fleet struct {
	urls     []string
	policies []ratelimit.Policy
	stores   []ratelimit.Store
}

func startFleet(tb testing.TB, redisAddr string, c config, leases bool) *fleet {
	tb.Helper()
	model := httptest.NewServer(llmlimit.FakeModel())
	tb.Cleanup(model.Close)
	u, _ := url.Parse(model.URL)
	f := &fleet{}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range 4 {
		store, closeStore, err := backend.Open(context.Background(), backend.Config{RedisURL: "redis://" + redisAddr, Instances: 4, Leases: leases,
			Members: "llmproxy", Algorithms: []*ratelimit.Algorithm{tokenbucket.Algorithm(), fixedwindow.Algorithm(), ratelimit.InFlightAlgorithm()}},
			backend.NewMetrics(prometheus.NewRegistry()), logger)
		if err != nil {
			tb.Fatal(err)
		}
		h, err := newProxy(store, u, c, options{headers: "openai", words: true, report: true})
		if err != nil {
			tb.Fatal(err)
		}
		srv := httptest.NewServer(h)
		tb.Cleanup(func() { srv.Close(); closeStore() }) // the answers in progress end before the leases go back
		f.urls = append(f.urls, srv.URL)
		f.stores = append(f.stores, store)
	}
	ps, err := c.Models.Policies(f.stores[0], llmlimit.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	f.policies = ps
	return f
}

// spend spends what key has of the policy named name for model's family, so that the
// run starts on a key that used its burst: a debit of n.
func (f *fleet) spend(tb testing.TB, name, family, key string, n int64) {
	tb.Helper()
	for _, p := range f.policies {
		if p.Name == name {
			if _, err := p.Limiter.(*ratelimit.AlgorithmLimiter).Debit(context.Background(), llmlimit.LimitKey(key, family), n); err != nil {
				tb.Fatal(err)
			}
			return
		}
	}
	tb.Fatalf("no policy %q", name)
}

// sent is one request of a run: its model, when it was due since the run's start, its
// status, and the tokens it was charged (its answer's header or trailer).
type sent struct {
	model  string
	at     time.Duration
	status int
	tokens int64
}

// drive sends each model's requests at its rate per second for d, open loop (each at its
// due time, whoever answered before), as key, to the instances in turn by their shares of
// the traffic (50/25/15/10%), half of them streamed; it returns every request sent, and
// how late the sends ran at the 99th percentile.
func (f *fleet) drive(tb testing.TB, key string, rates map[string]int, d time.Duration) ([]sent, time.Duration) {
	tb.Helper()
	split := []int{0, 0, 0, 0, 0, 1, 1, 1, 2, 3, 0, 0, 0, 0, 0, 1, 1, 2, 2, 3} // 50/25/15/10 of 20
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var out []sent
	var late []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for model, rate := range rates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			every := time.Second / time.Duration(rate)
			for i := 0; ; i++ {
				due := time.Duration(i) * every
				if due >= d {
					return
				}
				if wait := time.Until(start.Add(due)); wait > 0 {
					time.Sleep(wait) // the generator's pace: requests at scheduled times
				}
				mu.Lock()
				late = append(late, time.Since(start)-due)
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := f.send(client, f.urls[split[i%len(split)]], key, model, i%2 == 1)
					s.at = due
					mu.Lock()
					out = append(out, s)
					mu.Unlock()
				}()
			}
		}()
	}
	wg.Wait()
	return out, percentile(late, 0.99)
}

// sendHeaders sends one completion, not streamed, and returns its status and headers
// once its answer has been read (and charged).
func (f *fleet) sendHeaders(tb testing.TB, base, key, model string) (int, http.Header) {
	tb.Helper()
	resp, err := http.DefaultClient.Do(f.request(base, key, model, false))
	if err != nil {
		tb.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// request is one completion of the fleet's to base, as key, for model.
func (f *fleet) request(base, key, model string, stream bool) *http.Request {
	body := `{"model":"` + model + `","stream":` + strconv.FormatBool(stream) + `,"max_tokens":` + strconv.Itoa(fleetMax) +
		`,"messages":[{"role":"user","content":"` + strings.TrimSpace(strings.Repeat("word ", fleetPrompt)) + `"}]}`
	r, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+key)
	return r
}

// send sends one completion and reads its answer whole.
func (f *fleet) send(client *http.Client, base, key, model string, stream bool) sent {
	resp, err := client.Do(f.request(base, key, model, stream))
	if err != nil {
		return sent{model: model}
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	s := sent{model: model, status: resp.StatusCode}
	used := resp.Header.Get(llmlimit.UsageHeader)
	if used == "" {
		used = resp.Trailer.Get(llmlimit.UsageHeader)
	}
	s.tokens, _ = strconv.ParseInt(used, 10, 64)
	return s
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// fleetFigures are a run's figures for one model: requests admitted and tokens charged
// in [from, to) of the run, and the requests that failed otherwise (neither 200 nor 429).
type fleetFigures struct {
	admitted, tokens, failed int64
}

func figures(runs []sent, model string, from, to time.Duration) fleetFigures {
	var f fleetFigures
	for _, s := range runs {
		if s.model != model || s.at < from || s.at >= to {
			continue
		}
		switch s.status {
		case http.StatusOK:
			f.admitted++
			f.tokens += s.tokens
		case http.StatusTooManyRequests:
		default:
			f.failed++
		}
	}
	return f
}

func (f fleetFigures) String() string {
	return fmt.Sprintf("%d admitted, %d tokens, %d failed", f.admitted, f.tokens, f.failed)
}
