// Package fallback is a fail-open ratelimit.Store: it asks a primary store (Redis) first,
// within a short timeout and behind a circuit breaker, and when the primary cannot decide
// it decides on a secondary store (in memory) with a share of the rule, so that the
// application keeps serving and keeps its protection.
//
//	store := fallback.New(redisstore.New(client), localstore.New(), fallback.WithInstances(20))
//	limiter, err := tokenbucket.New(store, rule, ratelimit.WithNamespace("api"))
//
// While the primary is down, each of n instances enforces 1/n of every rule on its
// secondary (WithInstances, or WithInstanceCount for a number learned at run time), and
// while it decides, each instance mirrors its decisions onto its share, so that the
// instances together never admit more than twice the rule in any interval (see Store).
// A decision waits for the primary at least the timeout (WithTimeout, 5ms by default),
// longer while the primary answers slower (up to WithMaxTimeout): see WithTimeout for
// the breaker and how to choose it, and New for the go-redis settings that go with it. WithHooks reports decisions by source, the
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
	"github.com/ratelimit-go/ratelimit/internal/mathx"
	"github.com/ratelimit-go/ratelimit/internal/trace"
)

// Defaults of the options.
const (
	DefaultTimeout     = 5 * time.Millisecond
	DefaultMaxTimeout  = 50 * time.Millisecond
	DefaultUnanswered  = 100 * time.Millisecond
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
	// whether it counted as a failure for the breaker; and for each decision that stopped
	// waiting at the timeout (an error wrapping context.DeadlineExceeded, not a failure:
	// the call goes on, and counts as a failure only if it stays unanswered).
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
	count              func() int    // the instances learned (WithInstanceCount); nil: instances
	timeout            time.Duration // the least a decision waits for the primary
	maxTimeout         time.Duration // the most, however far the primary's round trip goes
	rtt                latencies     // the primary's answers
	lastSlow           atomic.Int64  // UnixNano of the latest log of a timeout above timeout
	policy             Policy
	hooks              Hooks
	clock              clock.Clock
	breaker            breaker
	log                *slog.Logger
	lastErr            atomic.Pointer[error] // the primary's latest failure, for the log
	lastLogged         atomic.Int64          // UnixNano of the latest error logged that opens nothing
	lastReopenLog      atomic.Int64          // UnixNano of the latest log of a failed probe; 0: none since closed
	failedProbes       atomic.Int64          // failed probes not logged yet
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

// WithTimeout sets the least a decision waits for the primary (DefaultTimeout by
// default; 0 or less means the default): that long beyond the primary's measured tail
// (see Timeout and WithMaxTimeout), whatever the primary's client does with its context,
// after which it is decided on the secondary.
//
// # Timeout and breaker
//
// A decision the primary has not answered within the timeout is decided on the
// secondary, but its call goes on: an answer that comes later is a primary that is slow,
// not one that is down. It counts as an answer for the breaker, its time counts in the
// round trip the timeout follows (see Timeout: the 99.5th percentile of the last
// second's answers, plus the timeout set as slack, or doubled, up to WithMaxTimeout,
// 50ms by default; logged at Warn once a minute while the primary is slower than the
// timeout set), and a lease of an in-flight limit it granted is released at once, since
// nobody holds it. So a Redis a zone away, a jittery network or a busy
// CPU make decisions wait longer for Redis, never send them to the shares wholesale.
//
// A call is a failure when it fails with an error wrapping ratelimit.ErrUnavailable,
// or stays unanswered for the breaker's Unanswered (100ms). When at least half of the
// calls that ended in the last second failed, and there were at least 20, the breaker
// opens (see Breaker): for a second no decision tries the primary, so none waits. Calls
// left unanswered within a tenth of a second of each other (the process starved of CPU
// for a moment) do not open it, unless an error comes with them; a primary that is down
// opens it within about 200ms of traffic, and below 20 calls a second it stays closed,
// each call paying the timeout. Then a single probe goes to the primary; its answer
// closes the breaker, its failure opens it for another second. An error that says
// nothing about availability (a missing script, say) is answered from the secondary
// too, but does not count as a failure; neither does a caller that gives up: a decision
// whose context ends returns ctx.Err().
//
// A decision the primary is too slow for is decided again on the secondary, though the
// primary still counts it when it gets there: fail-open errs towards admitting. Watch
// OnDecision's sources, and OnPrimaryError's timeouts.
//
// # Choosing the timeout
//
// The timeout is what a decision may always wait for the primary, before the round trip
// is known and whatever it is: above the primary's usual round trip where the
// application runs, with room for the slow ones (OnDecision reports the primary's
// latency of every decision it makes; or redis-cli --latency from an instance). The
// default of 5ms suits a Redis on the same host or in the same zone; the timeout then
// follows a Redis further away by itself, up to WithMaxTimeout. TestRedisFarAway
// measures the share Redis decides 1, 2.5 and 4ms away, with jitter and held replies,
// through a delaying proxy; BENCHMARKS.md has the figures. A reply that comes after its
// decision's timeout is still read by redisstore, and its connection kept, so a slow
// moment does not cost the next decisions a new connection.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.timeout = d
		}
	})
}

// WithMaxTimeout bounds how far the timeout follows the primary's measured round trip
// (DefaultMaxTimeout by default; a value below the timeout means the timeout, which then
// stays as WithTimeout set it). See WithTimeout.
func WithMaxTimeout(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.maxTimeout = d
		}
	})
}

// Timeout is how long a decision waits for the primary now: the time within which the
// primary gave 99.5% of its answers over the last second or two (its tail, late answers
// included: a late answer is a slow primary, not a failed one) plus the timeout of
// WithTimeout, or twice the tail if that is longer, up to WithMaxTimeout; the timeout
// alone while too few answers were seen. The slack, because the moments a machine is
// slow (a CPU busy elsewhere, a virtual machine's CPU waking) come in bursts that the
// past second's tail does not foresee.
func (s *Store) Timeout() time.Duration {
	tail := time.Duration(s.rtt.tail.Load())
	return min(max(tail+s.timeout, 2*tail), max(s.timeout, s.maxTimeout))
}

// observe counts an answer of the primary that took took.
func (s *Store) observe(took time.Duration) {
	s.rtt.add(int64(took), s.clock.Now().UnixNano())
}

// waitFor is Timeout, logged once a minute while it is above the timeout set.
func (s *Store) waitFor() time.Duration {
	w := s.Timeout()
	if time.Duration(s.rtt.tail.Load()) > s.timeout && s.log != nil {
		now := s.clock.Now().UnixNano()
		if last := s.lastSlow.Load(); (last == 0 || now-last >= int64(time.Minute)) && s.lastSlow.CompareAndSwap(last, now) {
			s.log.Warn("fallback: the primary answers slower than the timeout; decisions wait for it longer",
				"p99.5", time.Duration(s.rtt.tail.Load()).String(), "timeout", s.timeout.String(),
				"waiting", w.String(), "max_timeout", s.maxTimeout.String())
		}
	}
	return w
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
		if b.Unanswered > 0 {
			s.breaker.unanswered = b.Unanswered
		}
	})
}

// WithHooks sets callbacks for metrics and logs.
func WithHooks(h Hooks) Option {
	return optionFunc(func(s *Store) { s.hooks = h })
}

// WithLogger logs what the store swallows while it keeps deciding: at Warn, each time the
// breaker opens (with the primary's error that opened it), that its probes still fail
// (with the latest probe's error, say a WRONGPASS after Redis came back with a password:
// at most every 30s), the primary's errors that open nothing (a missing script, a reply
// of the wrong shape: at most one a second), and, once a minute, a timeout that follows
// a primary slower than WithTimeout; at Info, each time the primary decides again. nil
// logs nothing, the default.
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
//		ReadTimeout:           time.Second,            // how long a late reply is waited for
//		WriteTimeout:          time.Second,
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
		primary:    primary,
		secondary:  secondary,
		instances:  1,
		timeout:    DefaultTimeout,
		maxTimeout: DefaultMaxTimeout,
		clock:      clock.NewMonotonic(),
	}
	s.breaker.rate, s.breaker.minCalls, s.breaker.openFor = DefaultFailureRate, DefaultMinCalls, DefaultOpenFor
	s.breaker.unanswered = DefaultUnanswered
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
func (s *Store) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return ratelimit.Outcome{}, err
	}
	if req.Spec.Algorithm == nil {
		return ratelimit.Outcome{}, errors.New("fallback: request has no algorithm")
	}
	a, err := req.Args()
	if err != nil {
		return ratelimit.Outcome{}, err // the caller's mistake, not the primary's
	}
	if ok, probe := s.breaker.allow(); ok {
		decisions := 0
		if req.Spec.Op == "" {
			decisions = 1
		}
		d, err := askPrimary(ctx, s, probe, decisions, func(pctx context.Context) (ratelimit.Outcome, error) {
			return s.primary.Apply(pctx, req)
		}, func(pctx context.Context, d ratelimit.Outcome) { s.release(pctx, req, d) })
		if err == nil && s.policy == LocalShare {
			s.mirror(ctx, req, d)
		}
		if err == nil || ctx.Err() != nil {
			return d, err
		}
	}
	return s.decideLocally(ctx, req, a.Limit)
}

// release gives back a lease the primary granted after its decision was made on the
// secondary (its answer came after the timeout): nobody holds it, and left alone it
// would keep a slot of the in-flight limit until it expired.
func (s *Store) release(ctx context.Context, req ratelimit.Request, d ratelimit.Outcome) {
	if req.Spec.Op == "" && d.Allowed && core.OfLeases(req.Spec.Algorithm) {
		req.Spec = core.WithOp(req.Spec, "refund")
		s.primary.Apply(ctx, req)
	}
}

// mirror applies to the secondary, on this instance's share, what the primary decided
// for it, so that when the primary fails the share has already spent what the cluster
// has: an admission of n takes n from the share if it holds them, a denial (the key is
// spent cluster-wide) empties it, and a refund or a reset gives back. Without it the
// primary and the shares each admit a full allowance whenever the breaker flaps. The
// leases of an in-flight limit are mirrored one by one, with their ids, so that a
// release or an extension finds its lease on the share too; a denial leaves the share's
// leases alone.
func (s *Store) mirror(ctx context.Context, req ratelimit.Request, d ratelimit.Outcome) {
	if req.Spec.Op == "peek" {
		return
	}
	req.Spec = core.WithRule(req.Spec, s.share(req))
	if req.Spec.Op == "extend" && !d.Allowed {
		return // a lease the primary no longer holds: the share's copy expires by itself
	}
	if req.Spec.Op == "" {
		share := shareCapacity(req)
		if share == 0 || (!d.Allowed && d.Remaining > 0) { // nothing to mirror; or n was too many, the key not spent
			return
		}
		if !d.Allowed && core.OfLeases(req.Spec.Algorithm) {
			return // the share's leases are those of requests in progress: they stay
		}
		if !d.Allowed {
			empty := req
			empty.Spec = core.WithOp(req.Spec, "reset")
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
	if !core.OfLeases(req.Spec.Algorithm) {
		return core.Share(req.Spec.Rule, s.n())
	}
	return core.PortionLeases(req.Spec.Rule, 1, s.n())
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

// errTimedOut is the error of a call the decision stopped waiting for at the timeout.
var errTimedOut = fmt.Errorf("fallback: the primary did not answer within the timeout: %w", context.DeadlineExceeded)

// errUnanswered is the failure of a call the primary has not answered within the
// breaker's Unanswered.
var errUnanswered = fmt.Errorf("fallback: the primary has not answered: %w", ratelimit.ErrUnavailable)

// pending is one call of the primary, which goes on after its decision stops waiting
// for it. state says who has its answer: the waiting caller (answered), or nobody
// because the caller left first, at the timeout or at its context's end (gaveUp says
// which). settled is set by whichever of its answer and its unanswered timer comes
// first, which alone reports it to the breaker.
type pending[T any] struct {
	done    chan outcome[T]
	state   atomic.Int32
	settled atomic.Bool
	gaveUp  atomic.Bool
}

const (
	waiting int32 = iota
	handed        // the answer is the waiting caller's
	left
)

// askPrimary calls the primary with call and waits for its answer as long as the
// timeout (see WithTimeout) and the caller's context allow. It reports decisions (the
// takes of the call) to OnDecision. A nil error means the value is the primary's.
//
// The call itself goes on after the wait, for as long as the breaker's Unanswered, on
// a context without the caller's cancellation, if it was sent by then (a call a store
// still queues when the wait ends is dropped: see core.WithSendBy): an answer that comes
// after the timeout
// is a live primary and counts as one with the breaker and the measured round trip, and
// late, if set, undoes what it did (a lease taken for a decision made on the secondary);
// a call still unanswered then is a failure. A caller that gives up counts for nothing
// but an answer.
func askPrimary[T any](ctx context.Context, s *Store, probe bool, decisions int, call func(context.Context) (T, error), late func(context.Context, T)) (T, error) {
	start := s.clock.Now()
	p := &pending[T]{done: make(chan outcome[T], 1)}
	unanswered := max(s.breaker.unanswered, s.maxTimeout)
	waitFor := s.waitFor()
	sendBy := time.Now().Add(waitFor) // a call not sent by then is decided elsewhere
	go func() {
		pctx, cancel := context.WithTimeout(core.WithSendBy(context.WithoutCancel(ctx), sendBy), unanswered)
		defer cancel()
		var o outcome[T]
		func() {
			defer func() { // a panic in the primary is its failure, not the process's end
				if r := recover(); r != nil {
					o = outcome[T]{err: fmt.Errorf("fallback: the primary store panicked: %v: %w", r, ratelimit.ErrUnavailable)}
				}
			}()
			o.v, o.err = call(pctx)
		}()
		if errors.Is(o.err, context.DeadlineExceeded) {
			o.err = errUnanswered
		}
		if p.settled.CompareAndSwap(false, true) {
			s.settle(ctx, probe, o.err, s.clock.Now().Sub(start), p.gaveUp.Load())
		}
		if p.state.CompareAndSwap(waiting, handed) {
			p.done <- o
		} else if o.err == nil && late != nil { // nobody has the answer: undo what it did
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unanswered)
			late(lctx, o.v)
			cancel()
		}
	}()
	wait := time.NewTimer(waitFor)
	defer wait.Stop()
	var o outcome[T]
	var zero T
	var stopped error // why the wait ended before the answer: the timeout, or the caller's end
	select {
	case o = <-p.done:
	case <-wait.C:
		stopped = errTimedOut
	case <-ctx.Done(): // the caller gave up: that says nothing about the primary
		p.gaveUp.Store(true)
		stopped = ctx.Err()
	}
	if stopped != nil {
		if !p.state.CompareAndSwap(waiting, left) {
			o = <-p.done // it answered as the wait ended: on its way
		} else if p.gaveUp.Load() {
			return zero, stopped
		} else {
			// a primary that ignores its context is still counted when it stays silent
			time.AfterFunc(unanswered, func() {
				if p.settled.CompareAndSwap(false, true) {
					s.settle(ctx, probe, errUnanswered, unanswered, false)
				}
			})
			if s.hooks.OnPrimaryError != nil {
				s.hooks.OnPrimaryError(stopped, false)
			}
			return zero, stopped
		}
	}
	if o.err != nil {
		return zero, o.err
	}
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
}

// settle records how a call of the primary ended, whenever it did, with the breaker,
// the measured round trip, the hooks and the log: an answer (in time or late), or an
// error (errUnanswered for a call not answered in time), took after it was sent. A call
// whose caller gave up counts only if it was answered.
func (s *Store) settle(ctx context.Context, probe bool, err error, took time.Duration, gaveUp bool) {
	if err == nil {
		s.breaker.success(probe)
		s.observe(took)
		return
	}
	if gaveUp || errors.Is(err, core.ErrNotSent) { // says nothing about the primary
		s.breaker.abandon(probe)
		return
	}
	failure := errors.Is(err, ratelimit.ErrUnavailable)
	if failure || probe {
		s.lastErr.Store(&err) // for the log of the breaker's opening, which follows
	}
	switch {
	case failure:
		how := failed
		if errors.Is(err, errUnanswered) {
			how = timedOut
		}
		s.breaker.failure(probe, how)
	case probe: // the primary did not decide: open again, as for a failure
		s.breaker.failure(probe, failed)
	}
	if s.hooks.OnPrimaryError != nil {
		s.hooks.OnPrimaryError(err, failure)
	}
	if s.log != nil && !failure && !probe {
		s.logError(ctx, err)
	}
}

// logError logs an error of the primary that opens nothing, at most once a second.
func (s *Store) logError(ctx context.Context, err error) {
	now := s.clock.Now().UnixNano()
	if last := s.lastLogged.Load(); now-last >= int64(time.Second) && s.lastLogged.CompareAndSwap(last, now) {
		s.log.WarnContext(ctx, "fallback: the primary failed; decided on the secondary", "err", err)
	}
}

// reopenLogEvery is how often, at most, the log says that the breaker's probes still
// fail.
const reopenLogEvery = 30 * time.Second

// logChange logs a change of the breaker's state: each opening and closing, and a probe
// that failed (half-open to open) at most every reopenLogEvery, with the probe's error and
// how many failed since the last line.
func (s *Store) logChange(from, to BreakerState) {
	var err error
	if p := s.lastErr.Load(); p != nil {
		err = *p
	}
	switch {
	case to == Open && from == HalfOpen:
		failed := s.failedProbes.Add(1)
		now := s.clock.Now().UnixNano()
		if last := s.lastReopenLog.Load(); last != 0 && now-last < int64(reopenLogEvery) || !s.lastReopenLog.CompareAndSwap(last, now) {
			return
		}
		s.failedProbes.Add(-failed)
		s.log.Warn("fallback: the primary still fails; deciding on the secondary", "err", err,
			"failed_probes", failed, "instances", s.n(), "next_probe_in", s.breaker.openFor.String())
	case to == Open:
		s.log.Warn("fallback: the breaker opened; deciding on the secondary", "from", from.String(), "err", err,
			"instances", s.n(), "for", s.breaker.openFor.String())
	case to == Closed:
		s.lastReopenLog.Store(0)
		s.log.Info("fallback: the breaker closed; the primary decides again", "from", from.String())
	}
}

// decideLocally decides by the policy while the primary cannot; capacity is the most the
// rule allows at once.
func (s *Store) decideLocally(ctx context.Context, req ratelimit.Request, capacity int64) (ratelimit.Outcome, error) {
	var d ratelimit.Outcome
	var err error
	switch s.policy {
	case FailOpen:
		d = ratelimit.Outcome{Allowed: true, Remaining: capacity - req.N}
	case FailClosed:
		d = ratelimit.Outcome{Wait: s.breaker.retryAfter()}
	default:
		// this instance's share of the rule; its capacity is the rule's divided likewise
		req.Spec = core.WithRule(req.Spec, s.share(req))
		if share := shareCapacity(req); req.N > share-mathx.Keep(share, req.Spec.Reserve) { // never fits the share
			d = ratelimit.Outcome{Wait: s.breaker.retryAfter()} // wait for the primary
		} else {
			d, err = s.secondary.Apply(ctx, req)
		}
	}
	if err == nil && req.Spec.Op == "" {
		trace.Set(ctx, Secondary.String())
		if s.hooks.OnDecision != nil {
			s.hooks.OnDecision(Secondary, 0)
		}
	}
	return d, err
}
