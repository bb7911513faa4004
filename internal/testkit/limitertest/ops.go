package limitertest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
)

// opsLimiter is a limiter with Peek, Refund and Reset: every algorithm's is.
type opsLimiter interface {
	ratelimit.Limiter
	PeekN(ctx context.Context, key string, n int64) (ratelimit.Decision, error)
	Refund(ctx context.Context, key string, n int64) (ratelimit.Decision, error)
	Reset(ctx context.Context, key string) error
}

func setupOps(t *testing.T, newStore NewStore, k Kind, rule ratelimit.Rule, clk *clock.Fake) opsLimiter {
	t.Helper()
	l, err := k.New(newStore(t, clk), rule)
	if err != nil {
		t.Fatal(err)
	}
	ol, ok := l.(opsLimiter)
	if !ok {
		t.Fatalf("%s's limiter has no Peek, Refund and Reset", k.Name)
	}
	return ol
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

// testResetAndRefund: Reset makes a key full; Refund gives back what was taken, never
// above the full allowance.
func testResetAndRefund(t *testing.T, newStore NewStore, k Kind) {
	clk := clock.NewFake(Start)
	l := setupOps(t, newStore, k, ratelimit.PerMinute(7), clk)
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

	if d, err := l.AllowN(ctx, "r", 7); err != nil || !d.Allowed {
		t.Fatalf("AllowN(7) = %+v, %v", d, err)
	}
	d, err := l.Refund(ctx, "r", 3)
	if err != nil || !d.Allowed || d.Remaining != 2 {
		t.Errorf("Refund(3) of 7 taken = %+v, %v; want a peek of 1 with 2 left", d, err)
	}
	if d, _ := l.AllowN(ctx, "r", 3); !d.Allowed {
		t.Errorf("AllowN(3) after refunding 3: %+v", d)
	}
	if d, _ := l.Allow(ctx, "r"); d.Allowed {
		t.Errorf("Allow after the refund was spent: %+v", d)
	}

	// never above the full allowance
	if _, err := l.Refund(ctx, "fresh", 5); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.AllowN(ctx, "fresh", 7); !d.Allowed {
		t.Errorf("AllowN(7) after refunding a full key: %+v", d)
	}
	if d, _ := l.Allow(ctx, "fresh"); d.Allowed {
		t.Errorf("a refund to a full key raised it above its allowance: %+v", d)
	}
	if _, err := l.Refund(ctx, "fresh", 8); err == nil {
		t.Error("Refund(8) of a rule of 7: no error")
	}
}
