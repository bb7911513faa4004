package fallback

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// maxOwed is how many keys' debts a Store keeps at most; the events of the keys beyond
// it are not paid back.
const maxOwed = 100_000

// payEvery is how long a debt waits for others before they are charged together.
const payEvery = 10 * time.Millisecond

// owedKey names a key's debt: its algorithm, namespace and rule.
type owedKey struct {
	alg       *ratelimit.Algorithm
	namespace string
	key       string
	rule      ratelimit.Rule
}

// debts are the events the shares admitted, or debited, while the breaker let no call of
// the primary through: charged to the primary as debits, one call at a time.
type debts struct {
	mu     sync.Mutex
	m      map[owedKey]*ratelimit.Request // a debit of the events
	paying bool                           // a payBack is on its way
	flying chan struct{}                  // closed when the debits sent now have landed; nil: none sent
}

// owe records that req's events (a take the share admitted, or a debit it took) were
// counted on this instance's share alone because the breaker let no call through, and
// charges them to the primary, which every instance reads, in the background (see
// payBack), as the late answers of a timeout are reconciled there: while the breaker is
// open on calls left unanswered (the primary slow, or this process starved of CPU), not
// on errors (the primary down or refusing: an outage, whose local decisions are not
// replayed). Without it, an instance whose breaker opens while the others' do not
// spends its share of the rule while the others spend the whole rule on the primary.
func (s *Store) owe(req ratelimit.Request) {
	if s.policy != LocalShare || req.N <= 0 || req.Receipt != nil || req.Spec.Algorithm.Debit == nil || core.OfLeases(req.Spec.Algorithm) {
		return // a take with a receipt is settled on the share, where it counts
	}
	if e := s.lastErr.Load(); e == nil || !errors.Is(*e, errUnanswered) {
		return // the primary refuses or fails (down, restarted): an outage, nothing decided locally is replayed
	}
	if at := s.outageAt.Load(); at != 0 && s.clock.Now().UnixNano()-at < s.breaker.slice*slices {
		return // it refused or failed within the breaker's window: an outage, though a call timed out since
	}
	owed := req
	owed.Receipt = nil
	owed.Spec = core.WithOp(req.Spec, "debit")
	owed.Spec.Reserve, owed.Spec.Retry = 0, false
	s.debts.mu.Lock()
	s.debts.add(&owed)
	start := !s.debts.paying
	s.debts.paying = true
	s.debts.mu.Unlock()
	if start {
		time.AfterFunc(payEvery, s.payBack) // the debts of the next moments ride along
	}
}

// add adds r, a debit, to what d owes; d.mu is held.
func (d *debts) add(r *ratelimit.Request) {
	k := owedKey{r.Spec.Algorithm, r.Spec.Namespace, r.Key, r.Spec.Rule}
	if had := d.m[k]; had != nil {
		had.N += r.N
		return
	}
	if len(d.m) < maxOwed {
		if d.m == nil {
			d.m = map[owedKey]*ratelimit.Request{}
		}
		d.m[k] = r
	}
}

// payBack charges what is owed to the primary, as debits, and again payEvery later while
// more is owed; a debit not sent is owed again, and waits for the next debt or the
// breaker's closing. One runs at a time (debts.paying).
func (s *Store) payBack() {
	s.debts.mu.Lock()
	owed := s.debts.m
	s.debts.m = nil
	if len(owed) == 0 {
		s.debts.paying = false
		s.debts.mu.Unlock()
		return
	}
	flying := make(chan struct{})
	s.debts.flying = flying
	s.debts.mu.Unlock()
	again := s.charged(owed)
	s.debts.mu.Lock()
	defer s.debts.mu.Unlock()
	s.debts.flying = nil
	close(flying)
	for _, r := range again {
		s.debts.add(r)
	}
	if len(again) > 0 || len(s.debts.m) == 0 {
		s.debts.paying = false
		return
	}
	time.AfterFunc(payEvery, s.payBack) // owed meanwhile
}

// charged charges owed to the primary (in one call of its Lend, for the algorithms that
// lend), and returns the debits to charge again: those that never reached it. A debit
// that failed after it was sent may have landed, and is not sent twice.
func (s *Store) charged(owed map[owedKey]*ratelimit.Request) (again []*ratelimit.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), lateHorizon)
	defer cancel()
	var loans []ratelimit.Loan
	var lent, rest []*ratelimit.Request
	l, lends := s.primary.(ratelimit.Lender)
	for _, r := range owed {
		if lends && r.Spec.Algorithm.Lendable {
			loans = append(loans, ratelimit.Loan{Key: r.Key, Spec: r.Spec, Want: r.N})
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

// notSent reports whether err says its call never reached the primary.
func notSent(err error) bool {
	return errors.Is(err, core.ErrNotSent) || errors.Is(err, core.ErrUndelivered)
}

// forgiveAll drops every debt not yet sent: the primary refused or failed, an outage,
// whose local decisions are not replayed (a key used only while Redis was down was
// written into it once it came back, when a call had timed out as it went down).
func (s *Store) forgiveAll() {
	s.debts.mu.Lock()
	s.debts.m = nil
	s.debts.mu.Unlock()
}

// forgive drops what the shares owe req's key (any rule), and waits, within ctx, for
// the debits of it on their way: a reset that follows finds them counted, and clears
// them. Without it, a key reset while its debts waited was charged them after.
func (s *Store) forgive(ctx context.Context, req ratelimit.Request) {
	s.debts.mu.Lock()
	for k := range s.debts.m {
		if k.alg == req.Spec.Algorithm && k.namespace == req.Spec.Namespace && k.key == req.Key {
			delete(s.debts.m, k)
		}
	}
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
	start := !s.debts.paying && len(s.debts.m) > 0
	s.debts.paying = s.debts.paying || start
	s.debts.mu.Unlock()
	if start {
		time.AfterFunc(payEvery, s.payBack)
	}
}
