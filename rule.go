package ratelimit

import (
	"fmt"
	"math/bits"
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
// The zero Rule is invalid: every constructor that takes a Rule returns an error wrapping
// ErrInvalidRule for it.
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

// The bounds of a Rule's numbers. Every quantity an algorithm computes is an exact integer
// no larger than mathx.MaxExact (2^52), so the same arithmetic gives the same answer in Go
// and in a Redis Lua script, whose numbers are IEEE doubles.
const (
	minPeriod = time.Millisecond
	maxPeriod = 10 * 365 * 24 * time.Hour
	maxExact  = mathx.MaxExact
)

// Validate reports whether the rule is usable by any algorithm: Limit at least 1, Period
// between 1ms and 10 years (3650 days) in whole microseconds, Burst not negative, and Limit
// and Burst at most 2^52. An algorithm may refuse more: a bucket whose capacity cannot be
// counted exactly at its rate, say (see each algorithm's package). The error wraps
// ErrInvalidRule.
func (r Rule) Validate() error {
	switch {
	case r.Limit < 1:
		return fmt.Errorf("%w: limit %d is less than 1", ErrInvalidRule, r.Limit)
	case r.Limit > maxExact:
		return fmt.Errorf("%w: limit %d is more than %d", ErrInvalidRule, r.Limit, int64(maxExact))
	case r.Period < minPeriod:
		return fmt.Errorf("%w: period %v is shorter than %v", ErrInvalidRule, r.Period, minPeriod)
	case r.Period > maxPeriod:
		return fmt.Errorf("%w: period %v is longer than %v", ErrInvalidRule, r.Period, maxPeriod)
	case r.Period%time.Microsecond != 0:
		return fmt.Errorf("%w: period %v is not a whole number of microseconds", ErrInvalidRule, r.Period)
	case r.Burst < 0:
		return fmt.Errorf("%w: burst %d is negative", ErrInvalidRule, r.Burst)
	case r.Burst > maxExact:
		return fmt.Errorf("%w: burst %d is more than %d", ErrInvalidRule, r.Burst, int64(maxExact))
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

// Share is part/whole of the rule, for one of several parts that enforce it together
// (regions splitting a limit 70/30, say): Limit and Burst times part/whole, rounded
// down, and the same Period, so that the parts together never admit more than the rule
// in any window of any algorithm. part and whole must satisfy 1 <= part <= whole. A share
// whose Limit, or Burst when it is set, rounds down to 0 is an error wrapping
// ErrInvalidRule: the rule is too small to split so, and rounding each part up to 1
// would let the parts admit more than the rule.
func (r Rule) Share(part, whole int64) (Rule, error) {
	if err := r.Validate(); err != nil {
		return Rule{}, err
	}
	if part < 1 || part > whole {
		return Rule{}, fmt.Errorf("%w: a share of %d/%d: want 1 <= part <= whole", ErrInvalidRule, part, whole)
	}
	s := Rule{Limit: mulDiv(r.Limit, part, whole), Period: r.Period, Burst: mulDiv(r.Burst, part, whole)}
	if s.Limit < 1 || (r.Burst > 0 && s.Burst < 1) {
		return Rule{}, fmt.Errorf("%w: %v is too small to split: %d/%d of it is %v", ErrInvalidRule, r, part, whole,
			Rule{Limit: s.Limit, Period: s.Period, Burst: s.Burst})
	}
	return s, nil
}

// mulDiv is x*part/whole rounded down, for 0 <= x and 1 <= part <= whole, without
// overflow.
func mulDiv(x, part, whole int64) int64 {
	hi, lo := bits.Mul64(uint64(x), uint64(part))
	q, _ := bits.Div64(hi, lo, uint64(whole)) // hi < whole: the quotient is at most x
	return int64(q)
}
