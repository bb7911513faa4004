package ratelimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
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

func (failing) Apply(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, ratelimit.ErrUnavailable
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
