package ratelimit_test

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
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
		if err := core.CheckRule(tc.got); err != nil {
			t.Errorf("%v: %v", tc.got, err)
		}
	}
}
