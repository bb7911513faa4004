// Package core is the contract between the limiters, the algorithms and the stores: the
// Request a limiter sends, the Outcome a store returns, an Algorithm's steps and State,
// loans, and receipts. It also holds what the algorithm packages and the stores share:
// the validation of rules and n, and a few operations on rules, requests and states. It
// imports no other package of this module but internal/eventlog and internal/mathx.
package core

import (
	"fmt"
	"reflect"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Rewind moves st's time back by whole periods when it is more than a period ahead of
// now, until it is within one, and says by how much: the clock went back by more than a
// period (an NTP step, a virtual machine resumed, a server's clock set right, instances
// whose clocks disagree by that much). A key keeps the latest time it has seen while
// that is within a period of now, so that a clock going back a little, or clocks a
// little apart, never create allowance; beyond, its whole state moves back with it, by
// whole periods so that windows keep their places, and decides as it would have at its
// latest time: it waits at most a period longer than the rule has it, never for the
// step. The algorithms' scripts do the same in state.lua.
func Rewind(st *State, now, period int64) (by int64) {
	if ahead := st.Time - now; ahead > period {
		by = (ahead - 1) / period * period
		st.Time -= by
	}
	return by
}

// CheckN returns an error unless 1 <= n <= limit.
func CheckN(name string, n, limit int64) error {
	if n >= 1 && n <= limit {
		return nil
	}
	if n < 1 {
		return fmt.Errorf("%s: n = %d: %w", name, n, ErrInvalidN)
	}
	if n > limit {
		return fmt.Errorf("%s: n = %d, at most %d: %w", name, n, limit, ErrInvalidN)
	}
	return nil
}

// CheckRule returns an error wrapping ratelimit.ErrInvalidRule for a rule no algorithm
// can enforce exactly (see mathx.CheckRule).
func CheckRule(rule Rule) error {
	if err := mathx.CheckRule(rule.Limit, rule.Period, rule.Burst); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRule, err)
	}
	return nil
}

// Micros is a rule's period in microseconds, after checking the rule.
func Micros(name string, rule Rule) (int64, error) {
	if err := CheckRule(rule); err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return rule.Period.Microseconds(), nil
}

// Capacity is a rule's Burst, or its Limit when Burst is 0: the size of a token bucket or
// of a leaky bucket's queue.
func Capacity(rule Rule) int64 {
	if rule.Burst == 0 {
		return rule.Limit
	}
	return rule.Burst
}

// Share is 1/n of rule, for one of n parts that together enforce it (instances during an
// outage, shards of a hot key), never more: the n shares together never admit more per
// Period than the rule. Limit is divided by n, rounded down; below 1, the share is 1 per a
// Period stretched to fit (2 per second over 5 parts: 1 per 3 seconds each). Burst is
// divided likewise, and is at least 1 (a Burst of 0 stays 0, which means Limit). n below
// 2 returns the rule unchanged.
func Share(rule Rule, n int64) Rule {
	if n <= 1 || rule.Limit < 1 || rule.Period <= 0 {
		return rule
	}
	if rule.Limit >= n {
		rule.Limit /= n
	} else {
		k := (n + rule.Limit - 1) / rule.Limit // periods per event of the share
		if rule.Period > mathx.MaxPeriod/time.Duration(k) {
			rule.Period = mathx.MaxPeriod
		} else {
			rule.Period *= time.Duration(k)
		}
		rule.Limit = 1
	}
	if rule.Burst > 0 {
		rule.Burst = max(1, rule.Burst/n)
	}
	return rule
}

// Portion is part/whole of rule, for one of several parts that enforce it together
// (regions splitting a limit 70/30, say): Limit and Burst times part/whole, rounded
// down, and the same Period, so that the parts together never admit more than the rule
// in any window of any algorithm. part and whole must satisfy 1 <= part <= whole. A
// portion whose Limit, or Burst when it is set, rounds down to 0 is an error wrapping
// ratelimit.ErrInvalidRule: the rule is too small to split so, and rounding each part up
// to 1 would let the parts admit more than the rule. (Share, for n equal parts, stretches
// the Period instead.)
func Portion(rule Rule, part, whole int64) (Rule, error) {
	if err := CheckRule(rule); err != nil {
		return Rule{}, err
	}
	if part < 1 || part > whole {
		return Rule{}, fmt.Errorf("%w: a portion of %d/%d: want 1 <= part <= whole", ErrInvalidRule, part, whole)
	}
	p := Rule{Limit: mathx.MulDiv(rule.Limit, part, whole), Period: rule.Period, Burst: mathx.MulDiv(rule.Burst, part, whole)}
	if p.Limit < 1 || (rule.Burst > 0 && p.Burst < 1) {
		return Rule{}, fmt.Errorf("%w: %v is too small to split: %d/%d of it is %v", ErrInvalidRule, rule, part, whole, p)
	}
	return p, nil
}

// PortionLeases is part/whole of an in-flight limit (ratelimit.InFlightLimiter) for one of
// the parts that enforce it together (instances during an outage, regions): its leases
// scaled and rounded down, but at least one, so that every part can serve, each lease
// living as long as in the whole. A rule with no lease (an invalid one) is returned as
// it is, for Prepare to refuse.
func PortionLeases(rule Rule, part, whole int64) Rule {
	if p, err := Portion(rule, part, whole); err == nil {
		return p
	}
	if CheckRule(rule) == nil && part >= 1 && part <= whole { // fewer than one lease: one
		rule.Limit, rule.Burst = 1, 0
	}
	return rule
}

// CheckDistinct returns an error wrapping ErrDuplicateKey if two requests of a batch name
// the same algorithm, namespace and key: a batch decides each key once. The error starts
// with store's name, unless that is empty.
func CheckDistinct(store string, reqs []Request) error {
	type id struct {
		alg     *Algorithm
		ns, key string
	}
	seen := make(map[id]bool, len(reqs))
	for _, r := range reqs {
		k := id{r.Spec.Algorithm, r.Spec.Namespace, r.Key}
		if seen[k] {
			err := fmt.Errorf("%w: %s key %q of namespace %q", ErrDuplicateKey, r.Spec.Algorithm.Name, r.Key, r.Spec.Namespace)
			if store != "" {
				err = fmt.Errorf("%s: %w", store, err)
			}
			return err
		}
		seen[k] = true
	}
	return nil
}

// IsNil reports whether v is nil, or a nil pointer in an interface: what New functions
// refuse, so that a store or a client missing from the configuration fails at start, not
// at the first decision.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Clone is a copy of st that shares no memory with it.
func Clone(st State) State {
	st.Log = st.Log.Clone()
	return st
}

// BucketArgs are the Args of both buckets: Limit is the rule's capacity; a whole event is
// Unit in Level's units, and Level moves by Rate per microsecond, so that Limit/Period
// events per microsecond is exactly Rate/Unit.
func BucketArgs(name string, rule Rule, n int64) (Args, error) {
	period, err := Micros(name, rule)
	if err != nil {
		return Args{}, err
	}
	g := mathx.Gcd(period, rule.Limit) // usually one division: round periods are multiples of the limit
	unit, rate := period/g, rule.Limit/g
	capacity := Capacity(rule)
	if capacity > mathx.MaxExact/unit {
		return Args{}, fmt.Errorf("%s: %v: %w: capacity %d at %d per %v cannot be counted exactly; lower the burst or round the rate",
			name, rule, ErrInvalidRule, capacity, rule.Limit, rule.Period)
	}
	if err := CheckN(name, n, capacity); err != nil {
		return Args{}, err
	}
	return Args{N: n, Limit: capacity, Period: period, Unit: unit, Rate: rate}, nil
}

// CountArgs are the Args of an algorithm that counts events (the fixed window, its
// quotas, the sliding log): Limit is the rule's, N at most that.
func CountArgs(name string, rule Rule, n int64) (Args, error) {
	period, err := Micros(name, rule)
	if err != nil {
		return Args{}, err
	}
	if err := CheckN(name, n, rule.Limit); err != nil {
		return Args{}, err
	}
	return Args{N: n, Limit: rule.Limit, Period: period}, nil
}

// OfLeases reports whether alg is an algorithm of leases (the in-flight limit of
// ratelimit.InFlightLimiter), whose state is a set of leases each expiring by itself:
// the contract marks one by its Extend. Batches refuse its requests, and the decorators
// that split or cache a key's decisions pass them straight through.
func OfLeases(alg *Algorithm) bool { return alg != nil && alg.Extend != nil }

// WithRule is a copy of s under rule: the request of a store that divides its rule (a
// fallback's share, a region's portion, a hot key's shard).
func WithRule(s *Spec, rule Rule) *Spec {
	c := *s
	c.Rule = rule
	return &c
}

// WithOp is a copy of s that does op: a refund of what a take took, say.
func WithOp(s *Spec, op Op) *Spec {
	c := *s
	c.Op = op
	return &c
}
