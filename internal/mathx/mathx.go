// Package mathx holds the integer arithmetic the algorithms share. Every function is
// exact for the magnitudes the algorithms use (at most MaxExact), and each has
// a twin in the Lua scripts that computes the same in doubles.
package mathx

import (
	"math/bits"
	"time"
)

// MaxExact is the largest integer any algorithm handles in one decision: every quantity
// stays an exact integer in a double.
const MaxExact = 1 << 52

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
