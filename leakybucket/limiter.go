package leakybucket

import (
	"context"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Limiter is a leaky bucket limiter over a Store: one queue per key, all under one Rule.
// It is safe for concurrent use.
type Limiter struct{ core core.Limiter }

var _ ratelimit.Limiter = (*Limiter)(nil)

// New returns a leakybucket limiter with rule over store. It returns an error wrapping
// ratelimit.ErrInvalidRule for a rule it cannot enforce.
func New(store ratelimit.Store, rule ratelimit.Rule) (*Limiter, error) {
	c, err := core.New(store, &algorithm, rule)
	if err != nil {
		return nil, err
	}
	return &Limiter{c}, nil
}

// Allow admits one request to key's queue, if it has a free place; see Decision.Delay.
func (l *Limiter) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return l.core.AllowN(ctx, key, 1)
}

// AllowN admits n requests to key's queue, or none. n must be between 1 and the
// queue size, or the error wraps ratelimit.ErrInvalidN or ratelimit.ErrNExceedsLimit.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (ratelimit.Decision, error) {
	return l.core.AllowN(ctx, key, n)
}

// Rule is the limiter's rule.
func (l *Limiter) Rule() ratelimit.Rule { return l.core.Rule() }
