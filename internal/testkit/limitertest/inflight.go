package limitertest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// testInFlight runs the in-flight limit's cases on a store.
func testInFlight(t *testing.T, newStore NewStore) {
	t.Run("decisions", func(t *testing.T) { testInFlightDecisions(t, newStore) })
	t.Run("concurrent", func(t *testing.T) { testInFlightConcurrent(t, newStore) })
	t.Run("limit per call", func(t *testing.T) { testInFlightLimitPerCall(t, newStore) })
	t.Run("bad input", func(t *testing.T) { testInFlightBadInput(t, newStore) })
	t.Run("keys apart", func(t *testing.T) { testInFlightKeys(t, newStore) })
	t.Run("clock stepped back", func(t *testing.T) { testInFlightClockBack(t, newStore) })
	t.Run("released before acquired", func(t *testing.T) { testInFlightReleasedFirst(t, newStore) })
}

// testInFlightClockBack: leases taken an hour ahead, the clock stepped back an hour: no
// lease outlives its duration from now (30s), so the limit admits again then, not an hour
// later.
func testInFlightClockBack(t *testing.T, newStore NewStore) {
	l, clk := newInFlight(t, newStore, 2, 30*time.Second)
	ctx := context.Background()
	clk.Set(Start.Add(time.Hour))
	for range 2 {
		if _, d, err := l.Acquire(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("an acquire an hour ahead: %+v, %v", d, err)
		}
	}
	clk.Set(Start)
	_, d, err := l.Acquire(ctx, "k")
	if err != nil || d.Allowed || d.RetryAfter != 30*time.Second || d.ResetAfter != 30*time.Second {
		t.Fatalf("the clock an hour back: %+v, %v; want denied until the leases' 30s from now", d, err)
	}
	clk.Advance(30 * time.Second)
	if _, d, err := l.Acquire(ctx, "k"); err != nil || !d.Allowed {
		t.Errorf("30s later: %+v, %v; want admitted", d, err)
	}
}

func newInFlight(t *testing.T, newStore NewStore, limit int64, lease time.Duration, opts ...ratelimit.Option) (*ratelimit.InFlightLimiter, *clock.Fake) {
	l, clk, _ := newInFlightOn(t, newStore, limit, lease, opts...)
	return l, clk
}

func newInFlightOn(t *testing.T, newStore NewStore, limit int64, lease time.Duration, opts ...ratelimit.Option) (*ratelimit.InFlightLimiter, *clock.Fake, ratelimit.Store) {
	t.Helper()
	clk := clock.NewFake(Start)
	store := newStore(t, clk)
	l, err := ratelimit.NewInFlight(store, limit, lease, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l, clk, store
}

// inFlight is a test's view of an InFlightLimiter: every call must succeed. It peeks and
// resets through its store, in namespace ns.
type inFlight struct {
	t     *testing.T
	l     *ratelimit.InFlightLimiter
	clk   *clock.Fake
	store ratelimit.Store
	ns    string
}

// apply is a request of op for key's leases, straight to the store.
func (f inFlight) apply(key string, op core.Op) (ratelimit.Decision, error) {
	o, err := f.store.Apply(context.Background(), core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: concurrency.Algorithm(), Namespace: f.ns, Rule: core.Rule(f.l.Rule()), Op: op}})
	return decisionOf(o), err
}

func (f inFlight) at(d time.Duration) { f.clk.Set(Start.Add(d)) }

func (f inFlight) acquire(key string, want ratelimit.Decision) *ratelimit.Lease {
	f.t.Helper()
	lease, d, err := f.l.Acquire(context.Background(), key)
	if err != nil {
		f.t.Fatal(err)
	}
	if d != want {
		f.t.Errorf("Acquire(%q) at %v:\n got %+v\nwant %+v", key, f.clk.Now().Sub(Start), d, want)
	}
	if (lease != nil) != d.Allowed {
		f.t.Errorf("Acquire(%q): lease %v with Allowed %v", key, lease, d.Allowed)
	}
	return lease
}

func (f inFlight) peek(key string, want ratelimit.Decision) {
	f.t.Helper()
	d, err := f.apply(key, core.OpPeek)
	if err != nil {
		f.t.Fatal(err)
	}
	if d != want {
		f.t.Errorf("Peek(%q) at %v:\n got %+v\nwant %+v", key, f.clk.Now().Sub(Start), d, want)
	}
}

func (f inFlight) release(x *ratelimit.Lease) {
	f.t.Helper()
	if err := x.Release(context.Background()); err != nil {
		f.t.Fatal(err)
	}
}

func (f inFlight) extend(x *ratelimit.Lease, want bool) {
	f.t.Helper()
	held, err := x.Extend(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	if held != want {
		f.t.Errorf("Extend at %v: held %v, want %v", f.clk.Now().Sub(Start), held, want)
	}
}

// testInFlightDecisions: every Decision of a limit of 3 leases of 10s, exactly, through
// acquires, releases (twice, and after expiry), expiry, extensions and a reset.
func testInFlightDecisions(t *testing.T, newStore NewStore) {
	l, clk, store := newInFlightOn(t, newStore, 3, 10*time.Second, ratelimit.WithNamespace("leases"))
	f := inFlight{t, l, clk, store, "leases"}
	const s = time.Second
	ok := func(remaining int64, reset time.Duration) ratelimit.Decision {
		return allowed(3, remaining, reset)
	}
	full := func(retry, reset time.Duration) ratelimit.Decision { return denied(3, 0, retry, reset) }

	f.peek("k", ok(2, 10*s)) // a fresh key: a lease would be the first of 3
	a := f.acquire("k", ok(2, 10*s))
	f.at(1 * s)
	b := f.acquire("k", ok(1, 10*s))
	f.at(2 * s)
	c := f.acquire("k", ok(0, 10*s))
	f.at(3 * s)
	f.acquire("k", full(7*s, 9*s)) // a expires at 10s, c at 12s
	f.peek("k", full(7*s, 9*s))

	f.release(b) // b's place is free at once
	f.peek("k", ok(0, 10*s))
	e := f.acquire("k", ok(0, 10*s)) // expires at 13s
	f.release(b)                     // twice: changes nothing
	f.acquire("k", full(7*s, 10*s))

	f.at(10 * s) // a, never released, has expired
	f.release(a) // after its expiry: changes nothing, frees no one else's
	f.extend(a, false)
	g := f.acquire("k", ok(0, 10*s)) // a's place; expires at 20s
	f.acquire("k", full(2*s, 10*s))

	f.at(11 * s)
	f.extend(c, true) // c: 12s -> 21s
	f.at(12*s + 500*time.Millisecond)
	f.acquire("k", full(500*time.Millisecond, 8500*time.Millisecond)) // c still held; e expires at 13s
	f.at(13 * s)
	f.acquire("k", ok(0, 10*s)) // e's place

	if _, err := f.apply("k", core.OpReset); err != nil {
		t.Fatal(err)
	}
	f.extend(c, false) // reset: every lease gone
	f.extend(g, false)
	f.release(g)
	f.acquire("k", ok(2, 10*s))
	f.release(e)
	f.release(nil) // a denied Acquire's lease
	f.release(&ratelimit.Lease{})
	f.extend(&ratelimit.Lease{}, false)
	if held, err := (*ratelimit.Lease)(nil).Extend(context.Background()); held || err != nil {
		t.Errorf("nil lease: Extend = %v, %v", held, err)
	}
}

// testInFlightConcurrent: 1000 concurrent acquires of 50 leases admit exactly 50; then
// each release lets exactly one of many concurrent acquires in.
func testInFlightConcurrent(t *testing.T, newStore NewStore) {
	const limit, goroutines = 50, 1000
	l, _ := newInFlight(t, newStore, limit, time.Hour)
	acquireAll := func(n int) []*ratelimit.Lease {
		var mu sync.Mutex
		var got []*ratelimit.Lease
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				lease, _, err := l.Acquire(context.Background(), "hot")
				if err != nil {
					t.Error(err)
				}
				if lease != nil {
					mu.Lock()
					got = append(got, lease)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return got
	}
	held := acquireAll(goroutines)
	if len(held) != limit {
		t.Fatalf("%d concurrent acquires of %d leases admitted %d", goroutines, limit, len(held))
	}
	for i := range 5 {
		if err := held[i].Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := acquireAll(50); len(got) != 1 {
			t.Fatalf("after release %d, 50 concurrent acquires admitted %d; want 1", i, len(got))
		}
	}
}

// testInFlightLimitPerCall: AcquireLimit counts the same leases under another limit.
func testInFlightLimitPerCall(t *testing.T, newStore NewStore) {
	l, clk := newInFlight(t, newStore, 3, 10*time.Second)
	f := inFlight{t: t, l: l, clk: clk}
	f.acquire("k", allowed(3, 2, 10*time.Second))
	f.acquire("k", allowed(3, 1, 10*time.Second))
	lease, d, err := l.AcquireLimit(context.Background(), "k", 2)
	if err != nil || lease != nil || d != denied(2, 0, 10*time.Second, 10*time.Second) {
		t.Errorf("AcquireLimit(2) with 2 held = %v, %+v, %v; want denied", lease, d, err)
	}
	lease, d, err = l.AcquireLimit(context.Background(), "k", 5)
	if err != nil || lease == nil || d != allowed(5, 2, 10*time.Second) {
		t.Errorf("AcquireLimit(5) with 2 held = %v, %+v, %v; want allowed, 2 left", lease, d, err)
	}
	if _, _, err := l.AcquireLimit(context.Background(), "k", 0); !errors.Is(err, ratelimit.ErrInvalidRule) {
		t.Errorf("AcquireLimit(0): %v, want ErrInvalidRule", err)
	}
}

// testInFlightBadInput: invalid limits and leases, an extension asked of a rate
// algorithm, a batch of leases: errors, and nothing counted.
func testInFlightBadInput(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	store := newStore(t, clk)
	for _, c := range []struct {
		limit int64
		lease time.Duration
	}{{0, time.Second}, {-1, time.Second}, {1, 0}, {1, -time.Second}, {1, time.Microsecond}, {1, time.Second + 1}} {
		if _, err := ratelimit.NewInFlight(store, c.limit, c.lease); !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Errorf("NewInFlight(%d, %v): %v, want ErrInvalidRule", c.limit, c.lease, err)
		}
	}
	if _, err := ratelimit.NewInFlight(nil, 1, time.Second); err == nil {
		t.Error("NewInFlight(nil store): no error")
	}
	alg := concurrency.Algorithm()
	for _, n := range []int64{0, -1, 2} {
		_, err := store.Apply(context.Background(), core.Request{Key: "k", N: n, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule{Limit: 5, Period: time.Second}, Lease: 1}})
		if !errors.Is(err, ratelimit.ErrInvalidN) {
			t.Errorf("a lease of n = %d: %v, want ErrInvalidN", n, err)
		}
	}
	for _, k := range Kinds { // an "extend" of a rate algorithm: an error, and nothing taken
		rule := ratelimit.PerHour(1)
		_, err := store.Apply(context.Background(), core.Request{Key: "x", N: 1, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(rule), Op: core.OpExtend}})
		if err == nil {
			t.Errorf("%s: extend: no error", k.Name)
		}
		d, err := store.Apply(context.Background(), core.Request{Key: "x", N: 1, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(rule)}})
		if err != nil || !d.Allowed() {
			t.Errorf("%s: a take after a refused extend = %+v, %v; want allowed", k.Name, d, err)
		}
	}
	if bs, ok := store.(core.BatchStore); ok {
		_, err := bs.ApplyAll(context.Background(), []core.Request{{Key: "k", N: 1,
			Spec: &core.Spec{Algorithm: alg, Rule: core.Rule{Limit: 5, Period: time.Second}, Lease: 1}}})
		if err == nil {
			t.Error("ApplyAll of a lease: no error")
		}
	}
	l, err := ratelimit.NewInFlight(store, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if lease, d, err := l.Acquire(context.Background(), "k"); err != nil || lease == nil {
		t.Errorf("after bad input, Acquire = %v, %+v, %v; want a lease", lease, d, err)
	}
}

// testInFlightKeys: keys, namespaces and limiters of other algorithms keep their leases
// apart.
func testInFlightKeys(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	store := newStore(t, clk)
	one := func(opts ...ratelimit.Option) *ratelimit.InFlightLimiter {
		l, err := ratelimit.NewInFlight(store, 1, time.Minute, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b, c := one(), one(ratelimit.WithNamespace("b")), one()
	for _, key := range []string{"", "k", "{k}", "k:1"} {
		if lease, _, err := a.Acquire(context.Background(), key); err != nil || lease == nil {
			t.Errorf("a: Acquire(%q) = %v, %v; want a lease", key, lease, err)
		}
		if lease, _, err := b.Acquire(context.Background(), key); err != nil || lease == nil {
			t.Errorf("b (its own namespace): Acquire(%q) = %v, %v; want a lease", key, lease, err)
		}
		if lease, _, err := c.Acquire(context.Background(), key); err != nil || lease != nil {
			t.Errorf("c (a's namespace): Acquire(%q) = %v, %v; want denied", key, lease, err)
		}
	}
	for _, k := range Kinds { // a rate limiter on the same key and namespace counts apart
		rl, err := k.New(store, ratelimit.PerMinute(1), ratelimit.WithNamespace("1/1m0s"))
		if err != nil {
			t.Fatal(err)
		}
		if d, err := rl.Allow(context.Background(), "k"); err != nil || !d.Allowed {
			t.Errorf("%s beside leases: %+v, %v; want allowed", k.Name, d, err)
		}
	}
}

// testInFlightReleasedFirst: the release of an acquire whose caller gave up can reach the
// store before the acquire (a stalled Redis runs the commands of two connections in any
// order): the acquire that runs after it takes nothing, for a lease duration (limit 2,
// leases of 10s: released at 0s, twice, the acquire at 1s is denied until 10s, and the
// key keeps both its leases for others). Another lease acquired meanwhile is held as
// ever, and once the release is forgotten the lease's id is a lease's like any other.
func testInFlightReleasedFirst(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	store := newStore(t, clk)
	ctx := context.Background()
	apply := func(op core.Op, lease int64) ratelimit.Decision {
		t.Helper()
		sp := &core.Spec{Algorithm: concurrency.Algorithm(), Namespace: "first",
			Rule: core.Rule{Limit: 2, Period: 10 * time.Second}, Lease: lease, Op: op}
		o, err := store.Apply(ctx, core.Request{Key: "k", N: 1, Spec: sp})
		if err != nil {
			t.Fatalf("%q of %d: %v", op, lease, err)
		}
		return decisionOf(o)
	}
	apply(core.OpRefund, 77) // the release, first
	apply(core.OpRefund, 77) // and again, as the orphans' releaser may
	clk.Advance(time.Second)
	if d := apply(core.OpTake, 77); d.Allowed || d.RetryAfter != 9*time.Second {
		t.Errorf("an acquire after its release: %+v; want denied for 9s, until the release is forgotten", d)
	}
	if d := apply(core.OpPeek, 0); !d.Allowed || d.Remaining != 1 {
		t.Errorf("the key after a late acquire: %+v; want both leases free (1 left after a peek's)", d)
	}
	if d := apply(core.OpTake, 78); !d.Allowed || d.Remaining != 1 {
		t.Errorf("another acquire: %+v; want a lease, 1 left", d)
	}
	clk.Advance(9 * time.Second)
	if d := apply(core.OpTake, 77); !d.Allowed || d.Remaining != 0 {
		t.Errorf("an acquire of the lease once its release is forgotten: %+v; want it held, beside the other", d)
	}
}
