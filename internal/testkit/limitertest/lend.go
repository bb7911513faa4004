package limitertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// testLend is the contract of a core.Lender, on stores that are one.
func testLend(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	lender, ok := newStore(t, clk).(core.Lender)
	if !ok {
		t.Skip("the store does not lend")
	}
	t.Run("partial takes", func(t *testing.T) { testAllowAtMost(t, newStore) })
	t.Run("debits", func(t *testing.T) { testLendDebit(t, newStore) })
	probe := core.Loan{Key: "probe", Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10))},
		Holder: 1, Want: 1, Share: 1, TTL: time.Second}
	if _, err := lender.Lend(context.Background(), []core.Loan{probe}); errors.Is(err, errors.ErrUnsupported) {
		t.Skip("the store grants part of a request, and lends to no holder (a Shard):", err)
	}
	t.Run("conserved", func(t *testing.T) { testLendConserved(t, newStore) })
	t.Run("share", func(t *testing.T) { testLendShare(t, newStore) })
	t.Run("records end", func(t *testing.T) { testLendEnds(t, newStore) })
	t.Run("revoke and rule change", func(t *testing.T) { testLendRevoke(t, newStore) })
	t.Run("end", func(t *testing.T) { testLendEnd(t, newStore) })
	t.Run("lost answers", func(t *testing.T) { testLendLost(t, newStore) })
	t.Run("windows", func(t *testing.T) { testLendWindows(t, newStore) })
	t.Run("bad loans", func(t *testing.T) { testLendBad(t, newStore) })
	t.Run("concurrent", func(t *testing.T) { testLendConcurrent(t, newStore) })
}

// testAllowAtMost: a partial take admits what the key has left, up to n, keeping what the
// request's priority must leave, and says how many.
func testAllowAtMost(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start.Add(10 * time.Second))
	store := newStore(t, clk)
	ctx := context.Background()
	tb, err := tokenbucket.New(store, ratelimit.PerSecond(10), ratelimit.WithNamespace("most"), ratelimit.WithReserves(0, 50))
	if err != nil {
		t.Fatal(err)
	}
	want := func(what string, l *ratelimit.AlgorithmLimiter, ctx context.Context, key string, n, granted int64, d ratelimit.Decision) {
		t.Helper()
		g, got, err := l.AllowAtMost(ctx, key, n)
		if err != nil || g != granted || got != d {
			t.Errorf("%s: granted %d, %+v, %v; want %d, %+v", what, g, got, err, granted, d)
		}
	}
	want("7 of a full 10", tb, ctx, "k", 7, 7, ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 700 * time.Millisecond})
	want("7 of the 3 left", tb, ctx, "k", 7, 3, ratelimit.Decision{Allowed: true, Limit: 10, ResetAfter: time.Second})
	want("1 of none", tb, ctx, "k", 1, 0, ratelimit.Decision{Limit: 10, RetryAfter: 100 * time.Millisecond, ResetAfter: time.Second})
	normal := ratelimit.WithPriority(ctx, ratelimit.Normal)
	want("a normal request, 25 of a full 10 keeping 5", tb, normal, "n", 25, 5, ratelimit.Decision{Allowed: true, Limit: 10, ResetAfter: 500 * time.Millisecond})
	want("a critical one, what is left", tb, ctx, "n", 25, 5, ratelimit.Decision{Allowed: true, Limit: 10, ResetAfter: time.Second})
	fw, _ := fixedwindow.New(store, ratelimit.PerMinute(10), ratelimit.WithNamespace("most"))
	want("a window, 25 at 0:10", fw, ctx, "k", 25, 10, ratelimit.Decision{Allowed: true, Limit: 10, ResetAfter: 50 * time.Second})
	if _, _, err := tb.AllowAtMost(ctx, "k", 0); !errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("AllowAtMost of 0: %v; want ErrInvalidN", err)
	}
	lb, _ := leakybucket.New(store, ratelimit.PerSecond(10), ratelimit.WithNamespace("most"))
	if _, _, err := lb.AllowAtMost(ctx, "k", 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("AllowAtMost of the leaky bucket: %v; want errors.ErrUnsupported", err)
	}
}

// testLendDebit: a partial take whose Op is OpDebit charges all it wants, whatever the
// key has left, and answers as a debit Apply does, for each algorithm that lends.
func testLendDebit(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start.Add(10 * time.Second))
	store := newStore(t, clk)
	s := store.(core.Lender)
	ctx := context.Background()
	quota, err := fixedwindow.Quota{Limit: 10, Per: fixedwindow.Day, In: time.UTC}.Algorithm()
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []*core.Algorithm{tokenbucket.Algorithm(), fixedwindow.Algorithm(), slidingwindow.Algorithm(), quota} {
		rule := ratelimit.PerSecond(10)
		if alg == quota {
			rule = ratelimit.PerDay(10)
		}
		take := func(key string) core.Outcome { return takeOne(t, store, key, alg, rule) }
		for _, n := range []int64{4, 15} { // within what the key has, and past it: a debt
			for _, reserve := range []int64{0, 50} {
				what := fmt.Sprintf("%s: a debit of %d of a key that took 3, keeping %d%%", alg.Name, n, reserve)
				byLoan, byApply := fmt.Sprint("loan", n, reserve), fmt.Sprint("apply", n, reserve)
				for range 3 {
					take(byLoan)
					take(byApply)
				}
				spec := &core.Spec{Algorithm: alg, Rule: core.Rule(rule), Op: core.OpDebit, Reserve: reserve}
				lent := lendOne(t, s, core.Loan{Key: byLoan, Spec: spec, Want: n})
				want, err := store.Apply(ctx, core.Request{Key: byApply, N: n, Spec: spec})
				if err != nil {
					t.Fatal(err)
				}
				if lent.N != n || lent.Outcome != want {
					t.Errorf("%s: lent %d, %+v; want %d, %+v as Apply's", what, lent.N, lent.Outcome, n, want)
				}
				if a, b := take(byLoan), take(byApply); a != b || (n > 7) == a.Allowed() {
					t.Errorf("%s: the take after it: %+v; want %+v, allowed %v", what, a, b, n <= 7)
				}
			}
		}
	}
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10)), Op: core.OpDebit}
	for i, bad := range []core.Loan{
		{Key: "k", Spec: spec, Holder: 1, Want: 5, TTL: time.Second}, // a holder's debit
		{Key: "k", Spec: spec},                   // of nothing
		{Key: "k", Spec: spec, Want: 1 << 53},    // beyond what an algorithm counts
		{Key: "k", Spec: spec, Want: 1, Give: 1}, // giving back
	} {
		if got, err := s.Lend(ctx, []core.Loan{bad}); err == nil {
			t.Errorf("bad debit %d: %+v, no error", i, got)
		}
	}
	if o := takeOne(t, store, "k", spec.Algorithm, ratelimit.Rule(spec.Rule)); !o.Allowed() || o.Remaining != 9 {
		t.Errorf("after the bad debits, a take: %+v; want the key untouched", o)
	}
}

// takeOne is a take of 1 of key under alg and rule.
func takeOne(t *testing.T, store ratelimit.Store, key string, alg *core.Algorithm, rule ratelimit.Rule) core.Outcome {
	t.Helper()
	o, err := store.Apply(context.Background(), core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(rule)}})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func lender(t *testing.T, newStore NewStore) (core.Lender, *clock.Fake) {
	clk := clock.NewFake(Start)
	return newStore(t, clk).(core.Lender), clk
}

// lendOne asks one loan, and fails the test on an error.
func lendOne(t *testing.T, s core.Lender, l core.Loan) core.Lent {
	t.Helper()
	got, err := s.Lend(context.Background(), []core.Loan{l})
	if err != nil || len(got) != 1 {
		t.Fatalf("Lend(%+v) = %+v, %v", l, got, err)
	}
	return got[0]
}

func wantLent(t *testing.T, what string, got core.Lent, n int64, allowed bool, remaining int64, kept bool) {
	t.Helper()
	if got.N != n || got.Allowed() != allowed || got.Remaining != remaining || got.Kept != kept {
		t.Errorf("%s: lent %d, allowed %v, remaining %d, kept %v; want %d, %v, %d, %v (%+v)",
			what, got.N, got.Allowed(), got.Remaining, got.Kept, n, allowed, remaining, kept, got)
	}
}

// testLendConserved: what is lent is taken from the key, what is given back returns to
// it, never more than the holder has out, and a take sees the same key.
func testLendConserved(t *testing.T, newStore NewStore) {
	s, _ := lender(t, newStore)
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "lend", Rule: core.Rule(ratelimit.PerSecond(10))}
	loan := func(holder, give, want int64) core.Loan {
		return core.Loan{Key: "k", Spec: spec, Holder: holder, Give: give, Want: want, Share: 1, TTL: time.Minute}
	}
	got := lendOne(t, s, loan(1, 0, 4))
	wantLent(t, "A borrows 4 of 10", got, 4, true, 6, false)
	if got.For != time.Minute || got.Limit() != 10 {
		t.Errorf("A's loan: for %v, limit %d; want 1m0s, 10", got.For, got.Limit())
	}
	d, err := s.Apply(context.Background(), core.Request{Key: "k", N: 1, Spec: spec})
	if err != nil || !d.Allowed() || d.Remaining != 5 {
		t.Fatalf("a take after: %+v, %v; want allowed, 5 left", d, err)
	}
	wantLent(t, "B borrows 10 of 5, shared with A", lendOne(t, s, loan(2, 0, 10)), 2, true, 3, false)
	wantLent(t, "A gives back 9 of its 4", lendOne(t, s, loan(1, 9, 0)), 0, true, 6, true)
	wantLent(t, "A gives back 1 more, with nothing on record", lendOne(t, s, loan(1, 1, 0)), 0, true, 6, false)
	wantLent(t, "B renews, borrowing 0", lendOne(t, s, loan(2, 0, 0)), 0, true, 6, true)
	wantLent(t, "B gives back its 2, and borrows 8", lendOne(t, s, loan(2, 2, 8)), 8, true, 1, true)
	d, err = s.Apply(context.Background(), core.Request{Key: "k", N: 2, Spec: spec})
	if err != nil || d.Allowed() || d.Remaining != 1 {
		t.Fatalf("a take of 2 with 2 left: %+v, %v; want denied, 1 left", d, err)
	}
}

// testLendShare: a loan takes at most what is left divided by its Share, or by the
// holders with events out, and one event when that is none (the key's last few go to
// whoever asks first).
func testLendShare(t *testing.T, newStore NewStore) {
	s, _ := lender(t, newStore)
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10))}
	l := core.Loan{Key: "k", Spec: spec, Holder: 1, Want: 10, Share: 4, TTL: time.Second}
	wantLent(t, "10 left over 4 instances", lendOne(t, s, l), 2, true, 8, false)
	l.Holder, l.Share = 2, 1
	wantLent(t, "8 left over 2 holders", lendOne(t, s, l), 4, true, 4, false)
	l.Holder = 3
	wantLent(t, "4 left over 3 holders", lendOne(t, s, l), 1, true, 3, false)
	l.Holder, l.Share = 4, 8
	for left := int64(3); left > 0; left-- {
		wantLent(t, fmt.Sprintf("%d left over 8 instances", left), lendOne(t, s, l), 1, true, left-1, false)
		l.Holder++
	}
	got := lendOne(t, s, l)
	wantLent(t, "nothing left", got, 0, false, 0, false)
	if got.For != 0 {
		t.Errorf("nothing lent, nothing held: for %v; want 0", got.For)
	}
}

// testLendEnds: a record ends with its TTL, its events counted as spent: a give after it
// returns nothing, and the key refills only by its rule.
func testLendEnds(t *testing.T, newStore NewStore) {
	s, clk := lender(t, newStore)
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerMinute(60))} // 1 a second
	l := core.Loan{Key: "k", Spec: spec, Holder: 1, Want: 30, Share: 1, TTL: 2 * time.Second}
	wantLent(t, "30 of 60", lendOne(t, s, l), 30, true, 30, false)
	clk.Advance(2 * time.Second)
	l.Give, l.Want = 30, 0
	wantLent(t, "30 given back after the record ended", lendOne(t, s, l), 0, true, 31, false)
	clk.Advance(time.Second)
	l.Give, l.Want = 0, 40
	got := lendOne(t, s, l)
	wantLent(t, "a new loan", got, 33, true, 0, false)
	if got.Reset != time.Minute {
		t.Errorf("reset %v; want 1m0s, the empty bucket's, as a take of 33 has it", got.Reset)
	}
	l.Want = 1
	got = lendOne(t, s, l)
	wantLent(t, "nothing left", got, 0, false, 0, true)
	if got.Wait != time.Second || got.For != 2*time.Second {
		t.Errorf("wait %v, for %v; want 1s until one event, and the renewed record's 2s", got.Wait, got.For)
	}
}

// testLendLost: a numbered loan settles the holder's loans whose answers were lost,
// whether they landed or not: what one lent comes back, what one gave that did not land
// is given; a loan that arrives after a later one changes nothing.
func testLendLost(t *testing.T, newStore NewStore) {
	s, _ := lender(t, newStore)
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerMinute(20))}
	loan := func(key string, seq, out, give, want int64) core.Loan {
		return core.Loan{Key: key, Spec: spec, Holder: 1, Seq: seq, Out: out, Give: give, Want: want, Share: 1, TTL: time.Minute}
	}
	wantOut := func(what string, got core.Lent, n, remaining, out int64) {
		t.Helper()
		wantLent(t, what, got, n, true, remaining, got.Kept)
		if got.Out != out {
			t.Errorf("%s: out %d; want %d", what, got.Out, out)
		}
	}
	// landed: 2 given back, 3 lent, the answer lost; the holder counts 5-2 out (a
	// Remaining is a take's, or a peek's of 1 when nothing is lent)
	wantOut("A borrows 5", lendOne(t, s, loan("landed", 1, 0, 0, 5)), 5, 15, 5)
	lost := loan("landed", 2, 5, 2, 3)
	wantOut("its answer lost", lendOne(t, s, lost), 3, 14, 6)
	wantOut("the next loan gives back the 3 it lent", lendOne(t, s, loan("landed", 3, 3, 0, 0)), 0, 16, 3)
	wantOut("the lost loan, arriving late", lendOne(t, s, lost), 0, 16, 3)
	wantOut("the one before", lendOne(t, s, loan("landed", 1, 0, 0, 5)), 0, 16, 3)
	// not landed: 2 given back in a loan that never reached the store
	wantOut("B borrows 5", lendOne(t, s, loan("lost", 1, 0, 0, 5)), 5, 15, 5)
	wantOut("the next loan gives back the 2 the lost one did", lendOne(t, s, loan("lost", 3, 3, 1, 0)), 0, 17, 2)
	// emptied: a loan arriving after the one that gave everything back changes nothing
	first := loan("emptied", 1, 0, 0, 10)
	wantOut("D borrows 10", lendOne(t, s, first), 10, 10, 10)
	wantOut("D gives the 10 back", lendOne(t, s, loan("emptied", 2, 10, 10, 0)), 0, 19, 0)
	wantOut("its first loan, arriving again", lendOne(t, s, first), 0, 19, 0)
	// many loans of one key in one call: decided in order, each numbered after the last
	many := make([]core.Loan, 25)
	for i := range many {
		many[i] = loan("many", int64(i+1), int64(i), 0, 1)
		many[i].Spec = &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerMinute(100))}
	}
	got, err := s.Lend(context.Background(), many)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		if g.N != 1 || g.Out != int64(i+1) {
			t.Errorf("loan %d of 25 of one key in one call: lent %d, %d out; want 1, %d", i+1, g.N, g.Out, i+1)
		}
	}
	// unnumbered: Give alone
	wantOut("C borrows 5", lendOne(t, s, loan("unnumbered", 0, 0, 0, 5)), 5, 15, 5)
	wantOut("C gives 1, counting none out", lendOne(t, s, loan("unnumbered", 0, 0, 1, 0)), 0, 15, 4)
}

// testLendRevoke: a revoke, and a loan under another rule, end the other holders'
// records; the holder's own give back counts first.
func testLendRevoke(t *testing.T, newStore NewStore) {
	s, _ := lender(t, newStore)
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10))}
	l := core.Loan{Key: "k", Spec: spec, Want: 3, Share: 1, TTL: time.Minute}
	for h := int64(1); h <= 2; h++ {
		l.Holder = h
		lendOne(t, s, l)
	}
	wantLent(t, "A gives back its 3 and revokes", lendOne(t, s, core.Loan{Key: "k", Spec: spec, Holder: 1, Give: 3, Revoke: true, Share: 1, TTL: time.Minute}), 0, true, 6, true)
	wantLent(t, "B after the revoke", lendOne(t, s, core.Loan{Key: "k", Spec: spec, Holder: 2, Give: 3, Share: 1, TTL: time.Minute}), 0, true, 6, false)
	lendOne(t, s, core.Loan{Key: "k", Spec: spec, Holder: 2, Want: 2, Share: 1, TTL: time.Minute})
	other := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(20))}
	lendOne(t, s, core.Loan{Key: "k", Spec: other, Holder: 1, Want: 1, Share: 1, TTL: time.Minute})
	wantLent(t, "B after a loan under another rule", lendOne(t, s, core.Loan{Key: "k", Spec: spec, Holder: 2, Give: 2, Share: 1, TTL: time.Minute}), 0, true, 3, false)
}

// testLendEnd: a holder's last loan (End) gives back what it holds and drops its record:
// what it spent is forgotten, its next loan finds no record, and the key's other holders
// lend by their shares again.
func testLendEnd(t *testing.T, newStore NewStore) {
	s, _ := lender(t, newStore)
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerHour(100))}
	l := core.Loan{Key: "k", Spec: spec, Want: 10, Share: 1, TTL: time.Minute}
	for h := int64(1); h <= 3; h++ {
		l.Holder, l.Seq = h, 1
		wantLent(t, fmt.Sprint("holder ", h), lendOne(t, s, l), 10, true, 100-10*h, false)
	}
	got := lendOne(t, s, core.Loan{Key: "k", Spec: spec, Holder: 1, Give: 4, Share: 1, TTL: time.Minute, Seq: 2, Out: 10, End: true})
	wantLent(t, "holder 1 ends, giving back 4 of 10", got, 0, true, 73, true) // 74 left: a peek of 1 leaves 73
	if got.Out != 0 || got.For != 0 {
		t.Errorf("holder 1 ends: out %d for %v; want 0 for 0s", got.Out, got.For)
	}
	// two holders have events out, not three: of 74, holder 2 is lent half
	wantLent(t, "holder 2 with two holders out", lendOne(t, s, core.Loan{Key: "k", Spec: spec, Holder: 2, Want: 60, Share: 1, TTL: time.Minute, Seq: 2, Out: 10}), 37, true, 37, true)
	wantLent(t, "holder 1 after its end", lendOne(t, s, core.Loan{Key: "k", Spec: spec, Holder: 1, Give: 6, Share: 1, TTL: time.Minute, Seq: 3}), 0, true, 36, false)
}

// testLendWindows: a windowed algorithm's loan ends with its window, and what it lent
// then never comes back into the next window.
func testLendWindows(t *testing.T, newStore NewStore) {
	s, clk := lender(t, newStore)
	clk.Set(Start.Add(40 * time.Second))
	for _, alg := range []*core.Algorithm{fixedwindow.Algorithm(), slidingwindow.Algorithm()} {
		spec := &core.Spec{Algorithm: alg, Rule: core.Rule(ratelimit.PerMinute(10))}
		got := lendOne(t, s, core.Loan{Key: "w", Spec: spec, Holder: 1, Want: 4, Share: 1, TTL: time.Hour})
		if got.N != 4 || got.For != 20*time.Second {
			t.Errorf("%s at 0:40: lent %d for %v; want 4 for the window's last 20s", alg.Name, got.N, got.For)
		}
	}
	clk.Set(Start.Add(time.Minute))
	spec := &core.Spec{Algorithm: fixedwindow.Algorithm(), Rule: core.Rule(ratelimit.PerMinute(10))}
	got := lendOne(t, s, core.Loan{Key: "w", Spec: spec, Holder: 1, Give: 4, Share: 1, TTL: time.Hour})
	wantLent(t, "the fixed window's 4 given back in the next window", got, 0, true, 9, false)
	// two holders with events out: a loan divides what is left by them, but not in the
	// window's last quarter, where what the other left would end with the window
	for _, alg := range []*core.Algorithm{fixedwindow.Algorithm(), slidingwindow.Algorithm()} {
		clk.Set(Start.Add(2 * time.Hour))
		spec := &core.Spec{Algorithm: alg, Rule: core.Rule(ratelimit.PerMinute(100))}
		key := "last-" + alg.Name
		loan := func(holder, want int64) core.Loan {
			return core.Loan{Key: key, Spec: spec, Holder: holder, Want: want, Share: 1, TTL: time.Hour}
		}
		lendOne(t, s, loan(1, 20))
		lendOne(t, s, loan(2, 20))
		clk.Set(Start.Add(2*time.Hour + 44*time.Second))
		if got := lendOne(t, s, loan(1, 100)); got.N != 30 {
			t.Errorf("%s at 0:44, 60 left over 2 holders: lent %d; want 30", alg.Name, got.N)
		}
		clk.Set(Start.Add(2*time.Hour + 45*time.Second))
		if got := lendOne(t, s, loan(2, 100)); got.N != 30 {
			t.Errorf("%s at 0:45, the window's last quarter, 30 left: lent %d; want all 30", alg.Name, got.N)
		}
	}
	quota := fixedwindow.Quota{Limit: 100, Per: fixedwindow.Day, In: time.UTC}
	qalg, err := quota.Algorithm()
	if err != nil {
		t.Fatal(err)
	}
	clk.Set(Start.Add(23 * time.Hour))
	qspec := &core.Spec{Algorithm: qalg, Rule: core.Rule(quota.Rule())}
	got = lendOne(t, s, core.Loan{Key: "q", Spec: qspec, Holder: 1, Want: 10, Share: 1, TTL: 24 * time.Hour})
	if got.N != 10 || got.For != time.Hour {
		t.Errorf("a daily quota at 23:00: lent %d for %v; want 10 for the day's last hour", got.N, got.For)
	}
}

// testLendBad: loans no store decides are errors, and lend nothing.
func testLendBad(t *testing.T, newStore NewStore) {
	s, _ := lender(t, newStore)
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10))}
	good := core.Loan{Key: "k", Spec: spec, Holder: 1, Want: 5, Share: 1, TTL: time.Second}
	bad := []core.Loan{
		{Key: "k", Spec: &core.Spec{Algorithm: leakybucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10))}, Holder: 1, Want: 1, TTL: time.Second},
		{Key: "k", Spec: spec, Give: 1, Want: 1, TTL: time.Second}, // a partial take giving back
		{Key: "k", Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10)), Reserve: 20}, Holder: 1, Want: 1, TTL: time.Second},
		{Key: "k", Spec: spec, Holder: 1, Want: -1, TTL: time.Second},
		{Key: "k", Spec: spec, Holder: 1, Give: -1, TTL: time.Second},
		{Key: "k", Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule{Limit: -1, Period: time.Second}}, Holder: 1, Want: 1, TTL: time.Second},
		{Key: "k", Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10)), Op: core.OpPeek}, Holder: 1, Want: 1, TTL: time.Second},
		{Key: "k", Holder: 1, Want: 1, TTL: time.Second},
		{Key: "k", Spec: spec, Want: 1, End: true, TTL: time.Second},                 // a partial take that ends a record
		{Key: "k", Spec: spec, Holder: 1, Want: 1, End: true, TTL: time.Second},      // an end that wants
		{Key: "k", Spec: spec, Holder: 1, Revoke: true, End: true, TTL: time.Second}, // an end that revokes
	}
	for i, b := range bad {
		if got, err := s.Lend(context.Background(), []core.Loan{good, b}); err == nil {
			t.Errorf("bad loan %d: %+v, no error", i, got)
		}
	}
	wantLent(t, "after the bad loans", lendOne(t, s, good), 5, true, 5, false)
}

// testLendConcurrent: holders lending, giving back and taking at once, on a clock that
// stands still: what the key has left, what was taken and what the holders hold add up
// to its capacity, never more.
func testLendConcurrent(t *testing.T, newStore NewStore) {
	s, _ := lender(t, newStore)
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerHour(1000))}
	var mu sync.Mutex
	taken := int64(0)
	held := make([]int64, 6)
	var wg sync.WaitGroup
	for h := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				give := held[h] / 2
				got, err := s.Lend(context.Background(), []core.Loan{{Key: "k", Spec: spec, Holder: int64(h + 1),
					Give: give, Want: int64(5 + i%7), Share: 1, TTL: time.Hour}})
				if err != nil {
					t.Error(err)
					return
				}
				held[h] += got[0].N - give
				d, err := s.Apply(context.Background(), core.Request{Key: "k", N: 1, Spec: spec})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed() {
					mu.Lock()
					taken++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	d, err := s.Apply(context.Background(), core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: spec.Rule, Op: core.OpPeek}})
	if err != nil {
		t.Fatal(err)
	}
	left := int64(0)
	if d.Allowed() {
		left = d.Remaining + 1
	}
	out := int64(0)
	for _, h := range held {
		out += h
	}
	// never more than the capacity; less only by what a give-back could not give: a
	// bucket's record of deficits keeps eight entries (core.DeficitsMax), and with more
	// loans out at once a give-back may find less than it holds. Through fallback, about
	// one run in 3,000 (-cpu 4) came 1 to 9 short; with 64 entries, none in 9,000.
	if sum := left + taken + out; sum > 1000 || sum < 990 {
		t.Errorf("left %d + taken %d + held %d = %d; want the capacity, 1000, or at most 1%% less", left, taken, out, sum)
	}
}
