package tokenbucket

import (
	"context"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Limiter is a token bucket limiter over a Store: one bucket per key, all under one Rule.
// It is safe for concurrent use.
type Limiter struct{ core core.Limiter }

var _ ratelimit.Limiter = (*Limiter)(nil)

// New returns a token bucket limiter with rule over store. It returns an error wrapping
// ratelimit.ErrInvalidRule for a rule it cannot enforce.
func New(store ratelimit.Store, rule ratelimit.Rule) (*Limiter, error) {
	c, err := core.New(store, &algorithm, rule)
	if err != nil {
		return nil, err
	}
	return &Limiter{c}, nil
}

// Allow takes one token from key's bucket, if it has one.
func (l *Limiter) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return l.core.AllowN(ctx, key, 1)
}

// AllowN takes n tokens from key's bucket, or none. n must be between 1 and the
// capacity, or the error wraps ratelimit.ErrInvalidN or ratelimit.ErrNExceedsLimit.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (ratelimit.Decision, error) {
	return l.core.AllowN(ctx, key, n)
}

// Rule is the limiter's rule.
func (l *Limiter) Rule() ratelimit.Rule { return l.core.Rule() }
