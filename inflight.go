package ratelimit

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// InFlightLimiter limits the requests in progress per key, where a rate limit counts the
// requests started: at most limit leases of a key are held at once, across every instance
// that shares the store. Acquire a lease before the work, Release it after:
//
//	inflight, err := ratelimit.NewInFlight(store, 20, 30*time.Second) // 20 in progress
//	...
//	lease, d, err := inflight.Acquire(ctx, tenant)
//	if err == nil && lease == nil {
//		// 20 requests of the tenant are in progress: reject this one
//	}
//	defer lease.Release(context.WithoutCancel(ctx))
//
// A lease expires by itself a lease duration after it was acquired or last extended. The
// leases of a holder that crashed, or of an instance that lost its connection, so come
// back without anyone releasing them. Work that may outlast the duration extends its
// lease (Lease.Extend; Middleware does it for the requests it holds). Releasing twice, or
// after the lease expired, frees nothing, and never another holder's lease. A release of
// a lease not held is remembered for a lease's duration: an acquire that reaches the
// store after its own release (its caller gave up while Redis was stalled) takes nothing.
//
// Every store runs it: localstore in memory, redisstore on Redis (one script per
// acquire, release and extend; each key's TTL follows its latest lease), and fallback,
// whose share while Redis is down is the limit divided by the instances, at least one
// lease each. The decorators of redisstore that cache, lend or split decisions (Leases,
// Shard, BlockCache) pass leases straight through.
//
// It is safe for concurrent use.
type InFlightLimiter struct {
	base *AlgorithmLimiter // of the in-flight algorithm, whose rule is the limit and the lease duration
}

// NewInFlight returns an InFlightLimiter of limit leases per key on store, each expiring
// lease after it is acquired or extended. lease must be between 1ms and 10 years, in
// whole microseconds, and limit between 1 and 2^52, or the error wraps ErrInvalidRule.
// Options are those of every limiter: its keys are in the namespace "<limit>/<lease>"
// ("20/30s"), as a rule's, unless WithNamespace names one.
func NewInFlight(store Store, limit int64, lease time.Duration, opts ...Option) (*InFlightLimiter, error) {
	base, err := NewAlgorithmLimiter(store, concurrency.Algorithm(), Rule{Limit: limit, Period: lease}, opts...)
	if err != nil {
		return nil, err
	}
	return &InFlightLimiter{base: base}, nil
}

// Rule is the limiter's limit as a Rule: at most Limit leases of a key held at once, each
// living Period after it is acquired or extended.
func (l *InFlightLimiter) Rule() Rule { return l.base.rule }

// Acquire takes one of key's leases, or says that all of them are held. When allowed,
// the Lease is held until released or expired. When denied, the Lease is nil (its Release
// is harmless), Remaining is 0, and RetryAfter is the time until enough leases expire
// for this one to fit if no one releases them. That is only the latest a lease can come
// back: a release frees one at once. Limit is the limit, Remaining the leases left after
// this one, ResetAfter the time until every lease held has expired.
func (l *InFlightLimiter) Acquire(ctx context.Context, key string) (*Lease, Decision, error) {
	return l.acquire(ctx, key, l.base.rule)
}

// AcquireLimit is Acquire with limit leases instead of the limiter's own: for a limit
// chosen per call (a route's, a tenant's plan). The key's leases are counted in the
// limiter's namespace whatever the limit, so lowering it admits no one until the leases
// held are fewer than the new limit. An invalid limit returns an error wrapping
// ErrInvalidRule and acquires nothing.
func (l *InFlightLimiter) AcquireLimit(ctx context.Context, key string, limit int64) (*Lease, Decision, error) {
	return l.acquire(ctx, key, Rule{Limit: limit, Period: l.base.rule.Period})
}

func (l *InFlightLimiter) acquire(ctx context.Context, key string, rule Rule) (*Lease, Decision, error) {
	spec := &core.Spec{Algorithm: concurrency.Algorithm(), Namespace: l.base.namespace, Rule: core.Rule(rule), Lease: newLeaseID(), Reserve: l.base.reserve(ctx)}
	o, err := l.base.store.Apply(ctx, core.Request{Key: key, N: 1, Spec: spec})
	if err != nil {
		return nil, Decision{}, err
	}
	d := decisionOf(o)
	if !d.Allowed {
		return nil, d, nil
	}
	return &Lease{limiter: l, key: key, spec: spec}, d, nil
}

// Wait acquires one of key's leases, waiting while all of them are held, until ctx ends.
// A release on another instance wakes no one, so a waiter asks the store again after a
// pause that starts at a millisecond and doubles up to 100ms (never beyond the oldest
// lease's expiry), with jitter. When ctx has a deadline that comes before the next try, it
// returns at once with an error that matches context.DeadlineExceeded. An error of the
// store is returned as it is.
func (l *InFlightLimiter) Wait(ctx context.Context, key string) (*Lease, error) {
	pause := time.Millisecond
	for {
		lease, d, err := l.Acquire(ctx, key)
		if err != nil || lease != nil {
			return lease, err
		}
		wait := min(pause, max(d.RetryAfter, time.Millisecond))
		wait = wait/2 + rand.N(wait/2+1) // jitter, so that waiters do not ask in step
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return nil, fmt.Errorf("ratelimit: waiting for a lease of %q would pass the context deadline: %w",
				key, context.DeadlineExceeded)
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
		pause = min(2*pause, maxWaitPause)
	}
}

// maxWaitPause is the longest pause of Wait between two tries.
const maxWaitPause = 100 * time.Millisecond

// Lease is one lease of an InFlightLimiter's key, held from Acquire until Release or its
// expiry. A nil *Lease, which a denied Acquire returns, holds nothing (nor does a zero
// Lease): its Release and Extend do nothing. It is safe for concurrent use.
type Lease struct {
	limiter *InFlightLimiter
	key     string
	spec    *core.Spec // of its acquire: its rule and id
}

// Release gives the lease back, so that another request of its key may start. A lease
// released already, or expired, changes nothing. Release with a context that outlives
// the work's own (context.WithoutCancel), or a request that was cancelled would keep its
// lease until it expires. An error means the store could not be told (the lease then
// expires by itself).
func (x *Lease) Release(ctx context.Context) error {
	if x == nil || x.limiter == nil {
		return nil
	}
	_, err := x.apply(ctx, core.OpRefund)
	return err
}

// Extend renews the lease for another lease duration from now, and reports whether it
// was still held: false if it had been released, had expired (another request may have
// its place now), or its key was reset. Work that may outlast the lease duration extends
// its lease well before it expires (Middleware extends every half duration).
func (x *Lease) Extend(ctx context.Context) (bool, error) {
	if x == nil || x.limiter == nil {
		return false, nil
	}
	d, err := x.apply(ctx, core.OpExtend)
	return err == nil && d.Allowed(), err
}

func (x *Lease) apply(ctx context.Context, op core.Op) (core.Outcome, error) {
	return x.limiter.base.store.Apply(ctx, core.Request{Key: x.key, N: 1, Spec: core.WithOp(x.spec, op)})
}

// keepAlive extends the lease every half lease duration, each time within timeout of
// ctx's values (not of its end), until stop is called or the lease is found gone; an
// extension's error goes to failed, when set.
func (x *Lease) keepAlive(ctx context.Context, timeout time.Duration, failed func(error)) (stop func()) {
	if x == nil {
		return func() {}
	}
	every := max(x.spec.Rule.Period/2, time.Millisecond)
	ctx = context.WithoutCancel(ctx)
	var mu sync.Mutex
	var t *time.Timer
	stopped := false
	mu.Lock()
	t = time.AfterFunc(every, func() {
		ectx, cancel := context.WithTimeout(ctx, timeout)
		held, err := x.Extend(ectx)
		cancel()
		if err != nil && failed != nil {
			failed(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped && (held || err != nil) { // an error: the store may be back by the next one
			t.Reset(every)
		}
	})
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// newLeaseID is a random lease id, never 0. Ids are unique per key in practice: two
// leases of a key sharing one needs a collision of 63 random bits among the leases held.
func newLeaseID() int64 {
	for {
		if id := rand.Int64(); id != 0 {
			return id
		}
	}
}
