package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
	"strconv"

	"github.com/ratelimit-go/ratelimit/internal/fast"
)

// AlgorithmLimiter is a Limiter that runs one Algorithm under one Rule on a Store, in one
// namespace. Each algorithm package's Limiter embeds it, so its methods are every
// algorithm's. It is safe for concurrent use.
//
// Limiters count together exactly when they share a store, an algorithm, a namespace and
// a key. The namespace is the rule's by default ("100/1s" for PerSecond(100)), so two
// limiters of different rules never share a count, while the same limiter in every
// instance of an application does (on a shared store such as Redis). Name the namespace
// with WithNamespace when two limiters of the same rule must count apart (logins and
// password resets, both 5 an hour), or when the rule may change and the counts should
// carry over.
type AlgorithmLimiter struct {
	store     Store
	alg       *Algorithm
	rule      Rule
	namespace string
	limit     int64    // the largest n the rule can ever allow
	take      takeFunc // AllowN's and AllowRule's path when the store is a binder (and no reserve or window); nil otherwise
	reserves  []int64  // by priority, in percent (WithReserves); nil for none
	err       error    // an option's
}

// binder is a store of this module that finds once what every take of one limiter
// shares (localstore): a limiter binds its algorithm and namespace when it is made, and
// sends AllowN and AllowRule through the takeFunc, whose Outcome comes back in registers
// (see package internal/fast); every other call goes through Apply. Its method's type
// names an internal package, so no store outside this module can be one.
type binder interface {
	Bind(alg *Algorithm, namespace string) func(ctx context.Context, key string, rule Rule, n int64) (fast.Outcome, int64, error)
}

// takeFunc is what Apply does for a take of n on key under rule, in the bound algorithm
// and namespace, without a lease: the Decision is the Outcome's, with limit.
type takeFunc = func(ctx context.Context, key string, rule Rule, n int64) (o fast.Outcome, limit int64, err error)

var _ Limiter = (*AlgorithmLimiter)(nil)

// Option configures a limiter of any algorithm.
type Option interface{ apply(*AlgorithmLimiter) }

type optionFunc func(*AlgorithmLimiter)

func (f optionFunc) apply(l *AlgorithmLimiter) { f(l) }

// WithNamespace puts the limiter's keys in namespace instead of the rule's. Name every
// limiter's namespace: without one, a limiter whose rule changes starts every key from
// full, and during a rolling deploy the instances of the old rule and of the new one count
// apart, admitting up to twice the limit between them. A name also keeps two limiters of
// one rule apart (logins and password resets, both 5 an hour). Any string is a namespace,
// the empty one included (see AlgorithmLimiter).
func WithNamespace(namespace string) Option {
	return optionFunc(func(l *AlgorithmLimiter) { l.namespace = namespace })
}

// NewAlgorithmLimiter validates rule for alg and returns an AlgorithmLimiter on store. The
// error wraps ErrInvalidRule for a rule alg cannot enforce. Algorithm packages call it;
// users call their New.
func NewAlgorithmLimiter(store Store, alg *Algorithm, rule Rule, opts ...Option) (*AlgorithmLimiter, error) {
	if alg == nil || alg.Prepare == nil || alg.Step == nil {
		return nil, errors.New("ratelimit: nil algorithm")
	}
	if store == nil {
		return nil, errors.New(alg.Name + ": store is nil")
	}
	a, err := alg.Prepare(rule, 1)
	if err != nil {
		return nil, err
	}
	l := &AlgorithmLimiter{store: store, alg: alg, rule: rule, limit: a.Limit, namespace: ruleNamespace(rule)}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New(alg.Name + ": nil option")
		}
		o.apply(l)
	}
	if l.err != nil {
		return nil, fmt.Errorf("%s: %w", alg.Name, l.err)
	}
	// the bound take decides a plain take; a reserve and a window go through Apply
	if b, ok := store.(binder); ok && alg.Window == nil && l.reserves == nil {
		l.take = b.Bind(alg, l.namespace)
	}
	return l, nil
}

// Rule is the limiter's rule, the one Allow and AllowN decide under.
func (l *AlgorithmLimiter) Rule() Rule { return l.rule }

// Namespace is the namespace of the limiter's keys (see WithNamespace).
func (l *AlgorithmLimiter) Namespace() string { return l.namespace }

// ruleNamespace is the default namespace of a rule: "100/1s", or "100/1s/200" with a
// burst.
func ruleNamespace(r Rule) string {
	ns := strconv.FormatInt(r.Limit, 10) + "/" + r.Period.String()
	if r.Burst != 0 {
		ns += "/" + strconv.FormatInt(r.Burst, 10)
	}
	return ns
}

// Allow is AllowN with n = 1.
func (l *AlgorithmLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	// AllowN's body again, not a call of it: a Decision returned from AllowN would be
	// copied once more through memory (see package internal/fast)
	if l.take == nil {
		return l.apply(ctx, key, l.rule, 1)
	}
	o, limit, err := l.take(ctx, key, l.rule, 1)
	return Decision{Allowed: o.Allowed, Limit: limit, Remaining: o.Remaining,
		RetryAfter: o.RetryAfter(), ResetAfter: o.ResetAfter, Delay: o.Delay()}, err
}

// AllowN admits n events for key, all or none. n must be between 1 and the most the rule
// allows at once (Decision.Limit), or the error wraps ErrInvalidN and
// nothing is consumed.
func (l *AlgorithmLimiter) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	if l.take == nil {
		return l.apply(ctx, key, l.rule, n)
	}
	o, limit, err := l.take(ctx, key, l.rule, n) // which validates n as Apply does
	return Decision{Allowed: o.Allowed, Limit: limit, Remaining: o.Remaining,
		RetryAfter: o.RetryAfter(), ResetAfter: o.ResetAfter, Delay: o.Delay()}, err
}

// apply is a take through Store.Apply, for a store that is not a binder or a request that
// keeps a reserve.
func (l *AlgorithmLimiter) apply(ctx context.Context, key string, rule Rule, n int64) (Decision, error) {
	if rule == l.rule && (n < 1 || n > l.limit) { // the store is not asked
		return Decision{}, badN(l.alg, rule, n)
	}
	reserve := l.reserve(ctx)
	if err := l.fits(ctx, rule, n, reserve); err != nil {
		return Decision{}, err
	}
	return l.store.Apply(ctx, Request{Algorithm: l.alg, Namespace: l.namespace, Key: key, Rule: rule, N: n,
		Reserve: reserve})
}

// fits is the error for n events that a request of ctx's priority, which must leave
// reserve percent of rule's allowance, can never take: more than the allowance less its
// reserve. nil when it can, or when rule or n are invalid (the store says so).
func (l *AlgorithmLimiter) fits(ctx context.Context, rule Rule, n, reserve int64) error {
	if reserve == 0 {
		return nil
	}
	limit := l.limit
	if rule != l.rule {
		a, err := l.alg.Prepare(rule, n)
		if err != nil {
			return nil
		}
		limit = a.Limit
	}
	if keep := mathx.Keep(limit, reserve); n > limit-keep {
		return fmt.Errorf("%s: n = %d: %w: a request of priority %v may take at most %d of %d, leaving %d%% to more important ones",
			l.alg.Name, n, ErrInvalidN, PriorityFrom(ctx), limit-keep, limit, reserve)
	}
	return nil
}

// AllowRule is AllowN under rule instead of the limiter's own: for a rule chosen per call
// (a tenant's plan, looked up per request). The key is counted in the limiter's
// namespace whatever the rule, so a key whose rule changes keeps its count (give such a
// limiter a namespace with WithNamespace). An invalid rule, or an n it cannot allow,
// returns an error wrapping ErrInvalidRule or ErrInvalidN and consumes
// nothing.
func (l *AlgorithmLimiter) AllowRule(ctx context.Context, key string, rule Rule, n int64) (Decision, error) {
	if l.take == nil {
		return l.apply(ctx, key, rule, n)
	}
	o, limit, err := l.take(ctx, key, rule, n)
	return Decision{Allowed: o.Allowed, Limit: limit, Remaining: o.Remaining,
		RetryAfter: o.RetryAfter(), ResetAfter: o.ResetAfter, Delay: o.Delay()}, err
}

// badN is the error for an n out of range of rule, as Prepare, the one place that words
// it, has it.
func badN(alg *Algorithm, rule Rule, n int64) error {
	_, err := alg.Prepare(rule, n)
	if err == nil { // cannot happen for an n out of range; never return a nil error here
		err = fmt.Errorf("%s: n = %d: %w", alg.Name, n, ErrInvalidN)
	}
	return err
}

// PeekN is the Decision AllowN(ctx, key, n) would give now, at ctx's priority, consuming
// nothing.
func (l *AlgorithmLimiter) PeekN(ctx context.Context, key string, n int64) (Decision, error) {
	return l.do(ctx, key, n, "peek")
}

// Refund gives back n events taken for key before (a request the upstream failed, say),
// never above the key's full allowance; the Decision is Peek's after it. What is given back
// depends on the algorithm: tokens to a token bucket, places in a leaky bucket's queue,
// events off a window's current count (not off a past window's), the newest events of a
// sliding log.
func (l *AlgorithmLimiter) Refund(ctx context.Context, key string, n int64) (Decision, error) {
	return l.do(ctx, key, n, "refund")
}

// Reset forgets key: its next decision sees it full (after a successful login, say).
func (l *AlgorithmLimiter) Reset(ctx context.Context, key string) error {
	_, err := l.do(ctx, key, 1, "reset")
	return err
}

func (l *AlgorithmLimiter) do(ctx context.Context, key string, n int64, op string) (Decision, error) {
	if n < 1 || n > l.limit {
		return Decision{}, badN(l.alg, l.rule, n)
	}
	req := Request{Algorithm: l.alg, Namespace: l.namespace, Key: key, Rule: l.rule, N: n, Op: op}
	if op == "peek" {
		req.Reserve = l.reserve(ctx)
	}
	return l.store.Apply(ctx, req)
}

// base is how AllowAll finds the AlgorithmLimiter inside an algorithm's
// Limiter.
func (l *AlgorithmLimiter) base() *AlgorithmLimiter { return l }
