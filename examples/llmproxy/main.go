// Llmproxy is a gateway in front of a language model's API: every API key is limited per
// model as the providers limit theirs (requests and tokens a minute, input and output
// tokens apart or together, tokens a day) and in the requests it has in progress. Each
// request is admitted on an estimate (its prompt's tokens and its max_tokens) and charged
// the usage its answer reports once it is served, JSON or streamed, in OpenAI's format
// (chat completions) or Anthropic's (messages); a stream the client abandons is charged
// what it produced. Clients get the headers they already read (OpenAI's
// x-ratelimit-*-requests and -tokens, or Anthropic's anthropic-ratelimit-*), and the IETF
// draft's RateLimit-Policy and RateLimit of every limit; a denied request gets 429 with
// Retry-After, or waits for its tokens when its client asks to (Prefer: wait=N). A
// request body over -max-body is refused with 413.
//
//	go run ./examples/llmproxy          # a demo: the built-in fake model, one client, printed
//	go run ./examples/llmproxy -serve   # serve on :8081 in front of the fake (or -upstream URL)
//
// The pieces are the module examples/llmlimit, which a service imports; this program
// wires them, with the store of the other examples: an embedded miniredis by default,
// -redis for a real one shared by several instances, -leases to decide busy keys from
// memory (see its README).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
	"github.com/ratelimit-go/ratelimit/examples/llmlimit"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// config is the proxy's limits, as a -limits file holds them (JSON).
type config struct {
	// Models are the limits per API key of each model or family of models (see
	// llmlimit.Table): "" for every model the table does not name.
	Models llmlimit.Table `json:"models"`
	// Weights weigh input and output tokens in the limits of tokens together.
	Weights llmlimit.Weights `json:"weights"`
	// MaxTokens is the answer estimated for a request that says no max_tokens.
	MaxTokens int64 `json:"max_tokens"`
	// InFlight bounds the requests of an API key in progress at once (0: no bound).
	InFlight int64 `json:"in_flight"`
}

// defaultConfig is the limits without a -limits file.
var defaultConfig = config{
	Models:   llmlimit.Table{"": {RequestsPerMinute: 60, TokensPerMinute: 20_000, TokensPerDay: 1_000_000}},
	InFlight: 8,
}

// options are the proxy's settings besides its limits.
type options struct {
	headers string // "openai" or "anthropic"
	maxWait time.Duration
	maxBody int64
	words   bool // estimate a prompt's tokens as its words (the fake model's count)
	report  bool // tell clients what each answer was charged (llmlimit.UsageHeader)
}

func main() {
	var cfg backend.Config
	cfg.Flags(flag.CommandLine)
	serve := flag.Bool("serve", false, "serve on -addr instead of running the demo")
	addr := flag.String("addr", ":8081", "the proxy's address, with -serve")
	upstream := flag.String("upstream", "", "the model API's base URL; the built-in fake model when empty")
	limits := flag.String("limits", "", "a JSON file of the limits (see config); a built-in default when empty")
	var o options
	flag.StringVar(&o.headers, "headers", "openai", "the rate-limit headers clients get beside the IETF draft's: openai or anthropic")
	flag.DurationVar(&o.maxWait, "max-wait", llmlimit.DefaultMaxWait, "the longest a request that asks to (Prefer: wait=N) waits for its limits")
	flag.Int64Var(&o.maxBody, "max-body", llmlimit.DefaultMaxBody, "the largest request body in bytes: a larger one gets 413")
	flag.BoolVar(&o.report, "report-usage", false, "tell clients the tokens each answer was charged, in "+llmlimit.UsageHeader+" (a header, or a stream's trailer)")
	flag.Parse()
	if !*serve {
		if err := demo(os.Stdout); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(cfg, *addr, *upstream, *limits, o); err != nil {
		log.Fatal(err)
	}
}

// run serves the proxy on addr until it is told to stop (SIGINT, SIGTERM).
func run(cfg backend.Config, addr, upstream, limitsFile string, o options) error {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	limits, err := readConfig(limitsFile)
	if err != nil {
		return err
	}
	target := upstream
	if target == "" {
		fake := httptest.NewServer(llmlimit.FakeModel())
		defer fake.Close()
		target, o.words = fake.URL, true
	}
	u, err := url.Parse(target)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return fmt.Errorf("-upstream %q: a URL such as https://api.openai.com is needed", upstream)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg.Members = "llmproxy"
	store, closeStore, err := backend.Open(ctx, cfg, backend.NewMetrics(prometheus.NewRegistry()), logger)
	if err != nil {
		return err
	}
	defer closeStore()
	h, err := newProxy(store, u, limits, o)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	logger.Info("llmproxy serving", "addr", addr, "upstream", target, "headers", o.headers)
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shut) // the answers in progress end, and are charged, before the leases go back
}

// readConfig reads the limits of file, the defaults when it is "".
func readConfig(file string) (config, error) {
	if file == "" {
		return defaultConfig, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return config{}, err
	}
	var c config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return config{}, fmt.Errorf("-limits %s: %w", file, err)
	}
	if len(c.Models) == 0 {
		return config{}, fmt.Errorf("-limits %s: no models: give at least \"\" (every model)", file)
	}
	if c.InFlight < 0 {
		return config{}, fmt.Errorf("-limits %s: in_flight %d is below 0", file, c.InFlight)
	}
	return c, nil
}

// newProxy is the proxy to upstream, limited by c on store: a Gate (413, the estimates,
// waiting), the Middleware (every limit of a request together, the in-flight limit, the
// headers), and the reverse proxy that meters the answers.
func newProxy(store ratelimit.Store, upstream *url.URL, c config, o options) (http.Handler, error) {
	policies, err := c.Models.Policies(store, llmlimit.Options{Weights: c.Weights, MaxTokens: c.MaxTokens})
	if err != nil {
		return nil, err
	}
	mw := &ratelimit.Middleware{
		Key:            llmlimit.APIKey,
		KeyError:       llmlimit.KeyError, // errors in the API's JSON, which its SDKs read
		Denied:         llmlimit.Denied,
		InFlightDenied: llmlimit.Denied,
		Policies:       policies,
	}
	switch o.headers {
	case "openai", "":
		mw.Headers = llmlimit.OpenAIHeaders()
	case "anthropic":
		mw.Headers = llmlimit.AnthropicHeaders(nil)
	default:
		return nil, fmt.Errorf("-headers %q: openai or anthropic", o.headers)
	}
	if c.InFlight > 0 {
		if mw.InFlight, err = ratelimit.NewInFlight(store, c.InFlight, time.Minute, ratelimit.WithNamespace("in-flight")); err != nil {
			return nil, err
		}
	}
	gate := &llmlimit.Gate{MaxBody: o.maxBody, ReportUsage: o.report}
	if o.words {
		gate.Tokens = llmlimit.Words
	}
	if o.maxWait > 0 {
		gate.Waiter = &llmlimit.Waiter{Max: o.maxWait}
		mw.Denied = gate.Waiter.Denied
	}
	return gate.Wrap(mw.Wrap(llmlimit.Proxy(upstream))), nil
}

// demo runs one client against the proxy and the fake model, in memory on a fake clock
// (every run prints the same), and prints what each request got.
func demo(out io.Writer) error {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start)
	fake := httptest.NewServer(llmlimit.FakeModel())
	defer fake.Close()
	u, _ := url.Parse(fake.URL)
	c := config{Models: llmlimit.Table{"": {RequestsPerMinute: 5, TokensPerMinute: 2000}, "big": {TokensPerMinute: 10_000}}, InFlight: 2}
	h, err := newProxy(localstore.New(localstore.WithClock(clk)), u, c, options{headers: "openai", words: true, report: true})
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "Per API key: 5 requests and 2,000 tokens a minute, and 10,000 tokens a minute for the")
	fmt.Fprintln(out, `"big" models. A request is admitted on its prompt's tokens and its max_tokens, and charged`)
	fmt.Fprintln(out, "what the model used once it has answered: the headers say what the next request gets.")
	fmt.Fprintln(out)
	fmt.Fprintf(out, "%-5s %-46s %6s %8s %5s %8s %6s %11s\n", "at", "request", "status", "estimate", "used", "requests", "tokens", "retry-after")
	var last *httptest.ResponseRecorder // the last answer, for its headers
	for _, step := range []struct {
		at     time.Duration
		model  string
		prompt int
		max    int64
		stream bool
	}{
		{0, "m", 100, 1000, false}, // 100 + 400 used of 1100 estimated
		{time.Second, "m", 150, 600, false},
		{2 * time.Second, "m", 100, 400, true}, // streamed, charged all the same
		{3 * time.Second, "m", 200, 800, false},
		{4 * time.Second, "m", 2, 100, false},
		{5 * time.Second, "m", 2, 100, false},
		{5 * time.Second, "big-1", 200, 800, false},
		{30 * time.Second, "m", 200, 800, false},
	} {
		clk.Set(start.Add(step.at))
		body, _ := json.Marshal(map[string]any{"model": step.model, "max_tokens": step.max, "stream": step.stream,
			"messages": []map[string]string{{"role": "user", "content": strings.TrimSpace(strings.Repeat("word ", step.prompt))}}})
		r := httptest.NewRequestWithContext(context.Background(), "POST", "/v1/chat/completions", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer key-1")
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		last = w
		used := w.Result().Trailer.Get(llmlimit.UsageHeader)
		if used == "" {
			used = w.Header().Get(llmlimit.UsageHeader)
		}
		desc := fmt.Sprintf("%s: %d words, max_tokens %d", step.model, step.prompt, step.max)
		if step.stream {
			desc += ", streamed"
		}
		line := fmt.Sprintf("%-5v %-46s %6d %8d %5s %8s %6s %11s", step.at, desc, w.Code, int64(step.prompt)+step.max, orDash(used),
			orDash(w.Header().Get("X-Ratelimit-Remaining-Requests")), orDash(w.Header().Get("X-Ratelimit-Remaining-Tokens")), w.Header().Get("Retry-After"))
		fmt.Fprintln(out, strings.TrimRight(line, " "))
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "The last answer's headers:")
	for _, name := range []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
		"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens", "RateLimit-Policy", "RateLimit"} {
		fmt.Fprintf(out, "  %s: %s\n", name, last.Header().Get(name))
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
