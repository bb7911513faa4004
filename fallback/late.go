package fallback

import (
	"context"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// lateHorizon is how long a take's call of the primary goes on after its decision was
// made on the share, for its answer: a take the primary counts after that is counted
// twice.
const lateHorizon = time.Second

// routeFor is how long a settlement of a take decided on the share finds where the
// primary's late answer moved it (see late).
const routeFor = 10 * time.Minute

// late is the takes of one decision (Apply's one, or ApplyAll's) while their call of the
// primary outlives the wait: the decision is made on the share, and the primary may
// still count the takes. Whichever of the two ends second reconciles them, so that the
// primary, which every instance reads, counts each take once and what it really cost:
//
//   - the primary admitted them, and so did the share: the share's take stands as the
//     mirror of the primary's (as for a decision the primary answers in time), and a
//     settlement of a take (a refund, with the caller's receipt) goes to the primary,
//     where the take counts;
//   - the primary admitted them, and the share did not (or no decision was made: the
//     caller gave up): the primary gives back the takes that carry a receipt (the
//     others stay counted there: one event each, of a decision the primary answered too
//     late);
//   - the primary denied them, or its call failed: the share's count stands, and the
//     settlements go to it.
type late struct {
	mu       sync.Mutex
	done     chan struct{} // closed once reconciled
	primary  []ratelimit.Request
	admitted bool // by the share
	decided  bool // the share's decision is in admitted
	answered bool // the primary's answer is in counted
	counted  bool // the primary admitted them all
}

func newLate(primary []ratelimit.Request) *late {
	return &late{done: make(chan struct{}), primary: primary}
}

// answer is the primary's answer to l's call, after the wait ended: counted says it
// admitted every take.
func (s *Store) answer(ctx context.Context, l *late, counted bool) {
	l.mu.Lock()
	l.answered, l.counted = true, counted
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

// reconcile counts l's takes once, where the primary's answer and the share's decision
// leave them (see late), and routes their settlements.
func (s *Store) reconcile(ctx context.Context, l *late) {
	defer close(l.done)
	if !l.counted || l.admitted {
		return
	}
	for _, r := range l.primary {
		if r.Receipt == nil || r.Receipt.At <= 0 {
			continue
		}
		back := r
		back.Spec = core.WithOp(r.Spec, "refund")
		back.Spec.Reserve = 0
		_, _ = s.primary.Apply(ctx, back)
	}
}

// route keeps, for a routeFor, which late a take decided on the share belongs to (by
// the share's receipt of it), so that its settlement goes where it is counted (settling).
func (s *Store) route(shareReceipt *ratelimit.Receipt, l *late, i int) {
	s.routes.Store(shareReceipt, lateRoute{l, i})
	time.AfterFunc(routeFor, func() { s.routes.Delete(shareReceipt) })
}

type lateRoute struct {
	l *late
	i int // the take's place in the decision
}

// settling is where a settlement of the take whose share's receipt is r goes: the
// primary, with its receipt there, when the primary's late answer counted it (waiting,
// within ctx, for that answer while the call goes on); else nil, the share.
func (s *Store) settling(ctx context.Context, r *ratelimit.Receipt) *ratelimit.Receipt {
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
	if !rt.l.counted || !rt.l.admitted {
		return nil
	}
	return rt.l.primary[rt.i].Receipt
}
