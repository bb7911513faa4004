// Package fallback is a fail-open ratelimit.Store: it asks a primary store (Redis) first,
// within a short timeout and behind a circuit breaker, and when the primary cannot decide
// it decides on a secondary store (in memory) with a share of the rule, so that the
// application keeps serving and keeps its protection.
//
//	limiter, err := tokenbucket.New(fallback.New(redisstore.New(client), localstore.New(),
//		fallback.WithInstances(20)), rule)
//
// While the primary is down, each of n instances enforces 1/n of every rule on its
// secondary (WithInstances, or WithInstanceCount for a number learned at run time), and
// while it decides, each instance mirrors its decisions onto its share, so that the
// instances together never admit more than twice the rule in any interval (see Store).
// The timeout (WithTimeout, 5ms by default) must cover the primary's round trip with room
// for the slow ones: see WithTimeout for the breaker and how to choose it, and New for
// the go-redis settings that go with it. WithHooks reports decisions by source, the
// primary's errors and latency, and the breaker's changes of state, with plain callbacks,
// for Prometheus or OpenTelemetry; WithLogger logs the breaker's openings with their
// cause.
package fallback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/trace"
)

// Defaults of the options.
const (
	DefaultTimeout     = 5 * time.Millisecond
	DefaultFailureRate = 0.5
	DefaultMinCalls    = 20
	DefaultWindow      = time.Second
	DefaultOpenFor     = time.Second
)

// Policy is what the store does while the primary cannot decide.
type Policy int

const (
	// LocalShare decides on the secondary with 1/n of the rule (the default).
	LocalShare Policy = iota
	// FailOpen allows every request: availability over protection.
	FailOpen
	// FailClosed denies every request, retrying when the breaker next probes: protection over
	// availability.
	FailClosed
)

// Source is the store a decision came from.
type Source int

const (
	Primary Source = iota
	Secondary
)

func (s Source) String() string {
	if s == Primary {
		return "primary"
	}
	return "secondary"
}

// Hooks are callbacks for metrics and logs; a nil one is not called. They run on the
// decision's goroutine and must be fast and safe for concurrent use.
type Hooks struct {
	// OnDecision is called once for each decision made, a take (AllowN, an in-flight
	// acquire, each request of an ApplyAll), with its source, and the time the primary
	// took when the source is Primary; not for errors, nor for the calls that decide
	// nothing (peeks, refunds, resets, a lease's release or extension).
	OnDecision func(source Source, latency time.Duration)
	// OnPrimaryError is called for each failed call of the primary, with its error, and
	// whether it counted as a failure for the breaker.
	OnPrimaryError func(err error, failure bool)
	// OnStateChange is called when the breaker changes state.
	OnStateChange func(from, to BreakerState)
}

// Store is a fail-open ratelimit.Store. It is safe for concurrent use.
//
// # While the primary is down
//
// With WithInstances(n), or WithInstanceCount(f) for a number learned at run time (see
// members.Members), each of n instances enforces 1/n of every rule on its secondary,
// never rounded up: Limit and Burst divided by n and rounded down, a share below 1 per
// Period becoming 1 per a longer Period (2 per second over 5 instances: 1 per 3 seconds
// each), and Burst at least 1. With 4 instances and a limit of 100, each admits 25. An
// in-flight limit (ratelimit.InFlightLimiter) is divided likewise, at least one lease
// each; the leases taken on the primary are mirrored onto the share (below), so that
// their releases and extensions find them there while the primary is down.
// WithPolicy chooses instead to allow everything (FailOpen) or deny everything
// (FailClosed) while the primary is down.
//
// While the primary decides, each instance mirrors its decisions onto its share: an
// admission takes from the share, a denial (the key spent cluster-wide) empties it. So a
// share never hands out again what the primary has just admitted, and a breaker that
// flaps does not let each store admit a full allowance in turn. Nothing decided locally
// is replayed into the primary when it comes back.
//
// The bound. Over any interval, the instances together admit at most what the rule
// allows on the primary plus the sum of their shares' allowances, each share less what
// the primary admitted for its instance: so never more than twice the rule, and the
// whole rule only when the primary had admitted nothing for the instances that then
// decide locally. When a rule is smaller than n at once (2 at once over 5 instances),
// each share still holds 1, so n may pass at once. TestBreakerFlaps drives n instances
// at one small key while the primary fails and heals every half second: they admit 31 in
// 30s where the rule allows 32.
type Store struct {
	primary, secondary ratelimit.Store
	instances          int64
	count              func() int // the instances learned (WithInstanceCount); nil: instances
	timeout            time.Duration
	policy             Policy
	hooks              Hooks
	clock              clock.Clock
	breaker            breaker
	log                *slog.Logger
	lastErr            atomic.Pointer[error] // the primary's latest failure, for the log
	lastLogged         atomic.Int64          // UnixNano of the latest error logged that opens nothing
}

var _ ratelimit.Store = (*Store)(nil)

// Option configures a Store.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithInstanceCount makes the number of instances sharing the rule while the primary is
// down whatever count returns at each decision (less than 1 means 1): the number of
// instances alive, learned while the primary was up, such as members.Members.Count.
// It replaces WithInstances.
func WithInstanceCount(count func() int) Option {
	return optionFunc(func(s *Store) { s.count = count })
}

// WithInstances says how many instances share the rule while the primary is down: each
// enforces 1/n of it (1 by default: the whole rule; less than 1 means 1).
func WithInstances(n int) Option {
	return optionFunc(func(s *Store) { s.instances, s.count = int64(max(1, n)), nil })
}

// WithTimeout bounds each call of the primary (DefaultTimeout by default; 0 or less means
// the default).
//
// # Timeout and breaker
//
// A decision waits for the primary at most the timeout (WithTimeout, 5ms by default),
// whatever the primary's client does with its context: the call returns at the timeout
// even if the client keeps waiting in the background. When at least half of the calls of
// the last second failed (a timeout, or an error wrapping ratelimit.ErrUnavailable), and
// there were at least 20, the breaker opens (see Breaker): for a second no decision
// tries the primary, so none pays the timeout. A burst of timeouts among many answers
// (callers starved of CPU together), or within a tenth of a second (a load's start),
// does not open it; a primary that is down opens it within about half a second of
// traffic, and below 20 calls a second it stays closed, each call paying the timeout.
// Then a single probe goes to the primary; its success closes the breaker, its failure
// opens it for another second. An
// error that says nothing about availability (a missing script, say) is answered from the
// secondary too, but does not count as a failure; neither does a caller that gives up:
// a decision whose context ends returns ctx.Err().
//
// A decision the primary is too slow for is decided again on the secondary, though the
// primary may still count it when it gets there: fail-open errs towards admitting. A
// timeout too close to the primary's normal latency turns that into steady overshoot,
// and each instance then enforces its share, not the cluster's limit; watch
// OnDecision's sources.
//
// # Choosing the timeout
//
// The timeout is the most a decision waits for the primary, so it must cover the
// primary's round trip with room for the slow ones: measure the round trip where the
// application runs (OnDecision reports the primary's latency of every decision it makes;
// or redis-cli --latency from an instance), and choose the timeout above its 99th
// percentile, with a millisecond or more of slack for the moments the process waits for a
// CPU. With the default of 5ms, a Redis 1ms away decides all the decisions, one 2.5ms
// away about 99% of them, and one 4ms away 88 to 99% (TestRedisFarAway measures it
// through a delaying proxy; BENCHMARKS.md has the figures): the last millisecond of a
// timeout is thin slack. For a Redis across a region, raise it. The timeout is spent only
// while the primary is slow: a primary that is down opens the breaker, and then no
// decision waits. A reply that comes after its decision's timeout is still read by
// redisstore, and its connection kept, so a slow moment does not cost the next decisions
// a new connection.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.timeout = d
		}
	})
}

// WithPolicy sets what happens while the primary cannot decide (LocalShare by default).
func WithPolicy(p Policy) Option {
	return optionFunc(func(s *Store) { s.policy = p })
}

// WithBreaker configures the circuit breaker; zero fields keep their defaults.
func WithBreaker(b Breaker) Option {
	return optionFunc(func(s *Store) {
		if b.FailureRate > 0 && b.FailureRate <= 1 {
			s.breaker.rate = b.FailureRate
		}
		if b.MinCalls > 0 {
			s.breaker.minCalls = int64(b.MinCalls)
		}
		if b.Window >= slices {
			s.breaker.slice = int64(b.Window / slices)
		}
		if b.OpenFor > 0 {
			s.breaker.openFor = b.OpenFor
		}
	})
}

// WithHooks sets callbacks for metrics and logs.
func WithHooks(h Hooks) Option {
	return optionFunc(func(s *Store) { s.hooks = h })
}

// WithLogger logs what the store swallows while it keeps deciding: at Warn, each time the
// breaker opens (with the primary's error that opened it) and the primary's errors that
// open nothing (a missing script, a reply of the wrong shape: at most one a second); at
// Info, each time the primary decides again. nil logs nothing, the default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(s *Store) { s.log = l })
}

// WithClock sets the clock of the breaker and of the latency hooks (clock.NewMonotonic()
// by default; nil means the default). It does not change the stores' clocks.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) {
		if c != nil {
			s.clock = c
		}
	})
}

// New returns a Store that asks primary first and secondary when primary cannot decide.
// It panics with a message that says so for a nil store or a nil option, as net/http does
// for a nil handler: a fallback without a secondary would fail only during an outage.
//
// # go-redis settings
//
// For the timeout to stop the work as well as the wait, let go-redis honour context
// deadlines, and keep its own timeouts short so that an outage does not pile up
// connections and goroutines:
//
//	redis.NewClient(&redis.Options{
//		Addr:                  addr,
//		ContextTimeoutEnabled: true,                   // stop waiting for a connection at the decision's deadline
//		DialTimeout:           100 * time.Millisecond, // reconnect attempts fail fast
//		DialerRetries:         1,                      // not 5 attempts, 100ms apart, per call
//		ReadTimeout:           50 * time.Millisecond,  // how long a late reply is waited for
//		WriteTimeout:          50 * time.Millisecond,
//		PoolTimeout:           10 * time.Millisecond,  // a saturated pool fails fast
//		MaxRetries:            -1,                     // redisstore never retries its scripts anyway
//	})
//
// and call redisstore's LoadScripts before serving: it loads the scripts and opens the
// connections the first decisions will use, so that none of them pays a dial and a
// handshake inside its timeout.
func New(primary, secondary ratelimit.Store, opts ...Option) *Store {
	if core.IsNil(primary) || core.IsNil(secondary) {
		panic("fallback: New needs a primary and a secondary store; one is nil")
	}
	s := &Store{
		primary:   primary,
		secondary: secondary,
		instances: 1,
		timeout:   DefaultTimeout,
		clock:     clock.NewMonotonic(),
	}
	s.breaker.rate, s.breaker.minCalls, s.breaker.openFor = DefaultFailureRate, DefaultMinCalls, DefaultOpenFor
	s.breaker.slice = int64(DefaultWindow / slices)
	for _, o := range opts {
		if o == nil {
			panic("fallback: New with a nil option")
		}
		o.apply(s)
	}
	s.breaker.clock, s.breaker.onChange = s.clock, s.hooks.OnStateChange
	if s.log != nil {
		hook := s.hooks.OnStateChange
		s.breaker.onChange = func(from, to BreakerState) {
			if hook != nil {
				hook(from, to)
			}
			s.logChange(from, to)
		}
	}
	return s
}

// BreakerState is the breaker's state now.
func (s *Store) BreakerState() BreakerState { return BreakerState(s.breaker.state.Load()) }

// Apply decides req on the primary, or on the secondary when the primary cannot. It
// returns an error for an invalid request (before asking either store), ctx.Err() when
// the caller's context ends, and the secondary's errors; never the primary's.
func (s *Store) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	if req.Algorithm == nil {
		return ratelimit.Decision{}, errors.New("fallback: request has no algorithm")
	}
	a, err := req.Algorithm.Prepare(req.Rule, req.N)
	if err != nil {
		return ratelimit.Decision{}, err // the caller's mistake, not the primary's
	}
	if ok, probe := s.breaker.allow(); ok {
		decisions := 0
		if req.Op == "" {
			decisions = 1
		}
		d, err := askPrimary(ctx, s, probe, decisions, func(pctx context.Context) (ratelimit.Decision, error) {
			return s.primary.Apply(pctx, req)
		})
		if err == nil && s.policy == LocalShare {
			s.mirror(ctx, req, d)
		}
		if err == nil || ctx.Err() != nil {
			return d, err
		}
	}
	return s.decideLocally(ctx, req, a.Limit)
}

// mirror applies to the secondary, on this instance's share, what the primary decided
// for it, so that when the primary fails the share has already spent what the cluster
// has: an admission of n takes n from the share if it holds them, a denial (the key is
// spent cluster-wide) empties it, and a refund or a reset gives back. Without it the
// primary and the shares each admit a full allowance whenever the breaker flaps. The
// leases of an in-flight limit are mirrored one by one, with their ids, so that a
// release or an extension finds its lease on the share too; a denial leaves the share's
// leases alone.
func (s *Store) mirror(ctx context.Context, req ratelimit.Request, d ratelimit.Decision) {
	if req.Op == "peek" {
		return
	}
	req.Rule = s.share(req)
	if req.Op == "extend" && !d.Allowed {
		return // a lease the primary no longer holds: the share's copy expires by itself
	}
	if req.Op == "" {
		share := shareCapacity(req)
		if share == 0 || (!d.Allowed && d.Remaining > 0) { // nothing to mirror; or n was too many, the key not spent
			return
		}
		if !d.Allowed && core.OfLeases(req.Algorithm) {
			return // the share's leases are those of requests in progress: they stay
		}
		if !d.Allowed {
			empty := req
			empty.Op = "reset"
			s.secondary.Apply(ctx, empty)
			req.N = share // all of a full share
		}
		req.N = min(req.N, share)
	}
	s.secondary.Apply(ctx, req) // a denial means the share is already spent
}

// share is this instance's share of req's rule: 1/n of it (core.Share), or for an
// in-flight limit 1/n of its leases, rounded down but at least one, each living as long
// as on the primary.
func (s *Store) share(req ratelimit.Request) ratelimit.Rule {
	if !core.OfLeases(req.Algorithm) {
		return core.Share(req.Rule, s.n())
	}
	return core.PortionLeases(req.Rule, 1, s.n())
}

// n is the number of instances sharing the rule now.
func (s *Store) n() int64 {
	if s.count != nil {
		return int64(max(1, s.count()))
	}
	return s.instances
}

type outcome[T any] struct {
	v   T
	err error
}

// askPrimary calls the primary with call until the timeout, then records the outcome
// with the breaker and the hooks. A nil error means the value is the primary's.
// It reports decisions decisions (the takes of the call) to OnDecision.
func askPrimary[T any](ctx context.Context, s *Store, probe bool, decisions int, call func(context.Context) (T, error)) (T, error) {
	var start time.Time
	if s.hooks.OnDecision != nil {
		start = s.clock.Now()
	}
	pctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	done := make(chan outcome[T], 1) // buffered: a primary that answers late never blocks
	go func() {
		var o outcome[T]
		defer func() { // a panic in the primary is its failure, not the process's end
			if p := recover(); p != nil {
				o = outcome[T]{err: fmt.Errorf("fallback: the primary store panicked: %v: %w", p, ratelimit.ErrUnavailable)}
			}
			done <- o
		}()
		o.v, o.err = call(pctx)
	}()
	var o outcome[T]
	select {
	case o = <-done:
	case <-pctx.Done():
		o.err = pctx.Err()
	}
	var zero T
	switch {
	case o.err == nil:
		s.breaker.success(probe)
		if decisions > 0 {
			trace.Set(ctx, Primary.String())
		}
		if s.hooks.OnDecision != nil {
			latency := s.clock.Now().Sub(start)
			for range decisions {
				s.hooks.OnDecision(Primary, latency)
			}
		}
		return o.v, nil
	case ctx.Err() != nil: // the caller gave up: that says nothing about the primary
		s.breaker.abandon(probe)
		return zero, ctx.Err()
	}
	failure := errors.Is(o.err, context.DeadlineExceeded) || errors.Is(o.err, ratelimit.ErrUnavailable)
	if failure {
		how := failed
		if errors.Is(o.err, context.DeadlineExceeded) {
			how = timedOut
		}
		s.breaker.failure(probe, how)
	} else {
		s.breaker.abandon(probe)
	}
	if s.hooks.OnPrimaryError != nil {
		s.hooks.OnPrimaryError(o.err, failure)
	}
	if s.log != nil {
		s.logError(ctx, o.err, failure)
	}
	return zero, o.err
}

// logError keeps a failure for the log line of the breaker's opening, and logs an error
// that opens nothing, at most once a second.
func (s *Store) logError(ctx context.Context, err error, failure bool) {
	if failure {
		s.lastErr.Store(&err)
		return
	}
	now := s.clock.Now().UnixNano()
	if last := s.lastLogged.Load(); now-last >= int64(time.Second) && s.lastLogged.CompareAndSwap(last, now) {
		s.log.WarnContext(ctx, "fallback: the primary failed; decided on the secondary", "err", err)
	}
}

// logChange logs a change of the breaker's state.
func (s *Store) logChange(from, to BreakerState) {
	switch to {
	case Open:
		var err error
		if p := s.lastErr.Load(); p != nil {
			err = *p
		}
		s.log.Warn("fallback: the breaker opened; deciding on the secondary", "from", from.String(), "err", err,
			"instances", s.n(), "for", s.breaker.openFor.String())
	case Closed:
		s.log.Info("fallback: the breaker closed; the primary decides again", "from", from.String())
	}
}

// decideLocally decides by the policy while the primary cannot; capacity is the most the
// rule allows at once.
func (s *Store) decideLocally(ctx context.Context, req ratelimit.Request, capacity int64) (ratelimit.Decision, error) {
	var d ratelimit.Decision
	var err error
	switch s.policy {
	case FailOpen:
		d = ratelimit.Decision{Allowed: true, Limit: capacity, Remaining: capacity - req.N}
	case FailClosed:
		d = ratelimit.Decision{Limit: capacity, RetryAfter: s.breaker.retryAfter()}
	default:
		// this instance's share of the rule; its capacity is the rule's divided likewise
		req.Rule = s.share(req)
		if share := shareCapacity(req); req.N > share {
			d = ratelimit.Decision{Limit: share, RetryAfter: s.breaker.retryAfter()} // wait for the primary
		} else {
			d, err = s.secondary.Apply(ctx, req)
		}
	}
	if err == nil && req.Op == "" {
		trace.Set(ctx, Secondary.String())
		if s.hooks.OnDecision != nil {
			s.hooks.OnDecision(Secondary, 0)
		}
	}
	return d, err
}
