package fallback

import (
	"context"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// lateHorizon is how long a take's call of the primary goes on after its decision was
// made on the share, for its answer: one the primary answers later is not reconciled.
const lateHorizon = time.Second

// routeFor is how long a settlement of a take decided on the share finds where its
// reconciliation moved it (see late).
const routeFor = 10 * time.Minute

// An answer of the primary to a late call: what it did with the takes.
const (
	unknown   = iota // it failed after it was sent: it may have counted them
	counted          // it admitted them all
	uncounted        // it denied them (all or none), or never received them
)

// late is the takes of one decision (Apply's one, or ApplyAll's) while their call of the
// primary outlives the wait: the decision is made on the share, and the primary may
// still count the takes. Whichever of the two ends second reconciles them, so that the
// primary, which every instance reads, counts what the instances admitted once, at what
// it cost:
//
//   - the primary admitted them, and so did the share: the share's takes stand as the
//     mirror of the primary's (as for a decision the primary answers in time), and the
//     settlement of a take (a Charge's) goes to the primary, where the take counts;
//   - the primary admitted them, and the share did not (or no decision was made: the
//     caller gave up): the primary gives back the takes that carry a receipt (the
//     others stay counted there: one event each, of a decision the primary answered too
//     late);
//   - the share admitted them, and the primary did not count them (it denied them, or
//     the call was never sent: see core.WithSendBy): each is charged to the primary as a
//     debit (a take whatever the key has left; the key may owe it), and its settlement
//     goes there too; the share's takes stand as the mirror;
//   - the call failed after it was sent, or the primary answered after lateHorizon:
//     nothing is known of the primary's count, the share's stands, and the settlements
//     go to the share.
type late struct {
	mu       sync.Mutex
	done     chan struct{} // closed once reconciled
	takes    []core.Request
	admitted bool // by the share
	decided  bool // the share's decision is in admitted
	answered bool // the primary's answer is in answer
	answer   int  // unknown, counted or uncounted
	outs     []core.Outcome
	heard    chan struct{} // closed once answered
	// settle, once reconciled, is where each take's settlement goes: its receipt on the
	// primary, or nil for the share
	settle []*core.Receipt
}

func newLate(takes []core.Request) *late {
	return &late{done: make(chan struct{}), heard: make(chan struct{}), takes: takes}
}

// answered is the primary's answer to l's call after the wait ended: how it ended (err),
// and its outcomes, of which admitted says whether it admitted every take.
func (s *Store) answered(ctx context.Context, l *late, err error, outs []core.Outcome, admitted bool) {
	defer close(l.heard)
	answer := unknown
	switch {
	case err == nil && admitted:
		answer = counted
	case err == nil, core.Uncounted(err):
		answer = uncounted
	}
	l.mu.Lock()
	l.answered, l.answer, l.outs = true, answer, outs
	ready := l.decided
	l.mu.Unlock()
	if ready {
		s.reconcile(ctx, l)
	}
}

// decided is the share's decision of l's takes, admitted or not, or none (the caller
// gave up).
func (s *Store) decided(ctx context.Context, l *late, admitted bool) {
	l.mu.Lock()
	l.decided, l.admitted = true, admitted
	ready := l.answered
	l.mu.Unlock()
	if ready {
		s.reconcile(context.WithoutCancel(ctx), l)
	}
}

// reconcile counts l's takes once on the primary, where its answer and the share's
// decision leave them (see late), and says where their settlements go.
func (s *Store) reconcile(ctx context.Context, l *late) {
	defer close(l.done)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateHorizon) // what it sends is no decision: it may take a while
	defer cancel()
	l.settle = make([]*core.Receipt, len(l.takes))
	switch {
	case l.answer == counted && l.admitted:
		for i, r := range l.takes {
			l.settle[i] = r.Receipt
		}
	case l.answer == counted:
		for _, r := range l.takes {
			if r.Receipt != nil && r.Receipt.At > 0 {
				back := r
				back.Spec = core.WithOp(r.Spec, core.OpRefund)
				back.Spec.Reserve = 0
				_, _ = s.primary.Apply(ctx, back)
			}
		}
	case l.answer == uncounted && l.admitted:
		for i, r := range l.takes {
			if r.Spec.Algorithm.Debit == nil {
				continue // it takes no debts: the share's count stands
			}
			owed := r
			owed.Spec = core.WithOp(r.Spec, core.OpDebit)
			owed.Spec.Reserve = 0
			if r.Receipt != nil { // a take whatever the key has, with its receipt there
				owed.Receipt = &core.Receipt{}
			}
			if _, err := s.primary.Apply(ctx, owed); err == nil && owed.Receipt != nil && owed.Receipt.At > 0 {
				l.settle[i] = owed.Receipt
			}
		}
	}
}

// stillCounted waits, after the share denied l's takes, for the primary's answer a while
// longer: up to the breaker's Unanswered since start. A share denies what the cluster
// may still have (it holds 1/n of the rule, and mirrors what this instance took), and
// the primary, slow but up, decides better; its admission is then the decision (ok).
func (s *Store) stillCounted(ctx context.Context, l *late, start time.Time) ([]core.Outcome, bool) {
	wait := time.NewTimer(max(0, s.breaker.unanswered-s.clock.Now().Sub(start)))
	defer wait.Stop()
	select {
	case <-l.heard:
	case <-wait.C:
		return nil, false
	case <-ctx.Done():
		return nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outs, l.answer == counted
}

// route keeps, for a routeFor, which late a take decided on the share belongs to (by
// the share's receipt of it), so that its settlement goes where it is counted (settling).
func (s *Store) route(shareReceipt *core.Receipt, l *late, i int) {
	s.routes.Store(shareReceipt, lateRoute{l, i})
	time.AfterFunc(routeFor, func() { s.routes.Delete(shareReceipt) })
}

type lateRoute struct {
	l *late
	i int // the take's place in the decision
}

// settling is where a settlement of the take whose share's receipt is r goes: the
// primary, with its receipt there, when the take was reconciled there (waiting, within
// ctx, for the reconciliation while the primary's call goes on); else nil, the share.
func (s *Store) settling(ctx context.Context, r *core.Receipt) *core.Receipt {
	v, ok := s.routes.Load(r)
	if !ok {
		return nil
	}
	rt := v.(lateRoute)
	select {
	case <-rt.l.done:
	case <-ctx.Done():
		return nil
	}
	return rt.l.settle[rt.i]
}
