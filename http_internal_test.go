package ratelimit

import (
	"math"
	"testing"
	"time"
)

// windowSeconds is exact past 64 bits, and saturates rather than wraps.
func TestWindowSeconds(t *testing.T) {
	tenYears := 3650 * 24 * time.Hour
	for _, tc := range []struct {
		limit int64
		rule  Rule
		want  int64
	}{
		{100, Rule{Limit: 3, Period: time.Minute}, 2000},
		{10, Rule{Limit: 2, Period: time.Second}, 5},
		{1, Rule{Limit: 1000, Period: time.Second}, 1}, // 1ms, at least 1
		{1 << 52, Rule{Limit: 1 << 52, Period: tenYears}, 315360000},
		{1 << 52, Rule{Limit: 3, Period: tenYears}, math.MaxInt64}, // 4.7e23 s
		{(1 << 52) - 1, Rule{Limit: 1 << 51, Period: 3 * time.Second}, 6},
		{0, Rule{Limit: 1, Period: time.Second}, 0},
		{5, Rule{}, 0},
	} {
		if got := windowSeconds(tc.limit, tc.rule); got != tc.want {
			t.Errorf("windowSeconds(%d, %v) = %d; want %d", tc.limit, tc.rule, got, tc.want)
		}
	}
}
