package limitertest

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// setupOps is an algorithm's limiter with its Peek, Charge and Reset.
func setupOps(t *testing.T, newStore NewStore, k Kind, rule ratelimit.Rule, clk *clock.Fake) *ratelimit.AlgorithmLimiter {
	t.Helper()
	l, _ := setupOpsOn(t, newStore(t, clk), k, rule)
	return l
}

// setupOpsOn is setupOps on store, which it returns too.
func setupOpsOn(t *testing.T, store ratelimit.Store, k Kind, rule ratelimit.Rule) (*ratelimit.AlgorithmLimiter, ratelimit.Store) {
	t.Helper()
	l, err := k.New(store, rule)
	if err != nil {
		t.Fatal(err)
	}
	al, ok := l.(*ratelimit.AlgorithmLimiter)
	if !ok {
		t.Fatalf("%s's limiter (%T) is no AlgorithmLimiter", k.Name, l)
	}
	return al, store
}

// testPeek: a limiter that peeks at random makes the same decisions as a twin that never
// peeks, and each peek is the decision the take right after it gets.
func testPeek(t *testing.T, newStore NewStore, k Kind) {
	rule := ratelimit.PerMinute(7)
	clk := clock.NewFake(Start)
	peeking, plain := setupOps(t, newStore, k, rule, clk), setupOps(t, newStore, k, rule, clk)
	rng := rand.New(rand.NewPCG(3, 5))
	ctx := context.Background()
	for i := range 300 {
		clk.Advance(time.Duration(rng.IntN(4000)) * time.Millisecond)
		n := 1 + rng.Int64N(7)
		var peeked ratelimit.Decision
		peek := rng.IntN(2) == 0
		if peek {
			var err error
			if peeked, err = peeking.PeekN(ctx, "k", n); err != nil {
				t.Fatal(err)
			}
			if again, _ := peeking.PeekN(ctx, "k", n); again != peeked {
				t.Fatalf("step %d: two peeks differ: %+v, %+v", i, peeked, again)
			}
		}
		got, err := peeking.AllowN(ctx, "k", n)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := plain.AllowN(ctx, "k", n)
		if got != want || (peek && peeked != got) {
			t.Fatalf("step %d (n %d): peeked %+v, took %+v; without peeks %+v", i, n, peeked, got, want)
		}
	}
}

// testResetAndRefund: Reset makes a key full; a Charge settled below what it took gives
// the difference back, never above the full allowance, never what a key no longer holds
// (after a reset, or once a window is over or a bucket was full again), and once.
func testResetAndRefund(t *testing.T, newStore NewStore, k Kind) {
	clk := clock.NewFake(Start)
	l, store := setupOpsOn(t, newStore(t, clk), k, ratelimit.PerMinute(7))
	ctx := context.Background()
	if d, err := l.AllowN(ctx, "k", 7); err != nil || !d.Allowed {
		t.Fatalf("AllowN(7) = %+v, %v", d, err)
	}
	if err := l.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed || d.Remaining != 6 {
		t.Errorf("after Reset: %+v, %v; want a full key", d, err)
	}
	if err := l.Reset(ctx, "never-seen"); err != nil {
		t.Errorf("Reset of a key never seen: %v", err)
	}

	c, d, err := l.Charge(ctx, "r", 7)
	if err != nil || c == nil || !d.Allowed {
		t.Fatalf("Charge(7) = %v, %+v, %v", c, d, err)
	}
	d, err = c.Settle(ctx, 4)
	if err != nil || !d.Allowed || d.Remaining != 2 {
		t.Errorf("7 settled at 4 = %+v, %v; want 3 back: a peek of 1 with 2 left", d, err)
	}
	if _, err := c.Settle(ctx, 0); err == nil {
		t.Error("a charge settled twice: no error")
	}
	if d, _ := l.AllowN(ctx, "r", 3); !d.Allowed {
		t.Errorf("AllowN(3) after 3 came back: %+v", d)
	}
	if d, _ := l.Allow(ctx, "r"); d.Allowed {
		t.Errorf("Allow after they were spent: %+v", d)
	}
	denied, d, err := l.Charge(ctx, "r", 1)
	if err != nil || denied != nil || d.Allowed {
		t.Errorf("a Charge denied = %v, %+v, %v; want no Charge", denied, d, err)
	}
	if d, err := denied.Settle(ctx, 0); err != nil || d != (ratelimit.Decision{}) {
		t.Errorf("settling no Charge = %+v, %v; want nothing", d, err)
	}

	// never what the key no longer holds: its take before a reset, and once the key was
	// back to full (a window over, a bucket full again)
	c, _, err = l.Charge(ctx, "reset", 5)
	if err != nil || c == nil {
		t.Fatal(c, err)
	}
	if err := l.Reset(ctx, "reset"); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.AllowN(ctx, "reset", 7); !d.Allowed {
		t.Errorf("AllowN(7) after the reset: %+v", d)
	}
	if _, err := c.Settle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Allow(ctx, "reset"); d.Allowed {
		t.Errorf("a refund of a take before a reset gave back what the reset forgave: %+v", d)
	}
	c, _, err = l.Charge(ctx, "full", 5)
	if err != nil || c == nil {
		t.Fatal(c, err)
	}
	clk.Advance(2 * time.Minute) // a sliding window weighs the window before
	if d, _ := l.AllowN(ctx, "full", 7); !d.Allowed {
		t.Errorf("AllowN(7) two minutes later: %+v", d)
	}
	if _, err := c.Settle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Allow(ctx, "full"); d.Allowed {
		t.Errorf("a refund of a take the key had earned back raised it above its allowance: %+v", d)
	}

	if _, err := c.Settle(ctx, -1); !errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("Settle(-1): %v; want ErrInvalidN", err)
	}
	// a store refuses a refund without the receipt of its take
	req := core.Request{Key: "r", N: 1, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(ratelimit.PerMinute(7)), Op: core.OpRefund}}
	if _, err := store.Apply(ctx, req); !errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("a refund without a receipt: %v; want ErrInvalidN", err)
	}
}
