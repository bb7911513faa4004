package ratelimit

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/trace"
)

// Event is one decision of a Middleware, as OnDecision sees it.
type Event struct {
	// Key is the request's limiter key.
	Key string
	// Policy names the limit. For a rate decision, it is the binding policy (see
	// Middleware.Policies). For a shadow decision, it is the shadowed policy. For a Limiter
	// or Decide, it is PolicyName's. For the in-flight limit, it is "in-flight".
	Policy string
	// Decision is the decision, the combined one under several policies. It is zero when
	// Err is set. When Shadowed and not Allowed, the request went on anyway.
	Decision Decision
	// InFlight reports that the decision is the in-flight limit's: a lease acquired, or
	// refused.
	InFlight bool
	// Shadowed reports that the decision was not enforced (Shadow, Policy.Shadow).
	Shadowed bool
	// Priority is the priority the request was decided at (see Middleware.Priority).
	Priority Priority
	// Source is the store that decided, when the limiter's store is a fallback.Store. It
	// is "primary" (Redis) or "secondary" (this instance's share). It is "lease" for a
	// decision that hotkey.Leases made from what it holds. It is "" for any other store.
	Source string
	// Latency is how long the decision took.
	Latency time.Duration
	// Err is the limiter's error. The request then went on or not, as Error says.
	Err error
}

// observer is what a middleware tells of its decisions: to the hook, and to the logger
// what it swallows. Either may be nil.
type observer struct {
	hook func(context.Context, Event)
	log  *slog.Logger
}

func (m *Middleware) observer() observer { return observer{m.OnDecision, m.Logger} }

// warn logs what the middleware swallows, when it has a logger.
func (o observer) warn(ctx context.Context, what, key string, err error) {
	if o.log != nil {
		o.log.WarnContext(ctx, "ratelimit: "+what, "key", key, "err", err)
	}
}

// begin starts a decision to report: ctx carrying a record of the store that decides,
// and the clock's reading, when there is a hook to tell (none read otherwise).
func (o observer) begin(ctx context.Context) (context.Context, *trace.Record, time.Time) {
	if o.hook == nil {
		return ctx, nil, time.Time{}
	}
	ctx, rec := trace.With(ctx)
	return ctx, rec, time.Now()
}

// report hands e to the hook, if any, with the store rec names and the time since start.
func (o observer) report(ctx context.Context, rec *trace.Record, start time.Time, e Event) {
	if o.hook != nil {
		e.Source, e.Latency, e.Priority = rec.Source(), time.Since(start), PriorityFrom(ctx)
		o.hook(ctx, e)
	}
}

// hold takes one of key's leases of l under limit for the call in ctx, reported as an
// in-flight decision. With a lease it returns release, which stops the lease's
// extensions (every half lease duration meanwhile) and gives it back, once; without
// one, a nil release, the Decision and the store's error.
func (o observer) hold(ctx context.Context, l *InFlightLimiter, key string, limit int64, shadow bool) (release func(), d Decision, err error) {
	tctx, rec, start := o.begin(ctx)
	lease, d, err := l.AcquireLimit(tctx, key, limit)
	o.report(ctx, rec, start, Event{Key: key, Policy: "in-flight", Decision: d, InFlight: true, Shadowed: shadow, Err: err})
	if lease == nil {
		return nil, d, err
	}
	stop := lease.keepAlive(ctx, leaseTimeout, func(err error) { o.warn(ctx, "extending a lease", key, err) })
	var once sync.Once
	return func() {
		once.Do(func() {
			stop()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseTimeout)
			defer cancel()
			if err := lease.Release(rctx); err != nil { // the lease expires by itself
				o.warn(ctx, "releasing a lease", key, err)
			}
		})
	}, d, nil
}
