// Package fallback provides a fail-open ratelimit.Store. It asks a primary store
// (Redis) first, within a short timeout and behind a circuit breaker. When the primary
// cannot decide, the store decides on a secondary store (in memory) with a share of the
// rule. So the application keeps serving, and keeps its protection.
//
//	store := fallback.New(redisstore.New(client), localstore.New(), fallback.WithInstances(20))
//	limiter, err := tokenbucket.New(store, rule, ratelimit.WithNamespace("api"))
//
// While the primary is down, each of n instances enforces 1/n of every rule on its
// secondary. The instances together admit at most the rule, or twice the rule over an
// interval in which the primary goes away or comes back. Set n with WithInstances, or
// with WithInstanceCount for a number learned at run time. While the primary decides,
// each instance mirrors its decisions onto its share. Store's doc details the bound.
//
// A decision waits for the primary at least the timeout (WithTimeout, 5ms by default).
// It waits longer while the primary answers slower, up to WithMaxTimeout (50ms by
// default). WithTimeout describes the breaker and how to choose the timeout. New gives
// the go-redis settings that go with it.
//
// Some of a decision's work goes on after it returns: a late answer's reconciliation,
// and what the shares owe the primary. Call Flush on shutdown to wait for it.
//
// WithHooks reports decisions by source, the primary's errors and latency, and the
// breaker's changes of state. Its plain callbacks suit Prometheus or OpenTelemetry.
// WithLogger logs each opening of the breaker with its cause.
package fallback

import (
	"context"
	"errors"
	"log/slog"
	"sync"
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

// Hooks are callbacks for metrics and logs. A nil hook is not called. Hooks run on the
// decision's goroutine, and must be fast and safe for concurrent use.
type Hooks struct {
	// OnDecision is called once for each decision, with its source. A decision is a take:
	// AllowN, an in-flight acquire, or each request of an ApplyAll. When the source is
	// Primary, latency is the time the primary took. It is not called for errors. Nor is it
	// called for what decides nothing: peeks, refunds, resets, a lease's release or
	// extension.
	OnDecision func(source Source, latency time.Duration)
	// OnPrimaryError is called for each failed call of the primary, with its error.
	// With failure true, the breaker counted it as a failure. It is also called for
	// each decision that stopped waiting at the timeout. Its error then wraps
	// context.DeadlineExceeded, and is no failure. The call goes on, and counts as a
	// failure only if it stays unanswered.
	OnPrimaryError func(err error, failure bool)
	// OnStateChange is called when the breaker changes state.
	OnStateChange func(from, to BreakerState)
}

// Store is a fail-open ratelimit.Store. It is safe for concurrent use.
//
// # While the primary is down
//
// Each of n instances enforces 1/n of every rule on its secondary. Set n with
// WithInstances(n), or with WithInstanceCount(f) for a number learned at run time (see
// members.Members). Limit and Burst are divided by n and rounded down, never up. With 4
// instances and a limit of 100, each admits 25. A share below 1 per Period becomes 1 per
// a longer Period: 2 per second over 5 instances is 1 per 3 seconds each. Burst is at
// least 1. An in-flight limit (ratelimit.InFlightLimiter) is divided likewise, with at
// least one lease each.
//
// A decision on a share reports the rule's Limit, which a client reads as the limit,
// and the share's Remaining. WithPolicy can instead allow everything (FailOpen) or deny
// everything (FailClosed) while the primary is down.
//
// # While the primary decides
//
// Each instance mirrors its decisions onto its share. An admission takes from the
// share. A denial means the key is spent cluster-wide, and empties the share. So a share
// never hands out again what the primary has just admitted. A breaker that flaps does
// not let each store admit a full allowance in turn. The leases of an in-flight limit are
// mirrored too. Their releases and extensions find them on the share while the primary
// is down.
//
// # A slow primary and a down one
//
// When calls left unanswered open the breaker, the primary is slow, or the process is
// starved of CPU. Other instances may still decide on the primary. So what the share then
// admits or debits is charged to the primary too, as debits, in the background, within
// 10ms. A take with a receipt is charged with a receipt of the primary's. Its settlement
// goes to the primary if it comes within 10 minutes, and to the share after that. A refund of a take the
// primary counted waits for the primary too.
//
// When errors open the breaker, it is an outage. Nothing decided locally is then replayed
// into the primary. The refunds of its takes are given back once it answers. A primary
// that restarted without its data gives them back from what it counted since: a
// window's count, not a bucket's.
//
// # The bound
//
// While all instances decide on their shares, they together admit at most the rule.
// Over any interval, the instances together admit at most twice the rule. That is what
// the rule allows on the primary, plus the shares' allowances. Each share's allowance is
// less what the primary admitted for its instance. So the second rule is whole only when
// the primary had admitted nothing for the instances that then decide locally. A rule
// smaller than n at once (2 at once over 5 instances) still gives each share 1. So n may
// pass at once.
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
	outageAt           atomic.Int64          // UnixNano on clock of its latest failure other than a timeout: see owe
	lastLogged         atomic.Int64          // UnixNano of the latest error logged that opens nothing
	lastReopenLog      atomic.Int64          // UnixNano of the latest log of a failed probe; 0: none since closed
	failedProbes       atomic.Int64          // failed probes not logged yet
	routes             sync.Map              // *core.Receipt (the share's) -> lateRoute: see late
	debts              debts                 // what the shares counted while the breaker was open: see owe
	calls              calls                 // the calls of the primary going on: see Flush
}

var _ ratelimit.Store = (*Store)(nil)

// New returns a Store that asks primary first, and secondary when primary cannot
// decide. It panics for a nil store or a nil option, as net/http does for a nil
// handler. A fallback without a secondary would fail only during an outage.
//
// # go-redis settings
//
// For the timeout to stop the work as well as the wait, let go-redis honour context
// deadlines. Keep its own timeouts short, so that an outage does not pile up connections
// and goroutines. All of it is set by redisstore.Recommended:
//
//	client := redis.NewClient(redisstore.Recommended(&redis.Options{Addr: addr}))
//
// Call redisstore's LoadScripts before serving. It loads the scripts and opens the
// connections the first decisions will use. So no decision pays a dial and a handshake
// inside its timeout.
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
	changed := s.breaker.onChange
	s.breaker.onChange = func(from, to BreakerState) {
		if changed != nil {
			changed(from, to)
		}
		if to == Closed {
			s.payOnClose() // what the primary failed to take of the shares' debts
		}
	}
	return s
}

// BreakerState is the breaker's state now.
func (s *Store) BreakerState() BreakerState { return BreakerState(s.breaker.state.Load()) }

// Apply decides req on the primary, or on the secondary when the primary cannot. It
// never returns the primary's errors. It returns an error for an invalid request, before
// asking either store. It returns ctx.Err() when the caller's context ends, and the
// secondary's errors.
func (s *Store) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return core.Outcome{}, err
	}
	if req.Spec.Algorithm == nil {
		return core.Outcome{}, errors.New("fallback: request has no algorithm")
	}
	a, err := req.Args()
	if err != nil {
		return core.Outcome{}, err // the caller's mistake, not the primary's
	}
	if req.Receipt != nil && req.Spec.Op == core.OpRefund && !core.OfLeases(req.Spec.Algorithm) {
		return s.refund(ctx, req, a)
	}
	return s.decide(ctx, req, a)
}

// decide decides req (of Args a) on the primary, or on the secondary when the primary
// cannot. A take's Receipt says which store took it (Via), and holds that store's own
// (Next): each store gets a Receipt of its own, so that a late answer of the primary
// writes none the caller reads.
func (s *Store) decide(ctx context.Context, req core.Request, a core.Args) (core.Outcome, error) {
	outer := req.Receipt // of a take, or a debit that writes one (a take whatever the key has)
	if !(req.Spec.Op == core.OpTake || req.Spec.Op == core.OpDebit && a.Taken == core.TakenNow) || core.OfLeases(req.Spec.Algorithm) {
		outer = nil
	}
	if req.Spec.Op == core.OpReset {
		s.forgive(ctx, req) // what the share owes the key is not charged after its reset
	}
	var lt *late // a rate algorithm's take, which the primary may count after the wait
	start := s.clock.Now()
	refused := true // the breaker let no call through: the primary counts nothing of it
	if ok, probe := s.breaker.allow(); ok {
		refused = false
		decisions := 0
		if req.Spec.Op == core.OpTake {
			decisions = 1
		}
		preq := req
		if outer != nil {
			preq.Receipt = &core.Receipt{}
		}
		if req.Spec.Op == core.OpTake && !core.OfLeases(req.Spec.Algorithm) && s.policy == LocalShare {
			lt = newLate([]core.Request{preq})
		}
		change := req.Spec.Op == core.OpReset || req.Spec.Op == core.OpDebit || req.Spec.Op == core.OpRefund
		d, err := askPrimary(ctx, s, probe, decisions, change, func(pctx context.Context) (core.Outcome, error) {
			return s.primary.Apply(pctx, preq)
		}, func(pctx context.Context, d core.Outcome, err error) {
			if err == nil {
				s.release(pctx, preq, d)
			}
			if lt != nil {
				s.answered(pctx, lt, err, []core.Outcome{d}, d.Allowed())
			}
		})
		if err == nil && s.policy == LocalShare {
			s.mirror(ctx, preq, d)
		}
		if err == nil || ctx.Err() != nil {
			if err == nil && outer != nil && preq.Receipt.At > 0 {
				outer.At, outer.Via, outer.Next = preq.Receipt.At, int64(Primary), preq.Receipt
			}
			if err != nil && lt != nil { // the caller gave up: no decision, the call goes on
				s.decided(ctx, lt, false)
			}
			return d, err
		}
		if lt != nil && !errors.Is(err, errTimedOut) { // it failed in time: it counted nothing
			lt = nil
		}
	}
	local := req
	if outer != nil {
		local.Receipt = &core.Receipt{}
	}
	d, err := s.decideLocally(ctx, local, a.Limit)
	if refused && err == nil && (req.Spec.Op == core.OpTake && d.Allowed() || req.Spec.Op == core.OpDebit) {
		if outer != nil {
			s.oweTake(req, local.Receipt) // the primary is charged it, and its settlement goes there (see oweTake)
		} else {
			s.owe(req) // the primary is charged it (see owe)
		}
	}
	if lt != nil && err == nil && !d.Allowed() {
		if outs, ok := s.stillCounted(ctx, lt, start); ok { // the primary, late, admitted it: its decision
			s.decided(ctx, lt, true)
			trace.Set(ctx, Primary.String())
			s.mirror(ctx, lt.takes[0], outs[0])
			if outer != nil {
				p := lt.takes[0].Receipt
				outer.At, outer.Via, outer.Next = p.At, int64(Primary), p
			}
			return outs[0], nil
		}
	}
	if lt != nil {
		if outer != nil && err == nil && d.Allowed() {
			s.route(local.Receipt, lt, 0)
		}
		s.decided(ctx, lt, err == nil && d.Allowed())
	}
	if err == nil && outer != nil && (d.Allowed() || req.Spec.Op == core.OpDebit) {
		outer.At, outer.Via, outer.Next = local.Receipt.At, int64(Secondary), local.Receipt
		if outer.At <= 0 { // admitted, and taken nowhere (FailOpen): nothing to give back
			outer.At, outer.Next = max(1, s.clock.Now().UnixMicro()), nil
		}
	}
	return d, err
}

// refund gives back a take's events where its receipt says it was taken: on the primary,
// or on this instance's share of the secondary. A take of the primary's is given back
// there (what the share mirrored of it stays spent): at once, or in the background once
// the primary answers (oweRefund). One taken nowhere (FailOpen) gives nothing back. The
// answer is then the share's peek.
func (s *Store) refund(ctx context.Context, req core.Request, a core.Args) (core.Outcome, error) {
	r := req.Receipt
	req.Receipt = r.Next
	if r.Next != nil && r.Via == int64(Secondary) {
		if at := s.settling(ctx, r.Next); at != nil { // the primary counted it late: settled there
			r = &core.Receipt{At: at.At, Via: int64(Primary), Next: at}
			req.Receipt = at
		}
	}
	if r.Next != nil && r.Via == int64(Primary) {
		ok, probe := s.breaker.allow()
		if ok {
			preq := req // the call may go on after the wait, while req becomes the share's peek
			d, err := askPrimary(ctx, s, probe, 0, true, func(pctx context.Context) (core.Outcome, error) {
				return s.primary.Apply(pctx, preq)
			}, nil)
			if err == nil || ctx.Err() != nil {
				return d, err
			}
			ok = !notSent(err) // a call that reached the primary may have given back: not sent twice
		}
		if !ok {
			s.oweRefund(req) // given back once the primary answers (see oweRefund)
		}
	}
	if r.Next == nil || r.Via != int64(Secondary) { // nothing to give back here: a peek of 1
		req.N, req.Receipt = 1, nil
		req.Spec = core.WithOp(req.Spec, core.OpPeek)
	}
	return s.decideLocally(ctx, req, a.Limit)
}
