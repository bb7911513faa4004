package ratelimit

import (
	"fmt"
	"time"
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

// MinPeriod and MaxPeriod bound Rule.Period.
const (
	MinPeriod = time.Millisecond
	MaxPeriod = 10 * 365 * 24 * time.Hour
)

// MaxExact is the largest integer any algorithm handles in one decision. Every quantity
// is an exact integer no larger than this, so the same arithmetic gives the same answer
// in Go and in a Redis Lua script, whose numbers are IEEE doubles. Rules whose numbers
// would exceed it are rejected by the algorithm's Prepare with ErrInvalidRule.
const MaxExact = 1 << 52

// valid is Validate() == nil, cheaply: decisions check their rule every time.
func (r Rule) valid() bool {
	return r.Limit >= 1 && r.Limit <= MaxExact && r.Period >= MinPeriod && r.Period <= MaxPeriod &&
		r.Period%time.Microsecond == 0 && r.Burst >= 0 && r.Burst <= MaxExact
}

// Micros is the rule's Period in microseconds, after checking the rule with Validate.
func (r Rule) Micros() (int64, error) {
	if !r.valid() {
		return 0, r.Validate()
	}
	return int64(r.Period / time.Microsecond), nil
}

// Validate reports whether the rule is usable by any algorithm: Limit at least 1, Period
// between MinPeriod and MaxPeriod in whole microseconds, Burst not negative, and Limit and
// Burst at most MaxExact. An algorithm may refuse more (see each algorithm's Prepare).
// The error wraps ErrInvalidRule.
func (r Rule) Validate() error {
	switch {
	case r.Limit < 1:
		return fmt.Errorf("%w: limit %d is less than 1", ErrInvalidRule, r.Limit)
	case r.Limit > MaxExact:
		return fmt.Errorf("%w: limit %d is more than %d", ErrInvalidRule, r.Limit, int64(MaxExact))
	case r.Period < MinPeriod:
		return fmt.Errorf("%w: period %v is shorter than %v", ErrInvalidRule, r.Period, MinPeriod)
	case r.Period > MaxPeriod:
		return fmt.Errorf("%w: period %v is longer than %v", ErrInvalidRule, r.Period, MaxPeriod)
	case r.Period%time.Microsecond != 0:
		return fmt.Errorf("%w: period %v is not a whole number of microseconds", ErrInvalidRule, r.Period)
	case r.Burst < 0:
		return fmt.Errorf("%w: burst %d is negative", ErrInvalidRule, r.Burst)
	case r.Burst > MaxExact:
		return fmt.Errorf("%w: burst %d is more than %d", ErrInvalidRule, r.Burst, int64(MaxExact))
	}
	return nil
}

// Capacity is Burst, or Limit when Burst is 0: the size of a token bucket or of a leaky
// bucket's queue.
func (r Rule) Capacity() int64 {
	if r.Burst == 0 {
		return r.Limit
	}
	return r.Burst
}

// Share is 1/n of the rule, for one of n parts that together enforce it (instances during
// an outage, shards of a hot key): Limit and Burst divided by n, rounded up, at least 1
// (a Burst of 0 stays 0, which means Limit). n below 2 returns the rule unchanged.
func (r Rule) Share(n int64) Rule {
	if n <= 1 {
		return r
	}
	r.Limit = max(1, (r.Limit+n-1)/n)
	if r.Burst > 0 {
		r.Burst = max(1, (r.Burst+n-1)/n)
	}
	return r
}

// String formats the rule as "100 per 1s", or "100 per 1s, burst 200" when Burst is set.
func (r Rule) String() string {
	if r.Burst != 0 {
		return fmt.Sprintf("%d per %v, burst %d", r.Limit, r.Period, r.Burst)
	}
	return fmt.Sprintf("%d per %v", r.Limit, r.Period)
}
