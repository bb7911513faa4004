package ratelimit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })

func headerKey(r *http.Request) (string, error) {
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return k, nil
	}
	return "", errors.New("missing X-Api-Key")
}

func serve(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/orders", nil)
	if key != "" {
		r.Header.Set("X-Api-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMiddlewareHeaders(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	// capacity 10, 2 per second: a full bucket comes back in 5 s
	l, err := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.Rule{Limit: 2, Period: time.Second, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	h := (&ratelimit.Middleware{Limiter: l, Key: headerKey,
		PolicyName: func(*http.Request) string { return "orders" }}).Wrap(ok)
	for i := range 10 {
		if w := serve(h, "shop-a"); w.Code != 200 {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	w := serve(h, "shop-a")
	want := map[string]string{
		"X-Ratelimit-Limit":     "10",
		"X-Ratelimit-Remaining": "0",
		"X-Ratelimit-Reset":     "5",
		"Retry-After":           "1", // 500ms, rounded up
		"Ratelimit-Policy":      `"orders";q=10;w=5`,
		"Ratelimit":             `"orders";r=0;t=5`,
	}
	if w.Code != http.StatusTooManyRequests {
		t.Errorf("the 11th request: %d; want 429", w.Code)
	}
	for k, v := range want {
		if got := w.Header().Get(k); got != v {
			t.Errorf("%s: %q; want %q", k, got, v)
		}
	}
	clk.Advance(500 * time.Millisecond)
	if w := serve(h, "shop-a"); w.Code != 200 || w.Header().Get("Retry-After") != "" || w.Header().Get("X-Ratelimit-Remaining") != "0" {
		t.Errorf("after Retry-After: %d %v", w.Code, w.Header())
	}
	if w := serve(h, "shop-b"); w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "9" {
		t.Errorf("another key: %d %v", w.Code, w.Header())
	}
}

func TestMiddlewareKeys(t *testing.T) {
	l, _ := fixedwindow.New(localstore.New(), ratelimit.PerHour(100))
	h := (&ratelimit.Middleware{Limiter: l, Key: headerKey}).Wrap(ok)
	for name, key := range map[string]string{
		"missing":               "",
		"too long":              strings.Repeat("k", 257),
		"with a control char":   "shop-a\x01",
		"folded (a tab inside)": "shop-a\t",
	} {
		if w := serve(h, key); w.Code != http.StatusBadRequest {
			t.Errorf("a key %s: %d; want 400", name, w.Code)
		}
	}
	if w := serve(h, strings.Repeat("k", 256)); w.Code != 200 {
		t.Errorf("a key of 256 bytes: %d; want 200", w.Code)
	}
	custom := (&ratelimit.Middleware{Limiter: l, Key: headerKey, MaxKeyLength: 4,
		KeyError: func(w http.ResponseWriter, _ *http.Request, err error) {
			if !errors.Is(err, ratelimit.ErrInvalidKey) {
				t.Errorf("KeyError's error %v does not wrap ErrInvalidKey", err)
			}
			http.Error(w, err.Error(), http.StatusUnauthorized)
		}}).Wrap(ok)
	if w := serve(custom, ""); w.Code != http.StatusUnauthorized {
		t.Errorf("KeyError: %d; want 401", w.Code)
	}
	if w := serve(custom, "shop-a"); w.Code != http.StatusUnauthorized {
		t.Errorf("MaxKeyLength 4: %d; want refused", w.Code)
	}
}

// failing is a store whose backend is down.
type failing struct{}

func (failing) Apply(context.Context, core.Request) (core.Outcome, error) {
	return core.Outcome{}, ratelimit.ErrUnavailable
}

func TestMiddlewareErrors(t *testing.T) {
	l, _ := tokenbucket.New(failing{}, ratelimit.PerSecond(1))
	if w := serve((&ratelimit.Middleware{Limiter: l, Key: headerKey}).Wrap(ok), "k"); w.Code != 200 {
		t.Errorf("fail open by default: %d; want 200", w.Code)
	}
	var seen error
	closed := &ratelimit.Middleware{Limiter: l, Key: headerKey,
		Error: func(w http.ResponseWriter, _ *http.Request, err error) bool {
			seen = err
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return false
		}}
	if w := serve(closed.Wrap(ok), "k"); w.Code != http.StatusServiceUnavailable || !errors.Is(seen, ratelimit.ErrUnavailable) {
		t.Errorf("fail closed: %d, %v; want 503 and the store's error", w.Code, seen)
	}
	for name, m := range map[string]*ratelimit.Middleware{
		"no key":     {Limiter: l},
		"no limiter": {Key: headerKey},
		"nil":        nil,
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "ratelimit:") {
					t.Errorf("Wrap with %s: %v; want a panic that says what is missing", name, r)
				}
			}()
			m.Wrap(ok)
		}()
	}
}

// TestMiddlewareRulePerRequest: Decide picks each tenant's rule with AllowRule.
func TestMiddlewareRulePerRequest(t *testing.T) {
	l, err := tokenbucket.New(localstore.New(), ratelimit.PerMinute(1), ratelimit.WithNamespace("plans"))
	if err != nil {
		t.Fatal(err)
	}
	plans := map[string]ratelimit.Rule{"gold": ratelimit.PerMinute(5), "free": ratelimit.PerMinute(2)}
	h := (&ratelimit.Middleware{Key: headerKey, Decide: func(r *http.Request, key string) (ratelimit.Decision, ratelimit.Rule, error) {
		rule := plans[key]
		d, err := l.AllowRule(r.Context(), key, rule, 1)
		return d, rule, err
	}}).Wrap(ok)
	for key, want := range map[string]int{"gold": 5, "free": 2} {
		admitted := 0
		for range 8 {
			if serve(h, key).Code == 200 {
				admitted++
			}
		}
		if admitted != want {
			t.Errorf("%s: %d admitted; want %d", key, admitted, want)
		}
	}
	if w := serve(h, "free"); w.Header().Get("Ratelimit-Policy") != `"default";q=2;w=60` {
		t.Errorf("the policy of the rule Decide returned: %q", w.Header().Get("Ratelimit-Policy"))
	}
}

// TestMiddlewareDelay: a leaky bucket's admitted requests are held for their Delay.
func TestMiddlewareDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := leakybucket.New(localstore.New(), ratelimit.Rule{Limit: 2, Period: time.Second, Burst: 3})
		h := (&ratelimit.Middleware{Limiter: l, Key: headerKey}).Wrap(ok)
		start := time.Now()
		// one after another: each waits for the one before it to leak, 500ms apart
		for i, want := range []time.Duration{0, 500 * time.Millisecond, time.Second} {
			if w := serve(h, "k"); w.Code != 200 {
				t.Fatalf("request %d: %d", i, w.Code)
			}
			if got := time.Since(start); got != want {
				t.Errorf("request %d passed on at %v; want %v", i, got, want)
			}
		}
	})
}

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, tc := range []struct{ remote, xff, want string }{
		{"198.51.100.9:1234", "", "198.51.100.9"},
		{"198.51.100.9:1234", "1.2.3.4", "198.51.100.9"},                    // an untrusted peer's header is ignored
		{"10.0.0.1:1234", "203.0.113.7", "203.0.113.7"},                     // one trusted proxy
		{"10.0.0.1:1234", "1.2.3.4, 203.0.113.7, 10.0.0.2", "203.0.113.7"},  // past two trusted hops; 1.2.3.4 is the client's own claim
		{"10.0.0.1:1234", "10.0.0.3, 10.0.0.2", "10.0.0.3"},                 // all trusted: the farthest
		{"10.0.0.1:1234", "garbage, 203.0.113.7", "203.0.113.7"},            // a malformed hop past the client is never read
		{"10.0.0.1:1234", "203.0.113.7, garbage", "10.0.0.1"},               // a malformed hop: stop at the last trusted
		{"[2001:db8:1:2:3:4:5:6]:443", "", "2001:db8:1:2::"},                // IPv6 masked to /64
		{"[fd00::1]:443", "2001:db8:aa:bb:cc:dd:ee:ff", "2001:db8:aa:bb::"}, // behind a trusted IPv6 proxy
		{"[::ffff:10.0.0.1]:80", "203.0.113.7", "203.0.113.7"},              // IPv4-mapped peer
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		got, err := ratelimit.ClientIP(r, trusted)
		if err != nil || got.String() != tc.want {
			t.Errorf("%s with X-Forwarded-For %q: %v, %v; want %s", tc.remote, tc.xff, got, err, tc.want)
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Set("X-Forwarded-For", "203.0.113.7")
	if got, _ := ratelimit.ClientIP(r, nil); got.String() != "10.0.0.1" {
		t.Errorf("no trusted proxies: %v; want the peer, X-Forwarded-For unread", got)
	}
	r.RemoteAddr = "@unix"
	if _, err := ratelimit.ClientIP(r, nil); err == nil {
		t.Error("a RemoteAddr that is no address: no error")
	}
}

// RateLimit-Policy's w is how long a full quota takes to come back, in whole seconds
// rounded up, computed in integers: a float rounds 2000 s up to 2001 for some rules.
func TestMiddlewarePolicyWindow(t *testing.T) {
	for _, tc := range []struct {
		rule ratelimit.Rule
		want string
	}{
		{ratelimit.Rule{Limit: 3, Period: time.Minute, Burst: 100}, `"default";q=100;w=2000`},
		{ratelimit.Rule{Limit: 10, Period: time.Minute, Burst: 83}, `"default";q=83;w=498`},
		{ratelimit.Rule{Limit: 6, Period: time.Minute, Burst: 25}, `"default";q=25;w=250`},
		{ratelimit.Rule{Limit: 1000, Period: time.Second}, `"default";q=1000;w=1`},
		{ratelimit.Rule{Limit: 3, Period: 1500 * time.Millisecond}, `"default";q=3;w=2`},
		{ratelimit.Rule{Limit: 7, Period: 3650 * 24 * time.Hour}, `"default";q=7;w=315360000`},
	} {
		l, err := tokenbucket.New(localstore.New(), tc.rule)
		if err != nil {
			t.Fatal(err)
		}
		w := serve((&ratelimit.Middleware{Limiter: l, Key: headerKey}).Wrap(ok), "k")
		if got := w.Header().Get("RateLimit-Policy"); got != tc.want {
			t.Errorf("%v: RateLimit-Policy %q; want %q", tc.rule, got, tc.want)
		}
	}
}

// Policy names go out as RFC 8941 Strings: '"' and '\' escaped; a name no strict client
// could read (a control character, a letter outside ASCII) leaves the two IETF headers
// out, and the de facto ones stay.
func TestMiddlewarePolicyNames(t *testing.T) {
	l, err := tokenbucket.New(localstore.New(), ratelimit.PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	for name, want := range map[string]string{
		`orders`:     `"orders";r=4;t=1`,
		`say "hi"\a`: `"say \"hi\"\\a";r=4;t=1`,
		"café":       "",
		"tab\there":  "",
		"":           `"";r=4;t=1`,
	} {
		h := (&ratelimit.Middleware{Limiter: l, Key: headerKey, PolicyName: func(*http.Request) string { return name }}).Wrap(ok)
		i++
		w := serve(h, fmt.Sprint("key-", i))
		if got := w.Header().Get("RateLimit"); got != want {
			t.Errorf("name %q: RateLimit %q; want %q", name, got, want)
		}
		if (w.Header().Get("RateLimit-Policy") == "") != (want == "") || w.Header().Get("X-RateLimit-Remaining") != "4" {
			t.Errorf("name %q: headers %v", name, w.Header())
		}
	}
}

// Under several policies, RateLimit-Policy lists each one that took part and RateLimit
// names the one that bounds the client; a request one policy denies consumes nothing
// from the others.
func TestMiddlewarePolicies(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := localstore.New(localstore.WithClock(clk))
	perKey, err := tokenbucket.New(store, ratelimit.PerSecond(20), ratelimit.WithNamespace("per-key"))
	if err != nil {
		t.Fatal(err)
	}
	export, err := fixedwindow.New(store, ratelimit.PerMinute(3), ratelimit.WithNamespace("export"))
	if err != nil {
		t.Fatal(err)
	}
	isExport := func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/export") }
	h := (&ratelimit.Middleware{Key: headerKey, Policies: []ratelimit.Policy{
		{Name: "per-key", Limiter: perKey},
		{Name: "export", Limiter: export, Match: isExport},
	}}).Wrap(ok)
	get := func(path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-Api-Key", "shop-a")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := get("/orders")
	if w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"per-key";q=20;w=1` || w.Header().Get("RateLimit") != `"per-key";r=19;t=1` {
		t.Fatalf("an order: %d %v", w.Code, w.Header())
	}
	for i := range 3 {
		w := get("/export")
		wantRL := []string{`"export";r=2;t=60`, `"export";r=1;t=60`, `"export";r=0;t=60`}[i]
		if w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"per-key";q=20;w=1, "export";q=3;w=60` ||
			w.Header().Get("RateLimit") != wantRL || w.Header().Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("export %d: %d %v; want RateLimit %s", i, w.Code, w.Header(), wantRL)
		}
	}
	w = get("/export")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("RateLimit") != `"export";r=0;t=60` || w.Header().Get("Retry-After") != "60" {
		t.Fatalf("the fourth export: %d %v", w.Code, w.Header())
	}
	// the denied export took nothing from the per-key bucket: 20 - 1 order - 3 exports
	if w := get("/orders"); w.Code != 200 || w.Header().Get("RateLimit") != `"per-key";r=15;t=1` {
		t.Fatalf("an order after the denied export: %d %v", w.Code, w.Header())
	}
}

func TestMiddlewarePoliciesRefused(t *testing.T) {
	store := localstore.New()
	a, _ := tokenbucket.New(store, ratelimit.PerSecond(2), ratelimit.WithNamespace("a"))
	a2, _ := tokenbucket.New(store, ratelimit.PerSecond(9), ratelimit.WithNamespace("a"))
	elsewhere, _ := tokenbucket.New(localstore.New(), ratelimit.PerSecond(2), ratelimit.WithNamespace("b"))
	for name, ps := range map[string][]ratelimit.Policy{
		"no limiter":    {{Name: "a"}},
		"a bad name":    {{Name: "café", Limiter: a}},
		"no name":       {{Limiter: a}},
		"the same name": {{Name: "a", Limiter: a}, {Name: "a", Limiter: elsewhere}},
		"the same keys": {{Name: "a", Limiter: a}, {Name: "b", Limiter: a2}},
		"two stores":    {{Name: "a", Limiter: a}, {Name: "b", Limiter: elsewhere}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Wrap did not panic", name)
				}
			}()
			(&ratelimit.Middleware{Key: headerKey, Policies: ps}).Wrap(ok)
		}()
	}
}

// limiterFunc is a Limiter that is not built on AlgorithmLimiter.
type limiterFunc func(ctx context.Context, key string, n int64) (ratelimit.Decision, error)

func (f limiterFunc) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return f(ctx, key, 1)
}

func (f limiterFunc) AllowN(ctx context.Context, key string, n int64) (ratelimit.Decision, error) {
	return f(ctx, key, n)
}

// eventLog is an OnDecision that keeps what it sees.
type eventLog struct {
	mu     sync.Mutex
	events []ratelimit.Event
}

func (l *eventLog) hook(_ context.Context, e ratelimit.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) take() []ratelimit.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.events
	l.events = nil
	return e
}

// Exempt requests skip everything: no limiter, no headers, no hook.
func TestMiddlewareExempt(t *testing.T) {
	l, _ := tokenbucket.New(localstore.New(), ratelimit.PerHour(1), ratelimit.WithNamespace("x"))
	var log eventLog
	h := (&ratelimit.Middleware{Limiter: l, Key: headerKey, OnDecision: log.hook,
		Exempt: func(r *http.Request) bool { return r.URL.Path == "/healthz" }}).Wrap(ok)
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil)) // no key at all
		if w.Code != 200 || w.Header().Get("X-Ratelimit-Limit") != "" {
			t.Fatalf("an exempt request: %d %v", w.Code, w.Header())
		}
	}
	if e := log.take(); len(e) != 0 {
		t.Errorf("exempt requests reached the hook: %+v", e)
	}
	if w := serve(h, "k"); w.Code != 200 {
		t.Fatalf("the first limited request: %d", w.Code)
	}
	if w := serve(h, "k"); w.Code != http.StatusTooManyRequests {
		t.Fatalf("the second limited request: %d; want 429 (the exempt ones took nothing)", w.Code)
	}
}

// Shadow decides and counts but denies none: a would-be denial goes on, without the
// headers, and the hook sees it.
func TestMiddlewareShadow(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	l, _ := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerHour(2), ratelimit.WithNamespace("x"))
	var log eventLog
	h := (&ratelimit.Middleware{Limiter: l, Key: headerKey, Shadow: true, OnDecision: log.hook,
		PolicyName: func(*http.Request) string { return "trial" }}).Wrap(ok)
	for i := range 4 {
		w := serve(h, "k")
		if w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "" || w.Header().Get("Ratelimit") != "" || w.Header().Get("Retry-After") != "" {
			t.Fatalf("request %d in shadow mode: %d %v", i, w.Code, w.Header())
		}
	}
	events := log.take()
	if len(events) != 4 {
		t.Fatalf("%d events: %+v", len(events), events)
	}
	for i, e := range events {
		if e.Key != "k" || e.Policy != "trial" || !e.Shadowed || e.Decision.Allowed != (i < 2) || e.InFlight || e.Err != nil {
			t.Errorf("event %d: %+v; want the %d-th decision of 2 an hour, shadowed", i, e, i+1)
		}
	}
	if d, _ := l.PeekN(context.Background(), "k", 1); d.Allowed {
		t.Errorf("after shadowed requests: %+v; want the bucket spent (shadow mode counts)", d)
	}
}

// A shadowed policy counts alone, after the enforced ones admit a request, and is in
// neither the headers nor the answer.
func TestMiddlewareShadowPolicy(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := localstore.New(localstore.WithClock(clk))
	live, _ := tokenbucket.New(store, ratelimit.PerHour(3), ratelimit.WithNamespace("live"))
	trial, _ := fixedwindow.New(store, ratelimit.PerHour(1), ratelimit.WithNamespace("trial"))
	var log eventLog
	h := (&ratelimit.Middleware{Key: headerKey, OnDecision: log.hook, Policies: []ratelimit.Policy{
		{Name: "live", Limiter: live}, {Name: "trial", Limiter: trial, Shadow: true},
	}}).Wrap(ok)
	codes := ""
	for range 4 {
		w := serve(h, "k")
		codes += fmt.Sprint(w.Code, " ")
		if strings.Contains(w.Header().Get("Ratelimit-Policy"), "trial") {
			t.Errorf("the shadowed policy in the headers: %v", w.Header())
		}
	}
	if codes != "200 200 200 429 " {
		t.Errorf("codes %s; want the live policy's alone: 200 200 200 429", codes)
	}
	var trials []bool
	for _, e := range log.take() {
		if e.Policy == "trial" {
			if !e.Shadowed {
				t.Errorf("a trial event not shadowed: %+v", e)
			}
			trials = append(trials, e.Decision.Allowed)
		}
	}
	if fmt.Sprint(trials) != "[true false false]" { // the fourth, denied live, is not counted
		t.Errorf("the trial policy's decisions: %v; want [true false false]", trials)
	}
}

// downStore is a store whose backend is down.
type downStore struct{}

func (downStore) Apply(context.Context, core.Request) (core.Outcome, error) {
	return core.Outcome{}, fmt.Errorf("down: %w", ratelimit.ErrUnavailable)
}

// The hook sees which store of a fallback decided, the in-flight limit's decisions, and
// a failed limiter's error, which also reaches the Logger as the request goes on.
func TestMiddlewareOnDecision(t *testing.T) {
	up := fallback.New(localstore.New(), localstore.New(), fallback.WithTimeout(time.Minute))
	down := fallback.New(downStore{}, localstore.New())
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	for _, tc := range []struct {
		store  ratelimit.Store
		source string
	}{{up, "primary"}, {down, "secondary"}} {
		l, _ := tokenbucket.New(tc.store, ratelimit.PerSecond(5), ratelimit.WithNamespace("api"))
		inflight, _ := ratelimit.NewInFlight(tc.store, 2, time.Minute)
		var log eventLog
		h := (&ratelimit.Middleware{Limiter: l, InFlight: inflight, Key: headerKey, OnDecision: log.hook, Logger: logger}).Wrap(ok)
		if w := serve(h, "k"); w.Code != 200 {
			t.Fatalf("%s: %d", tc.source, w.Code)
		}
		events := log.take()
		if len(events) != 2 {
			t.Fatalf("%s: %d events: %+v", tc.source, len(events), events)
		}
		rate, lease := events[0], events[1]
		if rate.InFlight || rate.Source != tc.source || !rate.Decision.Allowed || rate.Decision.Remaining != 4 || rate.Latency <= 0 || rate.Policy != "default" {
			t.Errorf("%s: the rate's event %+v", tc.source, rate)
		}
		if !lease.InFlight || lease.Source != tc.source || !lease.Decision.Allowed || lease.Decision.Remaining != 1 {
			t.Errorf("%s: the lease's event %+v", tc.source, lease)
		}
	}
	l, _ := tokenbucket.New(downStore{}, ratelimit.PerSecond(5), ratelimit.WithNamespace("api"))
	var log eventLog
	h := (&ratelimit.Middleware{Limiter: l, Key: headerKey, OnDecision: log.hook, Logger: logger}).Wrap(ok)
	if w := serve(h, "k"); w.Code != 200 {
		t.Fatalf("a failed limiter: %d; want the request to go on", w.Code)
	}
	if e := log.take(); len(e) != 1 || !errors.Is(e[0].Err, ratelimit.ErrUnavailable) || e[0].Source != "" {
		t.Errorf("a failed limiter's events: %+v", e)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "the limiter failed") || !strings.Contains(logs.String(), "down") {
		t.Errorf("the log: %q", logs.String())
	}
}
