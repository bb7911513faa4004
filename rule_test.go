package ratelimit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
)

func TestRuleHelpers(t *testing.T) {
	for _, tc := range []struct {
		got  ratelimit.Rule
		want ratelimit.Rule
		str  string
	}{
		{ratelimit.PerSecond(10), ratelimit.Rule{Limit: 10, Period: time.Second}, "10 per 1s"},
		{ratelimit.PerMinute(60), ratelimit.Rule{Limit: 60, Period: time.Minute}, "60 per 1m0s"},
		{ratelimit.PerHour(1000), ratelimit.Rule{Limit: 1000, Period: time.Hour}, "1000 per 1h0m0s"},
		{ratelimit.PerDay(10000), ratelimit.Rule{Limit: 10000, Period: 24 * time.Hour}, "10000 per 24h0m0s"},
		{ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 200}, ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 200}, "100 per 1s, burst 200"},
	} {
		if tc.got != tc.want || tc.got.String() != tc.str {
			t.Errorf("got %+v %q; want %+v %q", tc.got, tc.got.String(), tc.want, tc.str)
		}
		if err := tc.got.Validate(); err != nil {
			t.Errorf("%v: %v", tc.got, err)
		}
	}
}

func TestRuleValidate(t *testing.T) {
	for _, r := range limitertest.InvalidRules {
		if err := r.Validate(); !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Errorf("Validate(%+v) = %v; want ErrInvalidRule", r, err)
		}
	}
	for _, r := range []ratelimit.Rule{
		{Limit: 1, Period: time.Millisecond},
		{Limit: 1, Period: 3650 * 24 * time.Hour},
		{Limit: 1 << 52, Period: time.Second, Burst: 1 << 52},
		{Limit: 1, Period: 1500 * time.Microsecond},
	} {
		if err := r.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v; want nil", r, err)
		}
	}
}

// Share is exact: the parts of any split never admit more than the rule, each is the
// rule's times its part rounded down, and a rule too small to split says so.
func TestRuleShare(t *testing.T) {
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
		got, err := tc.rule.Share(tc.part, tc.whole)
		if err != nil || got != tc.want {
			t.Errorf("%v.Share(%d, %d) = %v, %v; want %v", tc.rule, tc.part, tc.whole, got, err, tc.want)
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
		if got, err := bad.rule.Share(bad.part, bad.whole); !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Errorf("%v.Share(%d, %d) = %v, %v; want ErrInvalidRule", bad.rule, bad.part, bad.whole, got, err)
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
				if s, err := rule.Share(p, whole); err == nil {
					sumL, sumB = sumL+s.Limit, sumB+s.Burst
					if s.Limit != limit*p/whole {
						t.Fatalf("%v.Share(%d, %d).Limit = %d", rule, p, whole, s.Limit)
					}
				}
			}
			if sumL > limit || sumB > 2*limit {
				t.Fatalf("%v split %v: the parts admit %d, burst %d", rule, split, sumL, sumB)
			}
		}
	}
}
