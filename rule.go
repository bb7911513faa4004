package ratelimit

import (
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Rule says how much a key may do. Its meaning is the same for every algorithm, with one
// field that only some of them read:
//
//   - Limit: events allowed per Period. For the token and leaky buckets it is the refill
//     (drain) amount: Limit every Period, continuously.
//   - Period: the window length, or the refill period. At least one millisecond, a whole
//     number of microseconds.
//   - Burst: the bucket's capacity (token bucket) or the queue's size (leaky bucket);
//     0 means Limit. The fixed window, sliding window and sliding log ignore it.
//
// Every number must be at most 2^52 (exact in a Lua script's doubles), and an algorithm may
// refuse more (see its package). The zero Rule is invalid: every constructor that takes
// a Rule returns an error wrapping ErrInvalidRule for it.
type Rule struct {
	Limit  int64
	Period time.Duration
	Burst  int64
}

// PerSecond is n events per second.
func PerSecond(n int64) Rule { return Rule{Limit: n, Period: time.Second} }

// PerMinute is n events per minute.
func PerMinute(n int64) Rule { return Rule{Limit: n, Period: time.Minute} }

// PerHour is n events per hour.
func PerHour(n int64) Rule { return Rule{Limit: n, Period: time.Hour} }

// PerDay is n events per 24 hours.
func PerDay(n int64) Rule { return Rule{Limit: n, Period: 24 * time.Hour} }

// validate reports whether the rule is usable by any algorithm: Limit at least 1, Period
// between 1ms and 10 years (3650 days) in whole microseconds, Burst not negative, and Limit
// and Burst at most 2^52, so that the same arithmetic gives the same answer in Go and in a
// Redis Lua script, whose numbers are IEEE doubles. An algorithm may refuse more (see each
// algorithm's package). The error wraps ErrInvalidRule.
func (r Rule) validate() error {
	if err := mathx.CheckRule(r.Limit, r.Period, r.Burst); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRule, err)
	}
	return nil
}

// String formats the rule as "100 per 1s", or "100 per 1s, burst 200" when Burst is set.
func (r Rule) String() string {
	if r.Burst != 0 {
		return fmt.Sprintf("%d per %v, burst %d", r.Limit, r.Period, r.Burst)
	}
	return fmt.Sprintf("%d per %v", r.Limit, r.Period)
}
