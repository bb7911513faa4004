package limitertest

import (
	"context"
	"errors"
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

// testDebit is the contract of a debit: a cost charged after the answer, however far
// past what the key has left, on every algorithm that takes debts.
func testDebit(t *testing.T, newStore NewStore) {
	t.Run("token bucket", func(t *testing.T) { testDebitBucket(t, newStore) })
	t.Run("token bucket, reserves", func(t *testing.T) { testDebitReserves(t, newStore) })
	t.Run("windows", func(t *testing.T) { testDebitWindows(t, newStore) })
	t.Run("calendar quota", func(t *testing.T) { testDebitQuota(t, newStore) })
	t.Run("no debts", func(t *testing.T) { testNoDebts(t, newStore) })
	t.Run("with a receipt", func(t *testing.T) { testDebitReceipt(t, newStore) })
}

// testDebitReceipt: a debit with a Receipt not yet written is a take whatever the key has
// left, that writes its receipt: a refund of it later gives its events back as a take's
// would (on a window of 10 a minute, a debit of 15 then refunded leaves the window
// empty; on a bucket of 10, full again).
func testDebitReceipt(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	for _, k := range Kinds {
		if k.Algorithm.Debit == nil {
			continue
		}
		clk := clock.NewFake(Start)
		store := newStore(t, clk)
		spec := &core.Spec{Algorithm: k.Algorithm, Namespace: "debit-receipt", Rule: core.Rule(ratelimit.PerMinute(10))}
		receipt := &core.Receipt{}
		debit := *spec
		debit.Op = core.OpDebit
		if _, err := store.Apply(ctx, core.Request{Key: "k", N: 15, Spec: &debit, Receipt: receipt}); err != nil {
			t.Fatalf("%s: a debit of 15 with a receipt: %v", k.Name, err)
		}
		if receipt.At <= 0 {
			t.Fatalf("%s: a debit with a receipt wrote none: %+v", k.Name, receipt)
		}
		clk.Advance(time.Second)
		refund := *spec
		refund.Op = core.OpRefund
		if _, err := store.Apply(ctx, core.Request{Key: "k", N: 10, Spec: &refund, Receipt: receipt}); err != nil {
			t.Fatalf("%s: its refund: %v", k.Name, err)
		}
		refund5 := refund
		if _, err := store.Apply(ctx, core.Request{Key: "k", N: 5, Spec: &refund5, Receipt: receipt}); err != nil {
			t.Fatalf("%s: its refund: %v", k.Name, err)
		}
		o, err := store.Apply(ctx, core.Request{Key: "k", N: 10, Spec: spec})
		if err != nil || !o.Allowed() {
			t.Errorf("%s: a take of 10 after a debit of 15 with a receipt, refunded: %+v, %v; want the key full", k.Name, o, err)
		}
	}
}

func wantDecision(t *testing.T, what string, got ratelimit.Decision, err error, want ratelimit.Decision) {
	t.Helper()
	if err != nil || got != want {
		t.Errorf("%s:\n got %+v, %v\nwant %+v", what, got, err, want)
	}
}

// testDebitBucket: 10 a second; a debit of 25 on a full bucket leaves it 15 below empty,
// and a request of 1 waits until it has earned 16.
func testDebitBucket(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	l, err := tokenbucket.New(newStore(t, clk), ratelimit.PerSecond(10), ratelimit.WithNamespace("debit"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := l.Debit(ctx, "k", 25)
	wantDecision(t, "a debit of 25", d, err, ratelimit.Decision{Limit: 10, RetryAfter: 1600 * time.Millisecond, ResetAfter: 2500 * time.Millisecond})
	clk.Advance(1599 * time.Millisecond)
	d, err = l.Allow(ctx, "k")
	wantDecision(t, "1.599s later", d, err, ratelimit.Decision{Limit: 10, RetryAfter: time.Millisecond, ResetAfter: 901 * time.Millisecond})
	clk.Advance(time.Millisecond)
	d, err = l.Allow(ctx, "k")
	wantDecision(t, "1.6s later", d, err, ratelimit.Decision{Allowed: true, Limit: 10, ResetAfter: time.Second})
	d, err = l.Debit(ctx, "k", mathx.MaxExact)
	if err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Errorf("the deepest debit: %+v, %v; want a denial", d, err)
	}
	if _, err := l.Debit(ctx, "k", mathx.MaxExact+1); !errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("a debit past the deepest: %v; want ErrInvalidN", err)
	}
	if _, err := l.Debit(ctx, "k", 0); !errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("a debit of 0: %v; want ErrInvalidN", err)
	}
}

// testDebitReserves: a debit of a normal request, which must leave half of 10 to critical
// ones, says when it ate into that half.
func testDebitReserves(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	l, err := tokenbucket.New(newStore(t, clk), ratelimit.PerSecond(10), ratelimit.WithNamespace("debit"),
		ratelimit.WithReserves(0, 50))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ratelimit.WithPriority(context.Background(), ratelimit.Normal)
	d, err := l.Debit(ctx, "k", 3)
	wantDecision(t, "a debit of 3", d, err, ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 1, ResetAfter: 400 * time.Millisecond})
	d, err = l.Debit(ctx, "k", 5)
	wantDecision(t, "5 more, into the reserve", d, err, ratelimit.Decision{Limit: 10, RetryAfter: 400 * time.Millisecond, ResetAfter: 800 * time.Millisecond})
	d, err = l.Allow(context.Background(), "k") // critical
	wantDecision(t, "a critical request", d, err, ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 1, ResetAfter: 900 * time.Millisecond})
}

// testDebitWindows: a window counts a debit past its limit, and denies until it ends (the
// fixed window) or until the estimate has room (the sliding window counter, which counts
// no more than its limit).
func testDebitWindows(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start.Add(10 * time.Second))
	store := newStore(t, clk)
	ctx := context.Background()
	fw, err := fixedwindow.New(store, ratelimit.PerMinute(10), ratelimit.WithNamespace("debit"))
	if err != nil {
		t.Fatal(err)
	}
	fw.AllowN(ctx, "k", 2)
	d, err := fw.Debit(ctx, "k", 20)
	wantDecision(t, "fixed window: 2, then a debit of 20", d, err, ratelimit.Decision{Limit: 10, RetryAfter: 50 * time.Second, ResetAfter: 50 * time.Second})
	sw, err := slidingwindow.New(store, ratelimit.PerMinute(10), ratelimit.WithNamespace("debit"))
	if err != nil {
		t.Fatal(err)
	}
	clk.Set(Start.Add(30 * time.Second))
	d, err = sw.Debit(ctx, "k", 30)
	wantDecision(t, "sliding window: a debit of 30 at 0:30", d, err, ratelimit.Decision{Limit: 10, RetryAfter: 36 * time.Second, ResetAfter: 90 * time.Second})
	clk.Set(Start.Add(time.Minute))
	d, err = fw.Allow(ctx, "k")
	wantDecision(t, "fixed window, the next window", d, err, ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Minute})
}

// testDebitQuota: a calendar quota counts a debit past its limit until its window ends.
func testDebitQuota(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC))
	q, err := fixedwindow.NewQuota(newStore(t, clk), fixedwindow.Quota{Limit: 3, Per: fixedwindow.Month, In: time.UTC})
	if err != nil {
		t.Fatal(err)
	}
	d, err := q.Debit(context.Background(), "k", 5)
	wantDecision(t, "3 a month, a debit of 5 an hour before it ends", d, err, ratelimit.Decision{Limit: 3, RetryAfter: time.Hour, ResetAfter: time.Hour})
}

// testNoDebts: the algorithms that take no debts refuse one, before the store is asked;
// and a store refuses a debit request of one.
func testNoDebts(t *testing.T, newStore NewStore) {
	store := newStore(t, clock.NewFake(Start))
	lb, _ := leakybucket.New(store, ratelimit.PerSecond(10), ratelimit.WithNamespace("debit"))
	sl, _ := slidinglog.New(store, ratelimit.PerSecond(10), ratelimit.WithNamespace("debit"))
	for _, l := range []*ratelimit.AlgorithmLimiter{lb, sl} {
		if _, err := l.Debit(context.Background(), "k", 1); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("a debit of the %s: %v; want errors.ErrUnsupported", l.Rule(), err)
		}
	}
	req := core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: leakybucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10)), Op: core.OpDebit}}
	if _, err := store.Apply(context.Background(), req); err == nil {
		t.Error("the store took a debit of the leaky bucket")
	}
}
