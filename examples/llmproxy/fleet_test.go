package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
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
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// The fleet's limits, per API key, one family of models each so that each is measured
// alone: "t" is bound by its tokens a minute, "r" by its requests a minute, "d" by its
// tokens a day.
func fleetConfig(tpm, rpm, tpd int64) config {
	return config{Models: llmlimit.Table{
		"t": {TokensPerMinute: tpm},
		"r": {RequestsPerMinute: rpm},
		"d": {TokensPerDay: tpd},
		"b": {TokensPerDay: 1_000_000_000},
	}}
}

// billed is what Redis counted of key "key"'s day budget of "b", which it never reaches,
// read beside the instances once they closed, and what the model reported of "b".
func (f *fleet) billed(tb testing.TB, srv *redistest.Server, c config) (counted, reported int64) {
	tb.Helper()
	ps, err := c.Models.Policies(redisstore.New(srv.Client()), llmlimit.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	for _, p := range ps {
		if p.Name != llmlimit.TokensPerDay {
			continue
		}
		d, err := p.Limiter.(*ratelimit.AlgorithmLimiter).PeekN(context.Background(), llmlimit.LimitKey("key", "b"), 1)
		if err != nil || !d.Allowed || d.Limit != 1_000_000_000 {
			tb.Fatalf("the budget of b: %+v, %v", d, err)
		}
		return d.Limit - d.Remaining - 1, f.model.tokens("b")
	}
	tb.Fatal("no day budget")
	return 0, 0
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
	closers  []func()
	model    *upstream
	metrics  []*prometheus.Registry
}

func startFleet(tb testing.TB, redisAddr string, c config, leases bool) *fleet {
	tb.Helper()
	f := &fleet{model: &upstream{model: llmlimit.FakeModel(), reported: map[string]int64{}}}
	model := httptest.NewServer(f.model)
	tb.Cleanup(model.Close)
	u, _ := url.Parse(model.URL)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range 4 {
		reg := prometheus.NewRegistry()
		f.metrics = append(f.metrics, reg)
		store, closeStore, err := backend.Open(context.Background(), backend.Config{RedisURL: "redis://" + redisAddr, Instances: 4, Leases: leases,
			Members: "llmproxy"},
			backend.NewMetrics(reg), logger)
		if err != nil {
			tb.Fatal(err)
		}
		h, err := newProxy(store, u, c, options{headers: "openai", words: true, report: true})
		if err != nil {
			tb.Fatal(err)
		}
		srv := httptest.NewServer(h)
		closeOnce := sync.OnceFunc(func() { srv.Close(); closeStore() }) // the answers in progress end before the leases go back
		tb.Cleanup(closeOnce)
		f.closers = append(f.closers, closeOnce)
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

// close closes the instances: their answers end, what their leases hold goes back, what
// they admitted on trust is charged.
func (f *fleet) close() {
	for _, c := range f.closers {
		c()
	}
}

// shares is how many decisions the instances' fallback shares made: Redis answered late.
func (f *fleet) shares(tb testing.TB) (n int64) {
	tb.Helper()
	for _, reg := range f.metrics {
		mfs, err := reg.Gather()
		if err != nil {
			tb.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "ratelimit_store_decisions_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "source" && l.GetValue() != "redis" {
						n += int64(m.GetCounter().GetValue())
					}
				}
			}
		}
	}
	return n
}

// upstream is the fleet's model: FakeModel, which compresses its answers with gzip for a
// client that accepts it, as the APIs do, and counts the tokens it reports, per model.
type upstream struct {
	model    http.Handler
	mu       sync.Mutex
	reported map[string]int64
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		Model    string `json:"model"`
		Input    string `json:"input"`
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
		MaxTokens       int64 `json:"max_tokens"`
		MaxOutputTokens int64 `json:"max_output_tokens"`
	}
	if err := json.Unmarshal(body, &req); err == nil { // the fake's usage: the prompt's words, and 4 per word up to the most asked
		in := llmlimit.Words(req.Input)
		for _, m := range req.Messages {
			in += llmlimit.Words(m.Content)
		}
		u.mu.Lock()
		u.reported[req.Model] += in + min(4*in, max(req.MaxTokens, req.MaxOutputTokens))
		u.mu.Unlock()
	}
	if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		u.model.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Encoding", "gzip")
	gz := &gzipWriter{ResponseWriter: w, z: gzip.NewWriter(w)}
	u.model.ServeHTTP(gz, r)
	gz.z.Close()
}

// tokens is what the model reported of model's answers.
func (u *upstream) tokens(model string) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.reported[model]
}

// gzipWriter compresses an answer, a stream's events as they are flushed.
type gzipWriter struct {
	http.ResponseWriter
	z *gzip.Writer
}

func (g *gzipWriter) WriteHeader(code int) {
	g.Header().Del("Content-Length")
	g.ResponseWriter.WriteHeader(code)
}

func (g *gzipWriter) Write(b []byte) (int, error) { return g.z.Write(b) }

func (g *gzipWriter) Flush() {
	g.z.Flush()
	if f, ok := g.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
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
// the traffic (50/25/15/10%): of every four, a chat completion, one streamed, another,
// and a Responses API stream; the client asks for gzip. It returns every request sent,
// and how late the sends ran at the 99th percentile.
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
					s := f.send(client, f.urls[split[i%len(split)]], key, model, i%2 == 1, i%4 == 3)
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
	resp, err := http.DefaultClient.Do(f.request(base, key, model, false, false))
	if err != nil {
		tb.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// request is one completion of the fleet's to base, as key, for model: a chat
// completion, or a Responses API request (responses).
func (f *fleet) request(base, key, model string, stream, responses bool) *http.Request {
	prompt := strings.TrimSpace(strings.Repeat("word ", fleetPrompt))
	body := `{"model":"` + model + `","stream":` + strconv.FormatBool(stream) + `,"max_tokens":` + strconv.Itoa(fleetMax) +
		`,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	path := "/v1/chat/completions"
	if responses {
		body = `{"model":"` + model + `","stream":` + strconv.FormatBool(stream) + `,"max_output_tokens":` + strconv.Itoa(fleetMax) +
			`,"input":"` + prompt + `"}`
		path = "/v1/responses"
	}
	r, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+key)
	return r
}

// send sends one completion and reads its answer whole.
func (f *fleet) send(client *http.Client, base, key, model string, stream, responses bool) sent {
	resp, err := client.Do(f.request(base, key, model, stream, responses))
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
