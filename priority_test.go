package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// The Middleware decides each request at the priority its Priority function gives: a
// bucket of 10 with reserves 0/20/50 admits 5 sheddable requests, then 3 normal ones,
// then 2 critical ones; on the empty bucket, a 429's Retry-After is its own priority's
// (6, 3 and 1 tokens short), and OnDecision sees the priority.
func TestMiddlewarePriority(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	l, err := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.Rule{Limit: 1, Period: time.Second, Burst: 10},
		ratelimit.WithNamespace("api"), ratelimit.WithReserves(0, 20, 50))
	if err != nil {
		t.Fatal(err)
	}
	classes := map[string]ratelimit.Priority{"/login": ratelimit.Critical, "/orders": ratelimit.Normal, "/export": ratelimit.Sheddable}
	var log eventLog
	var seen ratelimit.Priority
	h := (&ratelimit.Middleware{
		Limiter:    l,
		Key:        func(*http.Request) (string, error) { return "tenant", nil },
		Priority:   func(r *http.Request) ratelimit.Priority { return classes[r.URL.Path] },
		OnDecision: log.hook,
	}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = ratelimit.PriorityFrom(r.Context()) }))
	for _, c := range []struct {
		path        string
		admitted    int
		retryAfter  string
		wantHandler ratelimit.Priority
	}{{"/export", 5, "1", ratelimit.Sheddable}, {"/orders", 3, "1", ratelimit.Normal}, {"/login", 2, "1", ratelimit.Critical}} {
		admitted := 0
		for range 10 {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", c.path, nil))
			switch w.Code {
			case http.StatusOK:
				admitted++
				if seen != c.wantHandler {
					t.Errorf("%s: the handler's context has priority %v; want %v", c.path, seen, c.wantHandler)
				}
			case http.StatusTooManyRequests:
				// each is first denied one token short
				if got := w.Header().Get("Retry-After"); got != c.retryAfter {
					t.Errorf("%s denied with Retry-After %q; want %q", c.path, got, c.retryAfter)
				}
			default:
				t.Fatalf("%s: status %d", c.path, w.Code)
			}
		}
		if admitted != c.admitted {
			t.Errorf("10 requests to %s admitted %d; want %d", c.path, admitted, c.admitted)
		}
	}
	for path, want := range map[string]string{"/export": "6", "/orders": "3", "/login": "1"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if got := w.Header().Get("Retry-After"); w.Code != http.StatusTooManyRequests || got != want {
			t.Errorf("%s on the empty bucket: %d, Retry-After %q; want 429, %q", path, w.Code, got, want)
		}
	}
	events := log.take()
	if len(events) != 33 || events[0].Priority != ratelimit.Sheddable || events[29].Priority != ratelimit.Critical {
		// 10 of each class, then one of each
		t.Errorf("%d events; the first at %v, the last at %v", len(events), events[0].Priority, events[len(events)-1].Priority)
	}
}

// ContextLimiter and ContextInFlight decide each call at the priority their Priority
// function gives.
func TestContextPriority(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := localstore.New(localstore.WithClock(clk))
	l, _ := tokenbucket.New(store, ratelimit.Rule{Limit: 1, Period: time.Second, Burst: 10},
		ratelimit.WithNamespace("grpc"), ratelimit.WithReserves(0, 50))
	type prio struct{}
	priority := func(ctx context.Context) ratelimit.Priority {
		p, _ := ctx.Value(prio{}).(ratelimit.Priority)
		return p
	}
	at := func(p ratelimit.Priority) context.Context { return context.WithValue(withKey("a"), prio{}, p) }
	c := &ratelimit.ContextLimiter{Limiter: l, Key: ctxKey, Priority: priority}
	var denied *ratelimit.DeniedError
	for i := range 6 {
		err := c.Limit(at(ratelimit.Normal))
		if (i < 5) != (err == nil) || (i == 5 && !errors.As(err, &denied)) {
			t.Errorf("normal call %d: %v; want 5 admitted, then denied", i, err)
		}
	}
	if err := c.Limit(at(ratelimit.Critical)); err != nil {
		t.Errorf("a critical call with 5 tokens left: %v", err)
	}

	f, _ := ratelimit.NewInFlight(store, 4, time.Minute, ratelimit.WithNamespace("calls"), ratelimit.WithReserves(0, 50))
	in := &ratelimit.ContextInFlight{InFlight: f, Key: ctxKey, Priority: priority}
	var releases []func()
	for i := range 3 {
		release, err := in.Acquire(at(ratelimit.Normal))
		if (i < 2) != (err == nil) {
			t.Errorf("normal acquire %d: %v; want 2 held, then denied", i, err)
		}
		if release != nil {
			releases = append(releases, release)
		}
	}
	for range 2 {
		release, err := in.Acquire(at(ratelimit.Critical))
		if err != nil {
			t.Errorf("a critical acquire with 2 of 4 held: %v", err)
		} else {
			releases = append(releases, release)
		}
	}
	for _, r := range releases {
		r()
	}
}

// Policies, each with its own key and rule: a tenant's monthly quota beside a rate per
// (tenant, route) whose rule is the tenant's plan, at the request's priority, all or
// none; the headers are the binding policy's alone; a request without a tenant gets
// KeyError's answer and counts nowhere; one no policy matches passes without headers.
func TestMiddlewarePolicyFor(t *testing.T) {
	clk := clock.NewFake(time.Date(2027, 1, 31, 23, 59, 0, 0, time.UTC))
	store := localstore.New(localstore.WithClock(clk))
	quota, err := fixedwindow.NewQuota(store, fixedwindow.Quota{Limit: 3, Per: fixedwindow.Month})
	if err != nil {
		t.Fatal(err)
	}
	rate, _ := tokenbucket.New(store, ratelimit.PerSecond(20), ratelimit.WithNamespace("rate"), ratelimit.WithReserves(0, 50))
	tenant := func(r *http.Request) (string, error) {
		if t := r.Header.Get("X-Tenant"); t != "" {
			return t, nil
		}
		return "", errors.New("no X-Tenant")
	}
	free := func(r *http.Request) bool { return r.URL.Path != "/free" }
	h := (&ratelimit.Middleware{
		Key: func(r *http.Request) (string, error) { t, err := tenant(r); return t + ":" + r.URL.Path, err },
		Priority: func(r *http.Request) ratelimit.Priority {
			if r.Header.Get("X-Priority") == "normal" {
				return ratelimit.Normal
			}
			return ratelimit.Critical
		},
		Policies: []ratelimit.Policy{
			{Name: "rate", Limiter: rate, Match: free, For: func(r *http.Request) (ratelimit.PolicyLimit, error) {
				if r.Header.Get("X-Plan") == "small" {
					return ratelimit.PolicyLimit{Rule: ratelimit.PerSecond(2)}, nil
				}
				return ratelimit.PolicyLimit{}, nil // the limiter's own rule, the Middleware's key
			}},
			{Name: "quota", Limiter: quota, Match: free, For: func(r *http.Request) (ratelimit.PolicyLimit, error) {
				t, err := tenant(r)
				return ratelimit.PolicyLimit{Key: t}, err
			}},
		},
		KeyError: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		},
	}).Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	get := func(path string, header ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	headers := func(w *httptest.ResponseRecorder) string {
		h := w.Header()
		return fmt.Sprint(w.Code, " ", h.Get("X-RateLimit-Limit"), "/", h.Get("X-RateLimit-Remaining"), "/", h.Get("X-RateLimit-Reset"),
			" ", h.Get("RateLimit"), " retry ", h.Get("Retry-After"))
	}
	// the tenant's quota counts across its routes; each route's rate apart
	for i, want := range []string{
		`200 3/2/60 "quota";r=2;t=60 retry `,
		`200 3/1/60 "quota";r=1;t=60 retry `,
		`200 3/0/60 "quota";r=0;t=60 retry `,
		`429 3/0/60 "quota";r=0;t=60 retry 60`, // the quota's numbers, never the rate's 20
	} {
		w := get([]string{"/a", "/b", "/c", "/d"}[i], "X-Tenant", "t")
		if got := headers(w); got != want {
			t.Errorf("tenant t's request %d: %s; want %s", i+1, got, want)
		}
		if i == 0 && w.Header().Get("RateLimit-Policy") != `"rate";q=20;w=1, "quota";q=3;w=2592000` {
			t.Errorf("RateLimit-Policy %q", w.Header().Get("RateLimit-Policy"))
		}
	}
	if d, _ := rate.PeekN(context.Background(), "t:/d", 1); d.Remaining != 19 {
		t.Errorf("the rate of t:/d has %d left after the quota denied its request; want 20, untouched", d.Remaining+1)
	}
	// a rule per request: the small plan's 2 a second; a Normal request leaves the half
	// the reserve keeps (and is told what is left above it)
	for i, c := range []struct{ priority, want string }{
		{"normal", `200 2/0/1 "rate";r=0;t=1 retry `},
		{"normal", `429 2/0/1 "rate";r=0;t=1 retry 1`}, // 1 left, kept for critical requests
		{"critical", `200 2/0/1 "rate";r=0;t=1 retry `},
	} {
		if got := headers(get("/a", "X-Tenant", "u", "X-Plan", "small", "X-Priority", c.priority)); got != c.want {
			t.Errorf("tenant u's request %d (%s): %s; want %s", i+1, c.priority, got, c.want)
		}
	}
	if w := get("/a"); w.Code != http.StatusUnauthorized {
		t.Errorf("no tenant: %d; want KeyError's 401", w.Code)
	}
	if w := get("/free", "X-Tenant", "t"); w.Code != http.StatusOK || w.Header().Get("RateLimit") != "" {
		t.Errorf("a request no policy matches: %d %v", w.Code, w.Header())
	}
}
