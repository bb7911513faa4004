package fallback

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/trace"
)

// Timeout is how long a decision waits for the primary now. It is the primary's tail
// plus the timeout of WithTimeout, or twice the tail if longer, up to WithMaxTimeout.
// The tail is the time within which the primary gave 99.5% of its answers over the last
// second or two, late answers included. While too few answers were seen, Timeout is the
// timeout alone. The slack covers a machine's slow moments, such as a CPU busy elsewhere
// or a virtual machine's CPU waking. They come in bursts that the past second's tail does
// not foresee.
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

// askPrimary calls the primary with call and waits for its answer as long as the
// timeout (see WithTimeout) and the caller's context allow. It reports decisions (the
// takes of the call) to OnDecision. A nil error means the value is the primary's.
//
// The call itself goes on after the wait, on a context without the caller's
// cancellation, if it was sent by then (a call a store still queues when the wait ends is
// dropped: see core.WithSendBy): an answer that comes after the timeout is a live primary
// and counts as one with the breaker and the measured round trip, and late, if set, is
// handed how the call ended (its answer or its error), to undo what it did (a lease
// taken, a take counted, for a decision made on the secondary); a call still unanswered
// after the breaker's Unanswered is a failure, and one with late goes on up to
// lateHorizon for its answer.
//
// A change (a reset, a refund, a debit: change true) is no decision a request waits for:
// it waits for the primary up to lateHorizon, and its call is never dropped, so that the
// primary, which every instance reads, gets it however late; the share's copy (a mirror)
// is made too when the wait ends first.
func askPrimary[T any](ctx context.Context, s *Store, probe bool, decisions int, change bool, call func(context.Context) (T, error), late func(context.Context, T, error)) (T, error) {
	start := s.clock.Now()
	p := &pending[T]{done: make(chan outcome[T], 1)}
	unanswered := max(s.breaker.unanswered, s.maxTimeout)
	waitFor := s.waitFor()
	sendBy := time.Now().Add(waitFor) // a call not sent by then is decided elsewhere
	if change {
		waitFor, sendBy = max(waitFor, lateHorizon), time.Now().Add(24*time.Hour)
	}
	callFor := unanswered
	switch {
	case change:
		callFor = 2 * lateHorizon
	case late != nil:
		callFor = max(callFor, lateHorizon)
	}
	s.calls.add()
	go p.call(ctx, s, probe, start, sendBy, unanswered, callFor, call, late)
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
		if p.state.CompareAndSwap(waiting, left) {
			p.leave(ctx, s, probe, unanswered, stopped)
			return zero, stopped
		}
		o = <-p.done // it answered as the wait ended: on its way
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

// call calls the primary, on a context without the caller's cancellation that ends
// callFor after it began, sent no later than sendBy; settles its end with the breaker
// (unless the timer of leave has), and hands its answer to the waiting caller, or, with
// nobody waiting, to late, which undoes what it did.
func (p *pending[T]) call(ctx context.Context, s *Store, probe bool, start, sendBy time.Time, unanswered, callFor time.Duration,
	call func(context.Context) (T, error), late func(context.Context, T, error)) {
	defer s.calls.done() // after late, which may call the primary again
	pctx, cancel := context.WithTimeout(core.WithSendBy(context.WithoutCancel(ctx), sendBy), callFor)
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
	} else if late != nil { // nobody has the answer: undo what it did
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unanswered)
		late(lctx, o.v, o.err)
		cancel()
	}
}

// leave is the end of a wait that stopped (the timeout, or the caller's end) before the
// call answered: a caller that gave up counts for nothing; a timeout is reported, and a
// primary that ignores its context is still counted a failure when it stays silent.
func (p *pending[T]) leave(ctx context.Context, s *Store, probe bool, unanswered time.Duration, stopped error) {
	if p.gaveUp.Load() {
		return
	}
	time.AfterFunc(unanswered, func() {
		if p.settled.CompareAndSwap(false, true) {
			s.settle(ctx, probe, errUnanswered, unanswered, false)
		}
	})
	if s.hooks.OnPrimaryError != nil {
		s.hooks.OnPrimaryError(stopped, false)
	}
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
	if failure && !errors.Is(err, errUnanswered) { // down or refusing: an outage, whose local decisions are not replayed
		s.outageAt.Store(s.clock.Now().UnixNano())
		s.forgiveAll()
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

const (
	waiting int32 = iota
	handed        // the answer is the waiting caller's
	left
)
