package core_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
)

func TestCapacity(t *testing.T) {
	if c := core.Capacity(core.Rule(ratelimit.PerSecond(5))); c != 5 {
		t.Errorf("Capacity without burst = %d; want the limit, 5", c)
	}
	if c := core.Capacity(core.Rule{Limit: 5, Period: time.Second, Burst: 8}); c != 8 {
		t.Errorf("Capacity with burst 8 = %d", c)
	}
}

func TestShare(t *testing.T) {
	for _, tc := range []struct {
		rule ratelimit.Rule
		n    int64
		want ratelimit.Rule
	}{
		{ratelimit.Rule{Limit: 10, Period: time.Second, Burst: 7}, 4, ratelimit.Rule{Limit: 2, Period: time.Second, Burst: 1}},
		{ratelimit.PerSecond(1), 20, ratelimit.Rule{Limit: 1, Period: 20 * time.Second}},
		{ratelimit.Rule{Limit: 2, Period: time.Second, Burst: 2}, 5, ratelimit.Rule{Limit: 1, Period: 3 * time.Second, Burst: 1}},
		{ratelimit.PerSecond(7), 1, ratelimit.PerSecond(7)},
		{ratelimit.PerDay(1), 10_000, ratelimit.Rule{Limit: 1, Period: 10 * 365 * 24 * time.Hour}},
	} {
		if got := core.Share(core.Rule(tc.rule), tc.n); got != core.Rule(tc.want) {
			t.Errorf("Share(%v, %d) = %+v; want %+v", tc.rule, tc.n, got, tc.want)
		}
	}
}

// TestSharesNeverExceedTheRule: n shares together admit no more per period than the
// rule, and at once no more than the rule's capacity or n (each share holds at least 1).
func TestSharesNeverExceedTheRule(t *testing.T) {
	for limit := int64(1); limit <= 60; limit++ {
		for _, burst := range []int64{0, 1, limit, 3 * limit} {
			rule := ratelimit.Rule{Limit: limit, Period: time.Second, Burst: burst}
			for n := int64(1); n <= 40; n++ {
				s := core.Share(core.Rule(rule), n)
				if err := core.CheckRule(s); err != nil {
					t.Fatalf("Share(%v, %d) = %v: %v", rule, n, s, err)
				}
				// n * s.Limit / s.Period <= limit / Period
				if n*s.Limit*int64(rule.Period) > limit*int64(s.Period) {
					t.Errorf("Share(%v, %d) = %v: %d of them admit more per second than the rule", rule, n, s, n)
				}
				if n*core.Capacity(s) > max(core.Capacity(core.Rule(rule)), n) {
					t.Errorf("Share(%v, %d) = %v: %d of them hold more at once than the rule", rule, n, s, n)
				}
			}
		}
	}
}

// PortionLeases scales an in-flight limit exactly, but never below one lease, and leaves
// an invalid rule invalid.
func TestPortionLeases(t *testing.T) {
	lease := 30 * time.Second
	for _, c := range []struct {
		limit, part, whole, want int64
	}{{10, 1, 3, 3}, {10, 700, 1000, 7}, {1, 1, 20, 1}, {2, 300, 1000, 1}, {0, 1, 2, 0}, {10, 0, 2, 10}} {
		got := core.PortionLeases(core.Rule{Limit: c.limit, Period: lease}, c.part, c.whole)
		if got.Limit != c.want || got.Period != lease {
			t.Errorf("%d leases, %d/%d: %v; want %d leases of %v", c.limit, c.part, c.whole, got, c.want, lease)
		}
	}
}

func TestCheckRule(t *testing.T) {
	for _, r := range limitertest.InvalidRules {
		if err := core.CheckRule(core.Rule(r)); !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Errorf("CheckRule(%+v) = %v; want ErrInvalidRule", r, err)
		}
	}
	for _, r := range []ratelimit.Rule{
		{Limit: 1, Period: time.Millisecond},
		{Limit: 1, Period: 3650 * 24 * time.Hour},
		{Limit: 1 << 52, Period: time.Second, Burst: 1 << 52},
		{Limit: 1, Period: 1500 * time.Microsecond},
	} {
		if err := core.CheckRule(core.Rule(r)); err != nil {
			t.Errorf("CheckRule(%+v) = %v; want nil", r, err)
		}
	}
}

// Portion is exact: the parts of any split never admit more than the rule, each is the
// rule's times its part rounded down, and a rule too small to split says so.
func TestPortion(t *testing.T) {
	for _, tc := range []struct {
		rule        ratelimit.Rule
		part, whole int64
		want        ratelimit.Rule
	}{
		{ratelimit.PerSecond(100), 7, 10, ratelimit.PerSecond(70)},
		{ratelimit.PerSecond(100), 3, 10, ratelimit.PerSecond(30)},
		{ratelimit.Rule{Limit: 10, Period: time.Minute, Burst: 25}, 1, 3, ratelimit.Rule{Limit: 3, Period: time.Minute, Burst: 8}},
		{ratelimit.PerHour(1 << 52), 999, 1000, ratelimit.PerHour(4499096027743125)}, // 2^52 x 999 / 1000, rounded down
		{ratelimit.PerDay(5), 1, 1, ratelimit.PerDay(5)},
	} {
		got, err := core.Portion(core.Rule(tc.rule), tc.part, tc.whole)
		if err != nil || got != core.Rule(tc.want) {
			t.Errorf("Portion(%v, %d, %d) = %v, %v; want %v", tc.rule, tc.part, tc.whole, got, err, tc.want)
		}
	}
	for _, bad := range []struct {
		rule        ratelimit.Rule
		part, whole int64
	}{
		{ratelimit.PerSecond(2), 3, 10},                                    // 0.6 a second
		{ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 3}, 1, 10}, // burst 0.3
		{ratelimit.PerSecond(10), 0, 10},
		{ratelimit.PerSecond(10), 11, 10},
		{ratelimit.PerSecond(10), -1, -1},
		{ratelimit.Rule{}, 1, 2},
	} {
		if got, err := core.Portion(core.Rule(bad.rule), bad.part, bad.whole); !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Errorf("Portion(%v, %d, %d) = %v, %v; want ErrInvalidRule", bad.rule, bad.part, bad.whole, got, err)
		}
	}
	for limit := int64(1); limit <= 200; limit++ { // the parts of a split never admit more than the whole
		rule := ratelimit.Rule{Limit: limit, Period: time.Second, Burst: 2 * limit}
		for _, split := range [][]int64{{7, 3}, {1, 1, 1}, {5, 2, 2, 1}, {999, 1}} {
			whole, sumL, sumB := int64(0), int64(0), int64(0)
			for _, p := range split {
				whole += p
			}
			for _, p := range split {
				if s, err := core.Portion(core.Rule(rule), p, whole); err == nil {
					sumL, sumB = sumL+s.Limit, sumB+s.Burst
					if s.Limit != limit*p/whole {
						t.Fatalf("Portion(%v, %d, %d).Limit = %d", rule, p, whole, s.Limit)
					}
				}
			}
			if sumL > limit || sumB > 2*limit {
				t.Fatalf("%v split %v: the parts admit %d, burst %d", rule, split, sumL, sumB)
			}
		}
	}
}
