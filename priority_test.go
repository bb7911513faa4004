package ratelimit_test

import (
	"context"
	"errors"
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

// DecidePolicies: limits chosen per request, all or none, each named in the headers; a
// request no limit applies to passes without them.
func TestMiddlewareDecidePolicies(t *testing.T) {
	clk := clock.NewFake(time.Date(2027, 1, 31, 23, 59, 0, 0, time.UTC))
	store := localstore.New(localstore.WithClock(clk))
	quota, err := fixedwindow.NewQuota(store, fixedwindow.Quota{Limit: 1, Per: fixedwindow.Month})
	if err != nil {
		t.Fatal(err)
	}
	qalg, err := quota.Quota().Algorithm()
	if err != nil {
		t.Fatal(err)
	}
	rate, _ := tokenbucket.New(store, ratelimit.PerSecond(20), ratelimit.WithNamespace("rate"))
	h := (&ratelimit.Middleware{
		Key: func(*http.Request) (string, error) { return "tenant", nil },
		DecidePolicies: func(r *http.Request, key string) ([]ratelimit.PolicyDecision, error) {
			if r.URL.Path == "/free" {
				return nil, nil
			}
			ds, err := ratelimit.ApplyAll(r.Context(), store, []ratelimit.Request{
				{Key: key, N: 1, Spec: &ratelimit.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: rate.Namespace(), Rule: rate.Rule()}},
				{Key: key, N: 1, Spec: &ratelimit.Spec{Algorithm: qalg, Namespace: quota.Namespace(), Rule: quota.Rule()}}})
			if err != nil {
				return nil, err
			}
			return []ratelimit.PolicyDecision{{Name: "rate", Rule: rate.Rule(), Decision: ds[0]}, {Name: "plan", Rule: quota.Rule(), Decision: ds[1]}}, nil
		},
	}).Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	get := func(path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		return w
	}
	if w := get("/"); w.Code != http.StatusOK || w.Header().Get("RateLimit") != `"plan";r=0;t=60` {
		t.Errorf("the first: %d %v", w.Code, w.Header())
	}
	w := get("/")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("RateLimit-Policy") != `"rate";q=20;w=1, "plan";q=1;w=2592000` ||
		w.Header().Get("Retry-After") != "60" {
		t.Errorf("the second: %d %v", w.Code, w.Header())
	}
	if w := get("/free"); w.Code != http.StatusOK || w.Header().Get("RateLimit") != "" {
		t.Errorf("a request no limit applies to: %d %v", w.Code, w.Header())
	}
}
