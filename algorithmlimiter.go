package ratelimit

import (
	"context"
	"errors"
	"fmt"
)

// AlgorithmLimiter is a Limiter that runs one Algorithm under one Rule on a Store. Each
// algorithm package's Limiter embeds it. It is safe for concurrent use.
type AlgorithmLimiter struct {
	store Store
	alg   *Algorithm
	rule  Rule
	limit int64 // the largest n the rule can ever allow
}

var _ Limiter = (*AlgorithmLimiter)(nil)

// NewAlgorithmLimiter validates rule for alg and returns an AlgorithmLimiter on store. The
// error wraps ErrInvalidRule for a rule alg cannot enforce.
func NewAlgorithmLimiter(store Store, alg *Algorithm, rule Rule) (*AlgorithmLimiter, error) {
	if alg == nil {
		return nil, errors.New("ratelimit: nil algorithm")
	}
	if store == nil {
		return nil, errors.New(alg.Name + ": store is nil")
	}
	a, err := alg.Prepare(rule, 1)
	if err != nil {
		return nil, err
	}
	return &AlgorithmLimiter{store: store, alg: alg, rule: rule, limit: a.Limit}, nil
}

// Allow is AllowN with n = 1.
func (l *AlgorithmLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN admits n events for key, all or none. n must be between 1 and the most the rule
// allows at once (Decision.Limit), or the error wraps ErrInvalidN or ErrNExceedsLimit and
// the store is not asked. It is small enough to be inlined, which saves a frame's copies
// of the Request and the Decision.
func (l *AlgorithmLimiter) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	if n < 1 || n > l.limit {
		return Decision{}, l.badN(n)
	}
	return l.store.Apply(ctx, Request{Algorithm: l.alg, Key: key, Rule: l.rule, N: n})
}

// badN is the error for an n out of range, as Prepare, the one place that words it, has it.
func (l *AlgorithmLimiter) badN(n int64) error {
	_, err := l.alg.Prepare(l.rule, n)
	if err == nil { // cannot happen for an n out of range; never return a nil error here
		err = fmt.Errorf("%s: n = %d: %w", l.alg.Name, n, ErrInvalidN)
	}
	return err
}

// Peek is PeekN with n = 1.
func (l *AlgorithmLimiter) Peek(ctx context.Context, key string) (Decision, error) {
	return l.PeekN(ctx, key, 1)
}

// PeekN is the Decision AllowN(ctx, key, n) would give now, consuming nothing.
func (l *AlgorithmLimiter) PeekN(ctx context.Context, key string, n int64) (Decision, error) {
	return l.do(ctx, key, n, Peek)
}

// Refund gives back n events taken for key before (a request the upstream failed, say),
// never above the key's full allowance; the Decision is Peek's after it. What is given back
// depends on the algorithm: tokens to a token bucket, places in a leaky bucket's queue,
// events off a window's current count (not off a past window's), the newest events of a
// sliding log.
func (l *AlgorithmLimiter) Refund(ctx context.Context, key string, n int64) (Decision, error) {
	return l.do(ctx, key, n, Refund)
}

// Reset forgets key: its next decision sees it full (after a successful login, say).
func (l *AlgorithmLimiter) Reset(ctx context.Context, key string) error {
	_, err := l.do(ctx, key, 1, Reset)
	return err
}

func (l *AlgorithmLimiter) do(ctx context.Context, key string, n int64, op Op) (Decision, error) {
	if n < 1 || n > l.limit {
		return Decision{}, l.badN(n)
	}
	return l.store.Apply(ctx, Request{Algorithm: l.alg, Key: key, Rule: l.rule, N: n, Op: op})
}

// Rule is the limiter's rule.
func (l *AlgorithmLimiter) Rule() Rule { return l.rule }

// Algorithm is the limiter's algorithm.
func (l *AlgorithmLimiter) Algorithm() *Algorithm { return l.alg }

// Store is the limiter's store.
func (l *AlgorithmLimiter) Store() Store { return l.store }
