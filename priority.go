package ratelimit

import (
	"context"
	"fmt"
)

// Priority ranks a request for load shedding, most important first. Under overload, a
// limiter with reserves (WithReserves) denies the least important requests first. Every
// priority counts against the same keys. The three named priorities follow Stripe's
// classes: critical traffic, the rest, and what can wait (tests, crawlers, prefetches). A
// larger Priority is less important still.
type Priority uint8

// The usual priorities.
const (
	Critical  Priority = iota // logins, payments: keeps nothing back
	Normal                    // the ordinary traffic
	Sheddable                 // the first to go: test traffic, prefetches, batch jobs
)

// String returns "critical", "normal", "sheddable", or "priority N" for the others.
func (p Priority) String() string {
	switch p {
	case Critical:
		return "critical"
	case Normal:
		return "normal"
	case Sheddable:
		return "sheddable"
	}
	return fmt.Sprintf("priority %d", uint8(p))
}

type priorityKey struct{}

// WithPriority returns a copy of ctx in which decisions are made at priority p. Every
// limiter with reserves that decides under it keeps back the reserve of p.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityFrom returns the priority WithPriority put in ctx, or Critical if it put none.
// So a request with no priority is never shed in favour of others.
func PriorityFrom(ctx context.Context) Priority {
	p, _ := ctx.Value(priorityKey{}).(Priority)
	return p
}

// WithReserves makes the limiter shed requests by priority. A request of priority p is
// admitted only if, after it, percent[p] percent of the key's allowance is still left.
// That reserve is kept for the more important priorities. The allowance is
// Decision.Limit, and the reserve is rounded down. All priorities count against the same
// key, and each takes only what it asks for. A priority past the end of the list has the
// last reserve.
//
// Each percentage must be 0 to 99, and none may be below the one before it. Otherwise
// New returns an error wrapping ErrInvalidRule. So a less important request keeps at
// least as much back.
//
// For example, take WithReserves(0, 20, 50) and a token bucket of 100. 100 Sheddable requests at once
// admit 50. Then 100 Normal ones admit 30, and then 100 Critical ones the last 20. 100ms
// later, 10 tokens are back. A Sheddable request would then be admitted in 410ms, and a
// Normal one in 110ms. A Critical one is admitted.
//
// The reserve is in each algorithm's own unit: tokens, a window's count, a sliding log's
// events, a leaky bucket's queue slots, an in-flight limit's leases. Decision.Remaining
// is what is left above the reserve. RetryAfter is the time until the request would be
// admitted at its priority.
//
// The reserve is a share of the allowance, so it follows the rule wherever the rule is
// divided. Examples are an instance's share in a fallback.Store, a shard of a hot key, and
// a rule per call.
func WithReserves(percent ...int64) Option {
	return optionFunc(func(l *AlgorithmLimiter) {
		for i, p := range percent {
			if p < 0 || p > 99 || (i > 0 && p < percent[i-1]) {
				l.err = fmt.Errorf("%w: reserves %v: want percentages of 0 to 99, none below the one before", ErrInvalidRule, percent)
				return
			}
		}
		l.reserves = append([]int64(nil), percent...)
	})
}

// priority is the index in l.takes of the reserve of ctx's priority: 0 when l has no
// reserves, without a look into ctx.
func (l *AlgorithmLimiter) priority(ctx context.Context) int {
	if len(l.reserves) == 0 {
		return 0
	}
	return min(int(PriorityFrom(ctx)), len(l.reserves)-1)
}

// reserve is the percentage a request of ctx's priority keeps back under l.
func (l *AlgorithmLimiter) reserve(ctx context.Context) int64 {
	return l.takes[l.priority(ctx)].Reserve
}
