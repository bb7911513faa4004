// Package limitertest is the conformance suite: every scenario, on every algorithm, for
// any Store whose time a fake clock drives. localstore runs it in memory; redisstore runs
// the same suite unchanged against Redis.
package limitertest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// Start is the instant every scenario starts at: midnight UTC, where windows of a
// second, a minute, an hour and a day all begin.
var Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewStore returns a fresh Store whose time is clk.
type NewStore func(t *testing.T, clk *clock.Fake) ratelimit.Store

// Kind is one algorithm: its name, its constructor and its Algorithm.
type Kind struct {
	Name      string
	New       func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (ratelimit.Limiter, error)
	Algorithm *core.Algorithm
}

// Kinds are the five algorithms.
var Kinds = []Kind{
	{"tokenbucket", wrap(tokenbucket.New), tokenbucket.Algorithm()},
	{"leakybucket", wrap(leakybucket.New), leakybucket.Algorithm()},
	{"fixedwindow", wrap(fixedwindow.New), fixedwindow.Algorithm()},
	{"slidingwindow", wrap(slidingwindow.New), slidingwindow.Algorithm()},
	{"slidinglog", wrap(slidinglog.New), slidinglog.Algorithm()},
}

func wrap[L ratelimit.Limiter](f func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (L, error)) func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (ratelimit.Limiter, error) {
	return func(s ratelimit.Store, r ratelimit.Rule, opts ...ratelimit.Option) (ratelimit.Limiter, error) {
		l, err := f(s, r, opts...)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
}

// Run runs the whole suite on stores made by newStore.
func Run(t *testing.T, newStore NewStore) {
	for _, k := range Kinds {
		t.Run(k.Name, func(t *testing.T) {
			for _, sc := range Scenarios[k.Name] {
				t.Run(sc.Name, func(t *testing.T) { runScenario(t, newStore, k, sc) })
			}
			t.Run("bad input", func(t *testing.T) { testBadInput(t, newStore, k) })
			t.Run("keys", func(t *testing.T) { testKeys(t, newStore, k) })
			t.Run("concurrent", func(t *testing.T) { testConcurrent(t, newStore, k) })
			t.Run("clock goes back", func(t *testing.T) { testClockBack(t, newStore, k) })
			t.Run("clock goes back, per key", func(t *testing.T) { testClockBackPerKey(t, newStore, k) })
			t.Run("clock goes back after a refund", func(t *testing.T) { testClockBackAfterRefund(t, newStore, k) })
			t.Run("retry and reset", func(t *testing.T) { testRetryAndReset(t, newStore, k) })
			t.Run("cancelled context", func(t *testing.T) { testCancelled(t, newStore, k) })
			t.Run("peek", func(t *testing.T) { testPeek(t, newStore, k) })
			t.Run("reset and refund", func(t *testing.T) { testResetAndRefund(t, newStore, k) })
			t.Run("parked refunds", func(t *testing.T) { testParkedRefunds(t, newStore, k) })
			t.Run("reset twice", func(t *testing.T) { testResetTwice(t, newStore, k) })
			t.Run("namespaces", func(t *testing.T) { testNamespaces(t, newStore, k) })
			t.Run("rule per call", func(t *testing.T) { testRulePerCall(t, newStore, k) })
			t.Run("priorities", func(t *testing.T) { testPriorities(t, newStore, k) })
		})
	}
	t.Run("algorithms share keys apart", func(t *testing.T) { testAlgorithmsApart(t, newStore) })
	t.Run("several limits at once", func(t *testing.T) { testMulti(t, newStore) })
	t.Run("several limits at once, concurrently", func(t *testing.T) { testMultiConcurrent(t, newStore) })
	t.Run("in flight", func(t *testing.T) { testInFlight(t, newStore) })
	t.Run("in flight, priorities", func(t *testing.T) { testInFlightPriorities(t, newStore) })
	t.Run("calendar quotas", func(t *testing.T) { testQuotas(t, newStore) })
	t.Run("lend", func(t *testing.T) { testLend(t, newStore) })
	t.Run("debit", func(t *testing.T) { testDebit(t, newStore) })
	RunAllowance(t, newStore)
}

func setup(t *testing.T, newStore NewStore, k Kind, rule ratelimit.Rule) (ratelimit.Limiter, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(Start)
	l, err := k.New(newStore(t, clk), rule)
	if err != nil {
		t.Fatalf("New(%v): %v", rule, err)
	}
	return l, clk
}

func runScenario(t *testing.T, newStore NewStore, k Kind, sc Scenario) {
	l, clk := setup(t, newStore, k, sc.Rule)
	for i, st := range sc.Steps {
		clk.Set(Start.Add(st.At))
		got, err := l.AllowN(context.Background(), "key", st.N)
		if err != nil {
			t.Fatalf("step %d (at %v, n %d): %v", i, st.At, st.N, err)
		}
		if got != st.Want {
			t.Errorf("step %d (at %v, n %d):\n got %+v\nwant %+v", i, st.At, st.N, got, st.Want)
		}
	}
}

// InvalidRules are rejected by every algorithm.
var InvalidRules = []ratelimit.Rule{
	{},
	{Limit: 0, Period: time.Second},
	{Limit: -1, Period: time.Second},
	{Limit: math.MinInt64, Period: time.Second},
	{Limit: math.MaxInt64, Period: time.Second},
	{Limit: mathx.MaxExact + 1, Period: time.Second},
	{Limit: 1, Period: 0},
	{Limit: 1, Period: -time.Second},
	{Limit: 1, Period: math.MinInt64},
	{Limit: 1, Period: math.MaxInt64},
	{Limit: 1, Period: 999 * time.Microsecond},
	{Limit: 1, Period: time.Second + 1},
	{Limit: 1, Period: time.Second, Burst: -1},
	{Limit: 1, Period: time.Second, Burst: math.MinInt64},
	{Limit: 1, Period: time.Second, Burst: math.MaxInt64},
}

func testBadInput(t *testing.T, newStore NewStore, k Kind) {
	clk := clock.NewFake(Start)
	store := newStore(t, clk)
	for _, r := range InvalidRules {
		if l, err := k.New(store, r); !errors.Is(err, ratelimit.ErrInvalidRule) || l != nil {
			t.Errorf("New(%+v) = %v, %v; want nil, ErrInvalidRule", r, l, err)
		}
	}
	if _, err := k.New(nil, ratelimit.PerSecond(1)); err == nil {
		t.Error("New(nil store) did not fail")
	}

	rule := ratelimit.PerMinute(5)
	l, err := k.New(store, rule)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		n    int64
		want error
	}{
		{0, ratelimit.ErrInvalidN},
		{-1, ratelimit.ErrInvalidN},
		{math.MinInt64, ratelimit.ErrInvalidN},
		{6, ratelimit.ErrInvalidN},
		{math.MaxInt64 - 1, ratelimit.ErrInvalidN},
		{math.MaxInt64, ratelimit.ErrInvalidN},
	} {
		if d, err := l.AllowN(ctx, "k", tc.n); !errors.Is(err, tc.want) || d != (ratelimit.Decision{}) {
			t.Errorf("AllowN(%d) = %+v, %v; want a zero Decision and %v", tc.n, d, err, tc.want)
		}
		// the store refuses the same request sent to it directly
		req := core.Request{Key: "k", N: tc.n, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(rule)}}
		if _, err := store.Apply(ctx, req); !errors.Is(err, tc.want) {
			t.Errorf("Apply(n=%d) = %v; want %v", tc.n, err, tc.want)
		}
	}
	for _, r := range InvalidRules {
		req := core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(r)}}
		if _, err := store.Apply(ctx, req); !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Errorf("Apply(rule %+v) = %v; want ErrInvalidRule", r, err)
		}
	}
	if _, err := store.Apply(ctx, core.Request{Key: "k", N: 1, Spec: &core.Spec{Rule: core.Rule(rule)}}); err == nil {
		t.Error("Apply without an algorithm did not fail")
	}
	// nothing was consumed by any of it
	if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Errorf("after bad input, Allow = %+v, %v; want allowed with 4 remaining", d, err)
	}
}

// Keys are strings that must all be distinct keys in every store.
var Keys = []string{
	"", "a", "{a}", "a}", "{a", "{}", "}", "{", "a:b", "a:b:c", "{a}:b", "a\x00", "\x00",
	"\xff\xfe", "ключ", strings.Repeat("k", 1<<20), strings.Repeat("k", 1<<20) + "x",
}

func testKeys(t *testing.T, newStore NewStore, k Kind) {
	rule := ratelimit.PerHour(int64(len(Keys)))
	l, _ := setup(t, newStore, k, rule)
	ctx := context.Background()
	// the i-th key takes i events: if two keys shared state, a count would be off
	for i, key := range Keys {
		if i == 0 {
			continue
		}
		if d, err := l.AllowN(ctx, key, int64(i)); err != nil || !d.Allowed {
			t.Fatalf("AllowN(key %d, %d) = %+v, %v", i, i, d, err)
		}
	}
	for i, key := range Keys {
		d, err := l.Allow(ctx, key)
		if want := rule.Limit - int64(i) - 1; err != nil || !d.Allowed || d.Remaining != want {
			t.Errorf("key %d (%.20q): Allow = %+v, %v; want allowed with %d remaining", i, key, d, err, want)
		}
	}
}

func testAlgorithmsApart(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	store := newStore(t, clk)
	ctx := context.Background()
	for _, k := range Kinds {
		l, err := k.New(store, ratelimit.PerHour(3))
		if err != nil {
			t.Fatal(err)
		}
		if d, err := l.AllowN(ctx, "shared", 3); err != nil || !d.Allowed {
			t.Errorf("%s: AllowN(3) on a key the other algorithms used = %+v, %v", k.Name, d, err)
		}
	}
}

// testConcurrent: 1000 goroutines on one key admit exactly the capacity (the fake clock
// stands still, so nothing refills).
func testConcurrent(t *testing.T, newStore NewStore, k Kind) {
	const goroutines = 1000
	rule := ratelimit.PerHour(100)
	l, _ := setup(t, newStore, k, rule)
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for range goroutines {
		wg.Go(func() {
			d, err := l.Allow(context.Background(), "hot")
			switch {
			case err != nil:
				errs <- err
			case d.Allowed:
				admitted.Add(1)
			default:
				denied.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if admitted.Load() != rule.Limit || denied.Load() != goroutines-rule.Limit {
		t.Errorf("admitted %d, denied %d; want %d and %d", admitted.Load(), denied.Load(), rule.Limit, goroutines-rule.Limit)
	}
}

// testClockBack: a clock that goes back never creates allowance. Within a period, the
// key keeps the latest instant it has seen and the caller waits at least as long as it
// would have; stepped back further (forward an hour and back, as NTP or a resumed
// virtual machine do), the key's time restarts from now with what it holds, so it waits
// as the rule has it (at most two periods, the sliding window counter's longest wait),
// never for the step.
func testClockBack(t *testing.T, newStore NewStore, k Kind) {
	rule := ratelimit.PerMinute(10)
	l, clk := setup(t, newStore, k, rule)
	ctx := context.Background()
	clk.Set(Start.Add(time.Hour + 30*time.Second))
	if d, err := l.AllowN(ctx, "k", 10); err != nil || !d.Allowed {
		t.Fatalf("AllowN(10) = %+v, %v", d, err)
	}
	ahead, err := l.Allow(ctx, "k")
	if err != nil || ahead.Allowed {
		t.Fatalf("Allow on a used-up key = %+v, %v", ahead, err)
	}
	for _, back := range []time.Duration{time.Millisecond, 30 * time.Second} {
		clk.Set(Start.Add(time.Hour + 30*time.Second - back))
		d, err := l.Allow(ctx, "k")
		if err != nil || d.Allowed || d.Remaining != 0 || d.RetryAfter < ahead.RetryAfter {
			t.Errorf("clock %v back: Allow = %+v, %v; want denied, retry after at least %v", back, d, err, ahead.RetryAfter)
		}
	}
	for _, back := range []time.Duration{time.Hour, 100 * 24 * time.Hour} {
		key := fmt.Sprint("step-", back)
		clk.Set(Start.Add(time.Hour + 30*time.Second))
		if d, err := l.AllowN(ctx, key, 10); err != nil || !d.Allowed {
			t.Fatalf("AllowN(10) = %+v, %v", d, err)
		}
		clk.Set(Start.Add(time.Hour + 30*time.Second - back))
		d, err := l.Allow(ctx, key)
		if err != nil || d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.RetryAfter > 2*rule.Period {
			t.Fatalf("clock %v back: Allow = %+v, %v; want denied, retry after at most %v", back, d, err, 2*rule.Period)
		}
		clk.Advance(d.RetryAfter)
		if again, err := l.Allow(ctx, key); err != nil || !again.Allowed {
			t.Errorf("clock %v back, then RetryAfter %v later: %+v, %v; want allowed", back, d.RetryAfter, again, err)
		}
		if d, err := l.AllowN(ctx, key, 10); err != nil || d.Allowed {
			t.Errorf("clock %v back: 10 more at once: %+v, %v; want denied, no allowance created", back, d, err)
		}
	}
}

// testClockBackAfterRefund: a key emptied by a refund keeps its latest instant, as any
// key it holds: 1 a minute, taken and refunded at 1:00, then asked at 0:59 and again at
// 1:00 admits one, as a clock that stands still would (0:59 decides as at 1:00).
func testClockBackAfterRefund(t *testing.T, newStore NewStore, k Kind) {
	clk := clock.NewFake(Start.Add(time.Minute))
	l, _ := setupOpsOn(t, newStore(t, clk), k, ratelimit.PerMinute(1))
	ctx := context.Background()
	c, d, err := l.Charge(ctx, "k", 1)
	if err != nil || c == nil {
		t.Fatalf("Charge(1) = %+v, %v", d, err)
	}
	if _, err := c.Settle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for _, at := range []time.Duration{59 * time.Second, time.Minute} {
		clk.Set(Start.Add(at))
		if d, err := l.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		} else if d.Allowed {
			admitted++
		}
	}
	if admitted != 1 {
		t.Errorf("after a refund, at 0:59 and 1:00: %d admitted; want 1, as at 1:00 alone", admitted)
	}
}

// testClockBackPerKey: with the clock stepped back, each key keeps its own latest
// instant, and durations count from the caller's clock: a denial's RetryAfter is how long
// the caller must wait on its own clock, and a key never seen decides as on a fresh store,
// whatever instants the other keys saw.
func testClockBackPerKey(t *testing.T, newStore NewStore, k Kind) {
	rule := ratelimit.PerMinute(2)
	ctx := context.Background()
	l, clk := setup(t, newStore, k, rule)
	keys := make([]string, 512) // enough to touch every shard of an in-memory store
	for i := range keys {
		keys[i] = fmt.Sprintf("seen-%d", i)
	}
	clk.Set(Start.Add(90 * time.Second))
	for _, key := range keys {
		if d, err := l.Allow(ctx, key); err != nil || !d.Allowed {
			t.Fatalf("Allow(%q) at +90s = %+v, %v", key, d, err)
		}
	}
	if d, err := l.AllowN(ctx, "k", 2); err != nil || !d.Allowed {
		t.Fatalf("AllowN(2) at +90s = %+v, %v", d, err)
	}
	clk.Set(Start.Add(30 * time.Second))
	d, err := l.Allow(ctx, "k")
	if err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("Allow on a used-up key, clock 60s back = %+v, %v; want denied", d, err)
	}
	clk.Advance(d.RetryAfter)
	if again, err := l.Allow(ctx, "k"); err != nil || !again.Allowed {
		t.Errorf("Allow after waiting RetryAfter %v on the caller's clock = %+v, %v; want allowed", d.RetryAfter, again, err)
	}

	at := Start.Add(30 * time.Second)
	clk.Set(at)
	fresh, freshClk := setup(t, newStore, k, rule)
	freshClk.Set(at)
	for i := range 64 {
		key := fmt.Sprintf("new-%d", i)
		got, err := l.Allow(ctx, key)
		want, err2 := fresh.Allow(ctx, key)
		if err != nil || err2 != nil || got != want {
			t.Fatalf("Allow(%q), never seen, at +30s beside keys seen at +90s = %+v, %v; on a fresh store %+v, %v",
				key, got, err, want, err2)
		}
	}
}

// testRetryAndReset: waiting RetryAfter is enough, and after ResetAfter the key is full.
func testRetryAndReset(t *testing.T, newStore NewStore, k Kind) {
	rule := ratelimit.Rule{Limit: 7, Period: 3 * time.Second}
	l, clk := setup(t, newStore, k, rule)
	ctx := context.Background()
	clk.Set(Start.Add(1234567 * time.Microsecond))
	for i := 0; i < 7; i++ {
		if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("Allow %d = %+v, %v", i, d, err)
		}
		clk.Advance(100 * time.Millisecond)
	}
	d, err := l.AllowN(ctx, "k", 2)
	if err != nil || d.Allowed || d.RetryAfter <= 0 || d.ResetAfter <= 0 {
		t.Fatalf("AllowN(2) on a used-up key = %+v, %v", d, err)
	}
	clk.Advance(d.RetryAfter)
	if d, err := l.AllowN(ctx, "k", 2); err != nil || !d.Allowed {
		t.Fatalf("AllowN(2) after RetryAfter = %+v, %v", d, err)
	}
	d, err = l.AllowN(ctx, "other", 7)
	if err != nil || !d.Allowed {
		t.Fatalf("AllowN(7) on another key = %+v, %v", d, err)
	}
	clk.Advance(d.ResetAfter)
	if full, err := l.Allow(ctx, "other"); err != nil || !full.Allowed || full.Remaining != 6 {
		t.Errorf("Allow %v after ResetAfter = %+v, %v; want a full key", d.ResetAfter, full, err)
	}
}

func testCancelled(t *testing.T, newStore NewStore, k Kind) {
	l, _ := setup(t, newStore, k, ratelimit.PerSecond(1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Allow(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Allow with a cancelled context = %v; want context.Canceled", err)
	}
	if d, err := l.Allow(context.Background(), "k"); err != nil || !d.Allowed {
		t.Errorf("Allow after a cancelled call = %+v, %v; want allowed", d, err)
	}
}

// decisionOf is the Decision a limiter makes of o.
func decisionOf(o core.Outcome) ratelimit.Decision {
	var d ratelimit.Decision
	d.Allowed, d.Limit, d.Remaining, d.Delay, d.RetryAfter, d.ResetAfter = o.Split()
	return d
}
