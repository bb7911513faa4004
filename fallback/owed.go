package fallback

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// maxOwed is how many keys' debts a Store keeps at most; the events of the keys beyond
// it are not paid back.
const maxOwed = 100_000

// payEvery is how long a debt waits for others before they are charged together.
const payEvery = 10 * time.Millisecond

// owedKey names a key's debt: its algorithm, namespace and rule.
type owedKey struct {
	alg       *core.Algorithm
	namespace string
	key       string
	rule      core.Rule
}

// debts are the events the shares admitted, or debited, while the breaker let no call of
// the primary through: charged to the primary as debits, one call at a time.
type debts struct {
	mu sync.Mutex
	m  map[owedKey]*core.Request // a debit of the events
	// the takes with a receipt, each a debit with a receipt of the primary's, where its
	// settlement goes once it landed (a late, already decided, whose primary counted
	// nothing: see oweTake)
	takes []*late
	// the refunds of takes the primary counted, asked while the breaker let no call
	// through, or whose call never reached it
	refunds []core.Request
	paying  bool          // a payBack is on its way
	quiet   chan struct{} // closed when paying ends (see Flush)
	flying  chan struct{} // closed when the debits sent now have landed; nil: none sent
}

// owe records that req's events (a take the share admitted, or a debit it took: a
// settlement's too, beyond its take's cost, charged without its receipt) were
// counted on this instance's share alone because the breaker let no call through, and
// charges them to the primary, which every instance reads, in the background (see
// payBack), as the late answers of a timeout are reconciled there: while the breaker is
// open on calls left unanswered (the primary slow, or this process starved of CPU), not
// on errors (the primary down or refusing: an outage, whose local decisions are not
// replayed). Without it, an instance whose breaker opens while the others' do not
// spends its share of the rule while the others spend the whole rule on the primary.
func (s *Store) owe(req core.Request) {
	if req.Receipt != nil && req.Spec.Op != core.OpDebit || !s.replays(req) {
		return // a take with a receipt: see oweTake
	}
	owed := req
	owed.Receipt = nil
	owed.Spec = core.WithOp(req.Spec, core.OpDebit)
	owed.Spec.Reserve, owed.Spec.Retry = 0, false
	s.debts.mu.Lock()
	s.debts.add(&owed)
	start := s.debts.start()
	s.debts.mu.Unlock()
	if start {
		time.AfterFunc(payEvery, s.payBack) // the debts of the next moments ride along
	}
}

// replays reports whether req, decided on this instance's share while the breaker let no
// call through, is charged to the primary (see owe).
func (s *Store) replays(req core.Request) bool {
	return s.policy == LocalShare && req.N > 0 && req.Spec.Algorithm.Debit != nil && !core.OfLeases(req.Spec.Algorithm) && s.slow()
}

// slow reports whether the primary's latest failure is a call gone unanswered (a slow
// primary), not an outage: it refuses or fails (down, restarted), or did within the
// breaker's window, though a call timed out since. Nothing decided locally in an outage
// is replayed.
func (s *Store) slow() bool {
	if e := s.lastErr.Load(); e == nil || !errors.Is(*e, errUnanswered) {
		return false
	}
	at := s.outageAt.Load()
	return at == 0 || s.clock.Now().UnixNano()-at >= s.breaker.slice*slices
}

// oweTake is owe for a take with a receipt, which the share admitted under the receipt
// shared: it is charged to the primary as a debit with a receipt of the primary's, and
// its settlement goes there once it landed (see settling), as for a take the primary
// counted late. Charged with the others, it would be settled on the share: the primary
// would keep the whole take, a budget charged after the answer its estimate.
func (s *Store) oweTake(req core.Request, shared *core.Receipt) {
	if !s.replays(req) {
		return
	}
	owed := req
	owed.Spec = core.WithOp(req.Spec, core.OpDebit)
	owed.Spec.Reserve, owed.Spec.Retry = 0, false
	owed.Receipt = &core.Receipt{}
	l := newLate([]core.Request{owed})
	l.settle = make([]*core.Receipt, 1)
	s.debts.mu.Lock()
	if len(s.debts.takes) >= maxOwed {
		s.debts.mu.Unlock()
		return
	}
	s.route(shared, l, 0)
	s.debts.takes = append(s.debts.takes, l)
	start := s.debts.start()
	s.debts.mu.Unlock()
	if start {
		time.AfterFunc(payEvery, s.payBack)
	}
}

// oweRefund gives req, a refund of a take the primary counted (its receipt the
// primary's), back to the primary in the background, once it answers (after an outage,
// when the breaker closes): the breaker let no call through, or the call never reached
// the primary. Dropped, it would charge the key the whole take.
func (s *Store) oweRefund(req core.Request) {
	s.debts.mu.Lock()
	if len(s.debts.refunds) >= maxOwed {
		s.debts.mu.Unlock()
		return
	}
	s.debts.refunds = append(s.debts.refunds, req)
	start := s.debts.start()
	s.debts.mu.Unlock()
	if start {
		time.AfterFunc(payEvery, s.payBack)
	}
}

// due reports whether d holds what payBack sends now (refunds only while the primary
// answers); d.mu is held.
func (d *debts) due(answers bool) bool {
	return len(d.m)+len(d.takes) > 0 || answers && len(d.refunds) > 0
}

// answers reports whether the primary answers calls: the breaker is closed, or it opened
// on a slow primary (see slow).
func (s *Store) answers() bool { return s.BreakerState() == Closed || s.slow() }

// start marks a payBack on its way, and reports whether none was; d.mu is held.
func (d *debts) start() bool {
	if d.paying {
		return false
	}
	d.paying, d.quiet = true, make(chan struct{})
	return true
}

// stop marks the payBack on its way ended; d.mu is held.
func (d *debts) stop() {
	d.paying = false
	close(d.quiet)
}

// add adds r, a debit, to what d owes; d.mu is held.
func (d *debts) add(r *core.Request) {
	k := owedKey{r.Spec.Algorithm, r.Spec.Namespace, r.Key, r.Spec.Rule}
	if had := d.m[k]; had != nil {
		had.N += r.N
		return
	}
	if len(d.m) < maxOwed {
		if d.m == nil {
			d.m = map[owedKey]*core.Request{}
		}
		d.m[k] = r
	}
}

// payBack charges what is owed to the primary, as debits, and again payEvery later while
// more is owed; a debit not sent is owed again, and waits for the next debt or the
// breaker's closing. One runs at a time (debts.paying).
func (s *Store) payBack() {
	answers := s.answers()
	s.debts.mu.Lock()
	owed, takes := s.debts.m, s.debts.takes
	s.debts.m, s.debts.takes = nil, nil
	var refunds []core.Request
	if answers { // the refunds wait out an outage
		refunds, s.debts.refunds = s.debts.refunds, nil
	}
	if len(owed)+len(takes)+len(refunds) == 0 {
		s.debts.stop()
		s.debts.mu.Unlock()
		return
	}
	flying := make(chan struct{})
	s.debts.flying = flying
	s.debts.mu.Unlock()
	again := s.charged(owed)
	takes = s.chargeTakes(takes)
	unsent := s.refunded(refunds)
	s.debts.mu.Lock()
	defer s.debts.mu.Unlock()
	s.debts.flying = nil
	close(flying)
	for _, r := range again {
		s.debts.add(r)
	}
	s.debts.takes = append(takes, s.debts.takes...)
	s.debts.refunds = append(unsent, s.debts.refunds...)
	if len(again)+len(takes)+len(unsent) > 0 || !s.debts.due(s.answers()) {
		s.debts.stop()
		return
	}
	time.AfterFunc(payEvery, s.payBack) // owed meanwhile
}

// charged charges owed to the primary (in one call of its Lend, for the algorithms that
// lend), and returns the debits to charge again: those that never reached it. A debit
// that failed after it was sent may have landed, and is not sent twice.
func (s *Store) charged(owed map[owedKey]*core.Request) (again []*core.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), lateHorizon)
	defer cancel()
	var loans []core.Loan
	var lent, rest []*core.Request
	l, lends := s.primary.(core.Lender)
	for _, r := range owed {
		if lends && r.Spec.Algorithm.Lendable {
			loans = append(loans, core.Loan{Key: r.Key, Spec: r.Spec, Want: r.N})
			lent = append(lent, r)
		} else {
			rest = append(rest, r)
		}
	}
	if len(loans) > 0 {
		if _, err := l.Lend(ctx, loans); notSent(err) {
			again = append(again, lent...)
		}
	}
	for _, r := range rest {
		if _, err := s.primary.Apply(ctx, *r); notSent(err) {
			again = append(again, r)
		}
	}
	return again
}

// chargeTakes charges each of takes to the primary, and says where its settlement goes:
// the primary's receipt, or the share's when the debit failed after it was sent (it may
// have landed: it is not sent twice). It returns the takes whose debit never reached
// the primary, to charge again.
func (s *Store) chargeTakes(takes []*late) (again []*late) {
	var mu sync.Mutex
	s.eachCall(len(takes), func(ctx context.Context, i int) {
		l := takes[i]
		owed := l.takes[0]
		_, err := s.primary.Apply(ctx, owed)
		if notSent(err) {
			owed.Receipt = &core.Receipt{}
			l.takes[0] = owed
			mu.Lock()
			again = append(again, l)
			mu.Unlock()
			return
		}
		if err == nil && owed.Receipt.At > 0 {
			l.settle[0] = owed.Receipt
		}
		close(l.done)
	})
	return again
}

// refunded sends refunds to the primary, and returns those that never reached it. One
// that failed after it was sent may have landed, and is not sent twice.
func (s *Store) refunded(refunds []core.Request) (unsent []core.Request) {
	var mu sync.Mutex
	s.eachCall(len(refunds), func(ctx context.Context, i int) {
		if _, err := s.primary.Apply(ctx, refunds[i]); notSent(err) {
			mu.Lock()
			unsent = append(unsent, refunds[i])
			mu.Unlock()
		}
	})
	return unsent
}

// eachCall calls f for 0 to n-1, eight calls at a time, each within lateHorizon.
func (s *Store) eachCall(n int, f func(ctx context.Context, i int)) {
	var wg sync.WaitGroup
	slots := make(chan struct{}, 8)
	for i := range n {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(context.Background(), lateHorizon)
			defer cancel()
			f(ctx, i)
		})
	}
	wg.Wait()
}

// notSent reports whether err says its call never reached the primary.
func notSent(err error) bool {
	return errors.Is(err, core.ErrNotSent) || errors.Is(err, core.ErrUndelivered)
}

// forgiveAll drops every debt not yet sent: the primary refused or failed, an outage,
// whose local decisions are not replayed (a key used only while Redis was down was
// written into it once it came back, when a call had timed out as it went down).
func (s *Store) forgiveAll() {
	s.debts.mu.Lock()
	takes := s.debts.takes
	s.debts.m, s.debts.takes = nil, nil
	s.debts.mu.Unlock()
	for _, l := range takes { // settled on the share
		close(l.done)
	}
}

// forgive drops what the shares owe req's key (any rule), and waits, within ctx, for
// the debits of it on their way: a reset that follows finds them counted, and clears
// them. Without it, a key reset while its debts waited was charged them after.
func (s *Store) forgive(ctx context.Context, req core.Request) {
	s.debts.mu.Lock()
	for k := range s.debts.m {
		if k.alg == req.Spec.Algorithm && k.namespace == req.Spec.Namespace && k.key == req.Key {
			delete(s.debts.m, k)
		}
	}
	kept := s.debts.takes[:0]
	for _, l := range s.debts.takes {
		if r := l.takes[0]; r.Spec.Algorithm == req.Spec.Algorithm && r.Spec.Namespace == req.Spec.Namespace && r.Key == req.Key {
			close(l.done) // settled on the share, whose receipt the reset voids too
			continue
		}
		kept = append(kept, l)
	}
	clear(s.debts.takes[len(kept):])
	s.debts.takes = kept
	// the refunds stay: a reset that reaches the primary voids their receipts there, and
	// one decided on the share alone leaves the primary's takes to be given back
	flying := s.debts.flying
	s.debts.mu.Unlock()
	if flying != nil {
		select {
		case <-flying:
		case <-ctx.Done():
		}
	}
}

// payOnClose charges, once the breaker closes, what the primary failed to take before.
func (s *Store) payOnClose() {
	s.debts.mu.Lock()
	start := s.debts.due(true) && s.debts.start()
	s.debts.mu.Unlock()
	if start {
		time.AfterFunc(payEvery, s.payBack)
	}
}
