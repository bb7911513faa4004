package ratelimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// Wait gets a lease once one is released, and gives up at its context's deadline.
func TestInFlightWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l, err := ratelimit.NewInFlight(localstore.New(), 1, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		held, err := l.Wait(ctx, "k") // free: at once
		if err != nil || held == nil {
			t.Fatalf("Wait on a free key = %v, %v", held, err)
		}
		start := time.Now()
		got := make(chan *ratelimit.Lease, 1)
		go func() {
			lease, err := l.Wait(ctx, "k")
			if err != nil {
				t.Error(err)
			}
			got <- lease
		}()
		time.Sleep(5 * time.Second) // in the bubble: the waiter asks again and again
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("Wait returned while the only lease was held")
		default:
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lease := <-got
		if lease == nil {
			t.Fatal("Wait returned no lease")
		}
		// asked at most every 100ms: it got the lease within that of the release
		if waited := time.Since(start); waited > 5*time.Second+100*time.Millisecond {
			t.Errorf("Wait took %v after the release at 5s", waited)
		}

		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		if lease, err := l.Wait(short, "k"); !errors.Is(err, context.DeadlineExceeded) || lease != nil {
			t.Errorf("Wait past its deadline = %v, %v; want context.DeadlineExceeded", lease, err)
		}
		cancelled, cancel2 := context.WithCancel(ctx)
		cancel2()
		if _, err := l.Wait(cancelled, "k"); !errors.Is(err, context.Canceled) {
			t.Errorf("Wait with a cancelled context: %v", err)
		}
	})
}

// gate is a handler that blocks each request on /slow until released, and panics on
// /panic.
type gate struct {
	started chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{started: make(chan struct{}, 100), release: make(chan struct{})} }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/slow":
		g.started <- struct{}{}
		<-g.release
	case "/panic":
		panic(http.ErrAbortHandler)
	}
	w.Write([]byte("ok"))
}

func get(h http.Handler, path, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", path, nil)
	r.Header.Set("X-Api-Key", key)
	w := httptest.NewRecorder()
	func() {
		defer func() { recover() }()
		h.ServeHTTP(w, r)
	}()
	return w
}

// The middleware holds a lease per request in progress, extends it while the handler
// runs past the lease duration, and releases it when the handler returns or panics.
func TestMiddlewareInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inflight, err := ratelimit.NewInFlight(localstore.New(), 2, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		g := newGate()
		h := (&ratelimit.Middleware{InFlight: inflight, Key: headerKey}).Wrap(g)
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if w := get(h, "/slow", "a"); w.Code != 200 {
					t.Errorf("a slow request: %d", w.Code)
				}
			})
			<-g.started
		}
		w := get(h, "/", "a")
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
			t.Errorf("a third request in progress: %d, Retry-After %q; want 429, 1", w.Code, w.Header().Get("Retry-After"))
		}
		if w := get(h, "/", "b"); w.Code != 200 {
			t.Errorf("another key: %d", w.Code)
		}
		time.Sleep(35 * time.Second) // the slow requests outlive their 10s leases, extended
		synctest.Wait()
		if w := get(h, "/", "a"); w.Code != http.StatusTooManyRequests {
			t.Errorf("at 35s, with two requests still in progress: %d; want 429 (their leases extended)", w.Code)
		}
		g.release <- struct{}{} // one ends
		synctest.Wait()
		if w := get(h, "/", "a"); w.Code != 200 {
			t.Errorf("after one request ended: %d; want 200", w.Code)
		}
		get(h, "/panic", "a") // its lease is released as it panics
		if w := get(h, "/", "a"); w.Code != 200 {
			t.Errorf("after a handler panicked: %d; want 200 (its lease released)", w.Code)
		}
		close(g.release)
		wg.Wait()
	})
}

// With a rate limit, the rate decides first: a request it denies takes no lease. A
// limit per request may lift the in-flight limit (0) or change it, and a custom answer
// replaces the 429.
func TestMiddlewareInFlightWithRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := localstore.New()
		rate, err := tokenbucket.New(store, ratelimit.PerHour(3))
		if err != nil {
			t.Fatal(err)
		}
		inflight, err := ratelimit.NewInFlight(store, 5, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		g := newGate()
		h := (&ratelimit.Middleware{Limiter: rate, InFlight: inflight, Key: headerKey,
			InFlightLimit: func(r *http.Request) int64 {
				if r.URL.Query().Get("unlimited") != "" {
					return 0
				}
				return 1
			},
			InFlightDenied: func(w http.ResponseWriter, r *http.Request, d ratelimit.Decision) {
				http.Error(w, "busy", http.StatusServiceUnavailable)
			},
		}).Wrap(g)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if w := get(h, "/slow", "a"); w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"default";q=3;w=3600, "in-flight";q=1;qu="concurrent-requests"` {
				t.Errorf("slow: %d, RateLimit-Policy %q; want 200 under both limits", w.Code, w.Header().Get("RateLimit-Policy"))
			}
		}()
		<-g.started
		if w := get(h, "/", "a"); w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
			t.Errorf("a second request in progress, with a limit of 1: %d; want 503 with Retry-After 1", w.Code)
		} else {
			for _, name := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
				if v := w.Header().Get(name); v != "" {
					t.Errorf("an in-flight denial carries the rate's %s: %q (quota left beside a refusal)", name, v)
				}
			}
			// the IETF fields name the in-flight limit alone, in the draft's unit for it
			if p, l := w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"); p != `"in-flight";q=1;qu="concurrent-requests"` || l != `"in-flight";r=0` {
				t.Errorf("an in-flight denial: RateLimit-Policy %q, RateLimit %q; want the in-flight limit's", p, l)
			}
		}
		// the request refused for being in progress cost the rate nothing: two more pass it
		for i := range 2 {
			if w := get(h, "/?unlimited=1", "a"); w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"default";q=3;w=3600` {
				t.Errorf("request %d without an in-flight limit: %d, RateLimit-Policy %q; want 200 and the rate's alone", i, w.Code, w.Header().Get("RateLimit-Policy"))
			}
		}
		if w := get(h, "/", "a"); w.Code != http.StatusTooManyRequests || w.Header().Get("X-Ratelimit-Remaining") != "0" {
			t.Errorf("the fourth request of a rate of 3: %d; want 429 from the rate", w.Code)
		}
		peek := core.Request{Key: "a", N: 1, Spec: &core.Spec{Algorithm: concurrency.Algorithm(), Namespace: "5/1m0s", Rule: core.Rule(inflight.Rule()), Op: core.OpPeek}}
		if d, err := store.Apply(context.Background(), peek); err != nil || d.Remaining != 3 {
			t.Errorf("leases: %+v, %v; want the slow request's alone (3 left after one more)", d, err)
		}
		close(g.release)
		<-done
	})
}
