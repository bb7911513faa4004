// Package core is what the five algorithm packages share: the Lua prelude of their
// scripts, and the validation of rules and n.
package core

import (
	_ "embed"
	"fmt"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

//go:embed prelude.lua
var prelude string

// Script is an algorithm's Lua step after the prelude that every step shares.
func Script(step string) string { return prelude + step }

// CheckN returns an error unless 1 <= n <= limit.
func CheckN(name string, n, limit int64) error {
	if n >= 1 && n <= limit {
		return nil
	}
	if n < 1 {
		return fmt.Errorf("%s: n = %d: %w", name, n, ratelimit.ErrInvalidN)
	}
	if n > limit {
		return fmt.Errorf("%s: n = %d, at most %d: %w", name, n, limit, ratelimit.ErrNExceedsLimit)
	}
	return nil
}

// Micros is a rule's period in microseconds, after checking the rule.
func Micros(name string, rule ratelimit.Rule) (int64, error) {
	period, err := rule.Micros()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return period, nil
}

// BucketArgs are the Args of both buckets: Limit is the rule's capacity; a whole event is
// Unit in Level's units, and Level moves by Rate per microsecond, so that Limit/Period
// events per microsecond is exactly Rate/Unit.
func BucketArgs(name string, rule ratelimit.Rule, n int64) (ratelimit.Args, error) {
	period, err := Micros(name, rule)
	if err != nil {
		return ratelimit.Args{}, err
	}
	g := mathx.Gcd(period, rule.Limit) // usually one division: round periods are multiples of the limit
	unit, rate := period/g, rule.Limit/g
	capacity := rule.Capacity()
	if capacity > ratelimit.MaxExact/unit {
		return ratelimit.Args{}, fmt.Errorf("%s: %v: %w: capacity %d at %d per %v cannot be counted exactly; lower the burst or round the rate",
			name, rule, ratelimit.ErrInvalidRule, capacity, rule.Limit, rule.Period)
	}
	if err := CheckN(name, n, capacity); err != nil {
		return ratelimit.Args{}, err
	}
	return ratelimit.Args{N: n, Limit: capacity, Period: period, Unit: unit, Rate: rate}, nil
}
