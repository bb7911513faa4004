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

// InFlightLimiter limits the requests in progress per key. Where a rate limit counts the
// requests started, this counts those not yet done. At most limit leases of a key are
// held at once, across every instance that shares the store. Acquire a lease before the
// work, and Release it after:
//
//	inflight, err := ratelimit.NewInFlight(store, 20, 30*time.Second) // 20 in progress
//	...
//	lease, d, err := inflight.Acquire(ctx, tenant)
//	if err == nil && lease == nil {
//		// 20 requests of the tenant are in progress: reject this one
//	}
//	defer lease.Release(context.WithoutCancel(ctx))
//
// A lease expires by itself, a lease duration after it was acquired or last extended. So
// the leases of a crashed holder come back without a release. So do those of an instance
// that lost its connection. Work that may outlast the duration extends its lease
// (Lease.Extend). Middleware does that for the requests it holds. Releasing twice, or
// after the lease expired, frees nothing. It never frees another holder's lease.
//
// A release of a lease not held is remembered for a lease duration. An acquire that
// reaches the store after its own release then takes nothing. That happens when its
// caller gave up while Redis was stalled.
//
// Every store runs it: localstore in memory, redisstore on Redis, and fallback. On Redis,
// each acquire, release and extend is atomic, and a key's TTL follows its latest lease.
// While Redis is down, fallback's share is the limit divided by the instances. Each
// instance gets at least one lease. The redisstore decorators that cache, lend or split
// decisions (Leases, Shard, BlockCache) pass leases straight through.
//
// It is safe for concurrent use.
type InFlightLimiter struct {
	base *AlgorithmLimiter // of the in-flight algorithm, whose rule is the limit and the lease duration
}

// NewInFlight returns an InFlightLimiter of limit leases per key on store. Each lease
// expires lease after it is acquired or extended. The lease must be between 1ms and 10
// years, in whole microseconds. The limit must be between 1 and 2^52. Otherwise the error
// wraps ErrInvalidRule. The options are those of every limiter. Its keys are in the
// namespace "<limit>/<lease>", such as "20/30s", unless WithNamespace names one.
func NewInFlight(store Store, limit int64, lease time.Duration, opts ...Option) (*InFlightLimiter, error) {
	base, err := NewAlgorithmLimiter(store, concurrency.Algorithm(), Rule{Limit: limit, Period: lease}, opts...)
	if err != nil {
		return nil, err
	}
	return &InFlightLimiter{base: base}, nil
}

// Rule returns the limiter's limit as a Rule. At most Limit leases of a key are held at
// once. Each lives Period after it is acquired or extended.
func (l *InFlightLimiter) Rule() Rule { return l.base.rule }

// Acquire takes one of key's leases, or reports that all of them are held. When allowed,
// the Lease is held until it is released or expires. When denied, the Lease is nil, and
// its Release is harmless.
//
// In the Decision, Limit is the limit, and Remaining the leases left after this one.
// ResetAfter is the time until every lease held has expired. When denied, Remaining is 0.
// RetryAfter is then the time until enough leases expire for this one to fit, if no one
// releases them. That is only the latest a lease can come back: a release frees one at
// once.
func (l *InFlightLimiter) Acquire(ctx context.Context, key string) (*Lease, Decision, error) {
	return l.acquire(ctx, key, l.base.rule)
}

// AcquireLimit is Acquire with limit leases instead of the limiter's own. It is for a
// limit chosen per call, such as a route's or a tenant's plan. The key's leases are
// counted in the limiter's namespace whatever the limit. So after the limit is lowered, no
// one is admitted until fewer leases than the new limit are held. An invalid limit
// returns an error wrapping ErrInvalidRule, and acquires nothing.
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
// A release on another instance wakes no one. So a waiter asks the store again after a
// pause, with jitter. The pause starts at a millisecond and doubles up to 100ms. It never
// goes beyond the oldest lease's expiry. If ctx's deadline comes before the next try,
// Wait returns at once, with an error that matches context.DeadlineExceeded. An error of
// the store is returned as it is.
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

// Lease is one lease of an InFlightLimiter's key. It is held from Acquire until Release
// or its expiry. A denied Acquire returns a nil *Lease. A nil *Lease holds nothing, and
// neither does a zero Lease. Their Release and Extend do nothing. A Lease is safe for
// concurrent use.
type Lease struct {
	limiter *InFlightLimiter
	key     string
	spec    *core.Spec // of its acquire: its rule and id
}

// Release gives the lease back, so that another request of its key may start. Releasing
// a lease that was released already, or has expired, changes nothing. Release with a
// context that outlives the work's own (context.WithoutCancel). Otherwise a request that
// was cancelled keeps its lease until it expires. An error means the store could not be
// told. The lease then expires by itself.
func (x *Lease) Release(ctx context.Context) error {
	if x == nil || x.limiter == nil {
		return nil
	}
	_, err := x.apply(ctx, core.OpRefund)
	return err
}

// Extend renews the lease for another lease duration from now. It reports whether the
// lease was still held. It reports false if the lease was released, expired, or its key
// was reset. Another request may then have its place. Work that may outlast the lease
// duration extends its lease well before it expires. Middleware extends every half
// duration.
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
