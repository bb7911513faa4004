package limitertest

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
)

// testParkedRefunds: charges of a key taken one by one as its allowance comes back, for
// a minute, then all settled at no cost at one instant, each followed by a take. Had
// every one of them cost nothing, the key would have been full at that instant, and no
// more: the takes of that instant are at most its Limit, whatever the refunds gave back.
// A refund gives back only what its own take would have left, never a deficit another
// refund gave back already.
func testParkedRefunds(t *testing.T, newStore NewStore, k Kind) {
	clk := clock.NewFake(Start)
	rule := ratelimit.PerSecond(10)
	l, _ := setupOpsOn(t, newStore(t, clk), k, rule)
	ctx := context.Background()
	for {
		if d, err := l.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		} else if !d.Allowed {
			break
		}
	}
	var parked []*ratelimit.Charge
	for range 600 { // a minute of the refill, one event at a time
		clk.Advance(100 * time.Millisecond)
		c, _, err := l.Charge(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if c != nil {
			parked = append(parked, c)
		}
	}
	if len(parked) < 300 {
		t.Fatalf("%d of 600 charges admitted as the key refilled; want most", len(parked))
	}
	admitted, limit := int64(0), int64(0)
	for i := len(parked) - 1; i >= 0; i-- { // the newest first, and in turn the oldest first below
		if _, err := parked[i].Settle(ctx, 0); err != nil {
			t.Fatal(err)
		}
		d, err := l.Allow(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
		limit = d.Limit
	}
	if admitted > limit {
		t.Errorf("%d charges settled at no cost at one instant: %d admitted then; want at most the Limit, %d", len(parked), admitted, limit)
	}
}

// testResetTwice: a charge taken before two resets of its key gives nothing back: the
// first reset voided it, and the second keeps what the first voided. Nor does one taken
// before the clock stepped back by more than a period, then a reset.
func testResetTwice(t *testing.T, newStore NewStore, k Kind) {
	ctx := context.Background()
	for _, stepBack := range []bool{false, true} {
		clk := clock.NewFake(Start.Add(30 * time.Second))
		l, _ := setupOpsOn(t, newStore(t, clk), k, ratelimit.PerMinute(10))
		c, _, err := l.Charge(ctx, "k", 10)
		if err != nil || c == nil {
			t.Fatalf("Charge(10) = %v, %v", c, err)
		}
		clk.Advance(time.Second)
		if stepBack {
			clk.Advance(-2 * time.Minute) // a period and more: the key's history moves back
		} else if err := l.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
		if err := l.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
		admitted := int64(0)
		for range 10 {
			if d, _ := l.Allow(ctx, "k"); d.Allowed {
				admitted++
			}
		}
		if _, err := c.Settle(ctx, 0); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			if d, _ := l.Allow(ctx, "k"); d.Allowed {
				admitted++
			}
		}
		if admitted > 10 {
			what := "two resets"
			if stepBack {
				what = "the clock stepped back and a reset"
			}
			t.Errorf("after %s, a charge of 10 taken before them settled at 0: %d admitted in the next seconds; want 10", what, admitted)
		}
	}
}
