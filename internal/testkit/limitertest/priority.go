package limitertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Reserves are the reserves of the priority scenarios: Critical keeps nothing back,
// Normal 20% of the allowance, Sheddable 50%.
var Reserves = []int64{0, 20, 50}

// PriorityRule is the rule of the priority scenarios: 100 per second, 100 at once.
var PriorityRule = ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 100}

// afterFlood is what each algorithm decides at t=100ms, after 100 requests of each
// priority at t=0 (50 sheddable admitted, then 30 normal, then 20 critical): a request
// of each priority, least important first.
var afterFlood = map[string][3]ratelimit.Decision{
	// 10 tokens back: a sheddable request needs 51 (41 more: 410ms), a normal one 21
	// (110ms), a critical one 1, and leaves 9
	"tokenbucket": {
		denied(100, 0, 410*ms, 900*ms),
		denied(100, 0, 110*ms, 900*ms),
		allowed(100, 9, 910*ms),
	},
	// 10 slots drained: the same waits for slots, and the critical request queues behind
	// the 90 before it
	"leakybucket": {
		denied(100, 0, 410*ms, 900*ms),
		denied(100, 0, 110*ms, 900*ms),
		delayed(100, 9, 900*ms, 910*ms),
	},
	// the window holds 100 until it ends at 1s
	"fixedwindow": {
		denied(100, 0, 900*ms, 900*ms),
		denied(100, 0, 900*ms, 900*ms),
		denied(100, 0, 900*ms, 900*ms),
	},
	// in the next window the 100 weigh (1 - elapsed): 51, 21 and 1 fit 510ms, 210ms and
	// 10ms into it
	"slidingwindow": {
		denied(100, 0, 1410*ms, 1900*ms),
		denied(100, 0, 1110*ms, 1900*ms),
		denied(100, 0, 910*ms, 1900*ms),
	},
	// every event ages out at 1s
	"slidinglog": {
		denied(100, 0, 900*ms, 900*ms),
		denied(100, 0, 900*ms, 900*ms),
		denied(100, 0, 900*ms, 900*ms),
	},
}

// testPriorities floods a key with each priority in turn, least important first, on a
// limiter with Reserves: each admits what the more important ones leave it, whatever the
// store, and a request of each priority 100ms later gets its algorithm's afterFlood.
func testPriorities(t *testing.T, newStore NewStore, k Kind) {
	clk := clock.NewFake(Start)
	l, err := k.New(newStore(t, clk), PriorityRule, ratelimit.WithReserves(Reserves...))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	at := func(p ratelimit.Priority) context.Context { return ratelimit.WithPriority(ctx, p) }
	for _, c := range []struct {
		p    ratelimit.Priority
		want int
	}{{ratelimit.Sheddable, 50}, {ratelimit.Normal, 30}, {ratelimit.Critical, 20}} {
		admitted := 0
		for range 100 {
			d, err := l.Allow(at(c.p), "key")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != c.want {
			t.Errorf("100 %v requests at t=0 admitted %d; want %d", c.p, admitted, c.want)
		}
	}
	clk.Set(Start.Add(100 * ms))
	for i, p := range []ratelimit.Priority{ratelimit.Sheddable, ratelimit.Normal, ratelimit.Critical} {
		d, err := l.Allow(at(p), "key")
		if err != nil {
			t.Fatal(err)
		}
		if want := afterFlood[k.Name][i]; d != want {
			t.Errorf("a %v request at 100ms:\n got %+v\nwant %+v", p, d, want)
		}
	}

	// A priority past the reserves' end keeps the last; a context without one is
	// Critical; a peek is the take's decision at the peeker's priority.
	l2, _, l2Store := newPrioritized(t, newStore, k)
	for range 50 {
		if d, err := l2.Allow(at(ratelimit.Priority(7)), "k"); err != nil || !d.Allowed {
			t.Fatalf("priority 7, within its half: %+v, %v", d, err)
		}
	}
	if d, err := l2.Allow(at(ratelimit.Priority(7)), "k"); err != nil || d.Allowed {
		t.Errorf("priority 7 past its half: %+v, %v; want denied, as sheddable", d, err)
	}
	peeker, ok := l2.(interface {
		PeekN(context.Context, string, int64) (ratelimit.Decision, error)
	})
	if !ok {
		t.Fatalf("%T has no PeekN", l2)
	}
	if d, err := peeker.PeekN(at(ratelimit.Normal), "k", 1); err != nil || !d.Allowed || d.Remaining != 29 {
		t.Errorf("a normal peek after 50 taken: %+v, %v; want allowed, 29 left above its reserve", d, err)
	}
	if d, err := l2.Allow(ctx, "k"); err != nil || !d.Allowed || d.Remaining != 49 {
		t.Errorf("no priority after 50 taken: %+v, %v; want allowed as critical, 49 left", d, err)
	}

	// AllowAll keeps each part's reserve: with 50 of 100 left on l2's key, a sheddable
	// decision of it and a fresh limit is denied, and takes nothing from either; a
	// critical one is admitted.
	alg := func(l ratelimit.Limiter) *ratelimit.AlgorithmLimiter {
		t.Helper()
		a, ok := l.(*ratelimit.AlgorithmLimiter)
		if !ok {
			t.Fatalf("%T is no AlgorithmLimiter", l)
		}
		return a
	}
	other, err := k.New(newStore(t, clk), PriorityRule)
	if err == nil {
		_, err = ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: alg(l2), Key: "k"}, ratelimit.Part{Limiter: alg(other), Key: "k"})
		if err == nil {
			t.Errorf("AllowAll across two stores: no error")
		}
	}
	mixed, err := k.New(l2Store, PriorityRule, ratelimit.WithNamespace("other"))
	if err != nil {
		t.Fatal(err)
	}
	parts := []ratelimit.Part{{Limiter: alg(l2), Key: "k"}, {Limiter: alg(mixed), Key: "k"}}
	if d, err := ratelimit.AllowAll(at(ratelimit.Sheddable), 1, parts...); err != nil || d.Allowed {
		t.Errorf("AllowAll, sheddable, with 49 left: %+v, %v; want denied", d, err)
	}
	if d, err := ratelimit.AllowAll(at(ratelimit.Critical), 1, parts...); err != nil || !d.Allowed || d.Remaining != 48 {
		t.Errorf("AllowAll, critical, with 49 left: %+v, %v; want allowed, 48 left", d, err)
	}

	// A request larger than its priority may ever take: ErrInvalidN from the limiter,
	// nothing taken (50 is all a sheddable request may take of 100); a store asked
	// directly denies it, taking nothing either.
	large, _, largeStore := newPrioritized(t, newStore, k)
	allowN, ok := large.(interface {
		AllowN(context.Context, string, int64) (ratelimit.Decision, error)
	})
	if !ok {
		t.Fatalf("%T has no AllowN", large)
	}
	for _, n := range []int64{51, 100} {
		if d, err := allowN.AllowN(at(ratelimit.Sheddable), "k", n); !errors.Is(err, ratelimit.ErrInvalidN) || d.Allowed {
			t.Errorf("a sheddable request of %d of 100: %+v, %v; want ErrInvalidN", n, d, err)
		}
	}
	if d, err := largeStore.Apply(ctx, core.Request{Key: "k", N: 100, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(PriorityRule), Reserve: 50}}); err != nil || d.Allowed() {
		t.Errorf("a store asked for 100 of 100 keeping 50%%: %+v, %v; want denied", d, err)
	}
	if d, err := allowN.AllowN(at(ratelimit.Critical), "k", 100); err != nil || !d.Allowed {
		t.Errorf("a critical request of 100 after those: %+v, %v; want allowed, nothing taken before it", d, err)
	}

	// Bad reserves: an error from New; a bad reserve in a Request: an error that
	// consumes nothing.
	for _, bad := range [][]int64{{-1}, {100}, {20, 10}} {
		if _, err := k.New(newStore(t, clk), PriorityRule, ratelimit.WithReserves(bad...)); !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Errorf("WithReserves(%v): %v; want ErrInvalidRule", bad, err)
		}
	}
	store := newStore(t, clk)
	for _, r := range []int64{-1, 100} {
		_, err := store.Apply(ctx, core.Request{Key: "bad", N: 1, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(PriorityRule), Reserve: r}})
		if !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Errorf("a Request with Reserve %d: %v; want ErrInvalidRule", r, err)
		}
	}
	d, err := store.Apply(ctx, core.Request{Key: "bad", N: 1, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(PriorityRule), Op: core.OpPeek}})
	if err != nil || d.Remaining != 99 { // a peek of 1 leaves 99
		t.Errorf("after bad reserves, a peek: %+v, %v; want the key untouched", d, err)
	}
}

func newPrioritized(t *testing.T, newStore NewStore, k Kind) (ratelimit.Limiter, *clock.Fake, ratelimit.Store) {
	t.Helper()
	clk := clock.NewFake(Start)
	store := newStore(t, clk)
	l, err := k.New(store, PriorityRule, ratelimit.WithReserves(Reserves...))
	if err != nil {
		t.Fatal(err)
	}
	return l, clk, store
}

// testInFlightPriorities: 10 leases with reserves 20% and 50% (2 and 5 leases): five
// sheddable, then three normal, then two critical; with one released, a critical request
// takes it and a sheddable one still waits for five to expire.
func testInFlightPriorities(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	l, err := ratelimit.NewInFlight(newStore(t, clk), 10, 30*time.Second, ratelimit.WithReserves(Reserves...))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var held []*ratelimit.Lease
	for _, c := range []struct {
		p    ratelimit.Priority
		want int
	}{{ratelimit.Sheddable, 5}, {ratelimit.Normal, 3}, {ratelimit.Critical, 2}} {
		admitted := 0
		for range 10 {
			lease, _, err := l.Acquire(ratelimit.WithPriority(ctx, c.p), "key")
			if err != nil {
				t.Fatal(err)
			}
			if lease != nil {
				admitted++
				held = append(held, lease)
			}
		}
		if admitted != c.want {
			t.Errorf("10 %v acquires admitted %d; want %d", c.p, admitted, c.want)
		}
	}
	clk.Set(Start.Add(time.Second))
	if err := held[len(held)-1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease, d, err := l.Acquire(ratelimit.WithPriority(ctx, ratelimit.Sheddable), "key")
	// 9 held, 5 kept back: 5 must expire, at 30s
	if want := (ratelimit.Decision{Limit: 10, RetryAfter: 29 * s, ResetAfter: 29 * s}); err != nil || lease != nil || d != want {
		t.Errorf("a sheddable acquire with 9 held: %+v, %v; want %+v", d, err, want)
	}
	lease, d, err = l.Acquire(ratelimit.WithPriority(ctx, ratelimit.Critical), "key")
	if want := (ratelimit.Decision{Allowed: true, Limit: 10, ResetAfter: 30 * s}); err != nil || lease == nil || d != want {
		t.Errorf("a critical acquire with 9 held: %+v, %v; want %+v", d, err, want)
	}
}
