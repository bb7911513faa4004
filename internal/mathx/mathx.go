// Package mathx holds the integer arithmetic the algorithms share, and the bounds of a
// rule that keep it exact. Every function is exact for the magnitudes the algorithms use
// (at most MaxExact), and each that a step uses has a twin in the Lua scripts that
// computes the same in doubles.
package mathx

import (
	"fmt"
	"math/bits"
	"time"
)

// MaxExact is the largest integer any algorithm handles in one decision: every quantity
// stays an exact integer in a double.
const MaxExact = 1 << 52

// The bounds of a rule's Period.
const (
	MinPeriod = time.Millisecond
	MaxPeriod = 10 * 365 * 24 * time.Hour
)

// CheckRule is why a rule of limit events per period, with burst, is one no algorithm can
// enforce exactly, or nil: limit at least 1, period between MinPeriod and MaxPeriod in
// whole microseconds, burst not negative, limit and burst at most MaxExact. Callers wrap
// it with ratelimit.ErrInvalidRule.
func CheckRule(limit int64, period time.Duration, burst int64) error {
	switch {
	case limit < 1:
		return fmt.Errorf("limit %d is less than 1", limit)
	case limit > MaxExact:
		return fmt.Errorf("limit %d is more than %d", limit, int64(MaxExact))
	case period < MinPeriod:
		return fmt.Errorf("period %v is shorter than %v", period, MinPeriod)
	case period > MaxPeriod:
		return fmt.Errorf("period %v is longer than %v", period, MaxPeriod)
	case period%time.Microsecond != 0:
		return fmt.Errorf("period %v is not a whole number of microseconds", period)
	case burst < 0:
		return fmt.Errorf("burst %d is negative", burst)
	case burst > MaxExact:
		return fmt.Errorf("burst %d is more than %d", burst, int64(MaxExact))
	}
	return nil
}

// MulDiv is x*part/whole rounded down, for 0 <= x and 1 <= part <= whole, without
// overflow.
func MulDiv(x, part, whole int64) int64 {
	hi, lo := bits.Mul64(uint64(x), uint64(part))
	q, _ := bits.Div64(hi, lo, uint64(whole)) // hi < whole: the quotient is at most x
	return int64(q)
}

// Gcd is the greatest common divisor of a and b, both positive.
func Gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// CeilDiv is a/b rounded up, for a >= 0 and b > 0. A divisor of 1 skips the division: it
// is the buckets' rate under every rule whose limit divides its period in microseconds
// (1000 per second, 100 per minute), and a division is a good part of a step's time.
func CeilDiv(a, b int64) int64 {
	if b == 1 {
		return a
	}
	return (a + b - 1) / b
}

// FloorDiv is a/b rounded down (towards minus infinity), for b > 0.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// AddCapped is min(x + dt*rate, limit), for 0 <= x <= limit and dt, rate >= 0, without
// overflow however large dt is.
func AddCapped(x, dt, rate, limit int64) int64 {
	hi, lo := bits.Mul64(uint64(dt), uint64(rate))
	if hi != 0 || lo >= uint64(limit-x) {
		return limit
	}
	return x + int64(lo)
}

// Micros converts microseconds to a Duration.
func Micros(us int64) time.Duration {
	return time.Duration(us) * time.Microsecond
}

// Keep is what a request must leave of limit with a reserve of reserve percent
// (core.Args.Keep): reserve% of limit, rounded down. A request of more than
// limit less that is never admitted.
func Keep(limit, reserve int64) int64 {
	if reserve <= 0 {
		return 0
	}
	return limit/100*reserve + limit%100*reserve/100
}
