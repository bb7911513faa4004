package fallback

import (
	"context"
	"fmt"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/lend"
	"github.com/ratelimit-go/ratelimit/internal/trace"
)

var _ core.Lender = (*Store)(nil)

// Lend lends from the primary, when the primary lends and the breaker lets a
// call through.
//
// Loans to a holder, such as the refills of hotkey.Leases, wait for the primary as long
// as ctx allows. They are refills, not decisions, so the store's timeout does not apply.
// They never fall back to the secondary. The events lent are the primary's, which every
// instance shares, while a share belongs to this instance alone. Loans that only give
// back are sent while the breaker is open too. A loan's Receipt holds the primary's, as
// a take's does (see Apply).
//
// When the primary cannot lend, loans to a holder fail with an error wrapping
// ratelimit.ErrUnavailable. That is when the breaker is open, the primary fails, or it is
// no Lender. The holders' leases then run out by themselves, and their requests are
// decided here, on the shares. With the LocalShare policy, what the primary lends a
// holder is taken from this instance's shares too. A key that lends less than asked
// empties them, as a denial does. So what a lease spends through an outage is spent from
// the shares, and the two together admit the rule.
//
// Partial takes are loans without a holder (AlgorithmLimiter.AllowAtMost). They are
// decided as Apply decides a take: on the primary within the timeout, and mirrored onto
// this instance's share. When the primary cannot decide them, they go to the share, by
// the policy. That is when the breaker is open, or the primary fails, is late, or does
// not lend. Like Apply, they never return the primary's errors.
//
// Partial debits charge events admitted before they were counted, as hotkey.Leases
// does. They are not decisions. They wait for the primary as long as ctx allows, and are
// mirrored onto the shares. They go to the shares alone when the primary cannot take
// them.
func (s *Store) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !allPartial(loans) {
		return s.lendHeld(ctx, loans)
	}
	if lend.Debits(loans) {
		return s.charge(ctx, loans)
	}
	for _, l := range loans { // the caller's mistakes, before either store is asked
		if l.Spec == nil || l.Spec.Algorithm == nil {
			return nil, fmt.Errorf("fallback: a loan without an algorithm")
		}
		if _, err := (core.Request{Key: l.Key, N: 1, Spec: l.Spec}).Args(); err != nil {
			return nil, err
		}
		if l.Spec.Op == core.OpDebit {
			if err := lend.Check(l); err != nil {
				return nil, err
			}
		}
	}
	refused := true // the breaker let no call through: the primary counts nothing of them
	if l, ok := s.primary.(core.Lender); ok {
		if ok, probe := s.breaker.allow(); ok {
			refused = false
			lent, err := askPrimary(ctx, s, probe, len(loans), false, func(pctx context.Context) ([]core.Lent, error) {
				return l.Lend(pctx, loans)
			}, nil)
			if err == nil && s.policy == LocalShare {
				for i, loan := range loans {
					if lent[i].N > 0 || !lent[i].Outcome.Allowed() { // what was taken, or a denial; not a look
						s.mirror(ctx, core.Request{Key: loan.Key, N: max(1, lent[i].N), Spec: loan.Spec}, lent[i].Outcome)
					}
				}
			}
			if err == nil || ctx.Err() != nil {
				return lent, err
			}
		}
	}
	lent, err := s.lendLocally(ctx, loans)
	if err == nil && refused {
		for i, loan := range loans {
			if lent[i].N > 0 {
				s.owe(core.Request{Key: loan.Key, N: lent[i].N, Spec: loan.Spec}) // the primary is charged them (see owe)
			}
		}
	}
	return lent, err
}

// lendHeld lends to holders, from the primary alone.
func (s *Store) lendHeld(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	l, ok := s.primary.(core.Lender)
	if !ok {
		return nil, fmt.Errorf("fallback: the primary (%T) does not lend: %w", s.primary, ratelimit.ErrUnavailable)
	}
	// Loans that only give back are sent whatever the breaker says: they decide nothing,
	// nothing waits on them, and refused they would lose what they hold (a Close's).
	decides := false
	for _, l := range loans {
		decides = decides || l.Want > 0 || l.Revoke
	}
	if b := s.BreakerState(); b != Closed && decides {
		return nil, fmt.Errorf("fallback: the primary is unavailable (the breaker is %v): %w", b, ratelimit.ErrUnavailable)
	}
	sent, cloned := loans, false
	for i, loan := range loans { // receipts of the primary's own, wrapped in the callers' as Apply's are
		if loan.Receipt != nil {
			if !cloned {
				sent, cloned = append([]core.Loan(nil), loans...), true
			}
			sent[i].Receipt = &core.Receipt{}
		}
	}
	lent, err := l.Lend(ctx, sent)
	if err != nil && ctx.Err() == nil {
		return nil, fmt.Errorf("fallback: the primary could not lend: %w: %v", ratelimit.ErrUnavailable, err)
	}
	for i, loan := range loans {
		if loan.Receipt != nil && err == nil && sent[i].Receipt.At > 0 {
			loan.Receipt.At, loan.Receipt.Via, loan.Receipt.Next = sent[i].Receipt.At, int64(Primary), sent[i].Receipt
		}
	}
	if err == nil && s.policy == LocalShare { // what this instance may spend from memory is spent from its shares too
		for i, loan := range loans {
			switch {
			case lent[i].N < loan.Want: // the key lent less than asked: at its rule, as a denial says
				s.mirror(ctx, core.Request{Key: loan.Key, N: 1, Spec: loan.Spec}, core.Outcome{})
			case lent[i].N > 0:
				s.mirror(ctx, core.Request{Key: loan.Key, N: lent[i].N, Spec: loan.Spec}, lent[i].Outcome)
			}
		}
	}
	return lent, err
}

// lendLocally decides partial takes by the policy while the primary cannot: on this
// instance's share of each rule, on the secondary.
func (s *Store) lendLocally(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	lent := make([]core.Lent, len(loans))
	switch s.policy {
	case FailOpen, FailClosed:
		for i, l := range loans {
			req := core.Request{Key: l.Key, N: 1, Spec: l.Spec}
			a, _ := req.Args() // checked by Lend
			o, err := s.decideLocally(ctx, req, a.Limit)
			if err != nil {
				return nil, err
			}
			lent[i].Outcome = o
			if o.Allowed() || l.Spec.Op == core.OpDebit { // a debit is charged whatever the key has left
				lent[i].N = l.Want
			}
		}
		return lent, nil
	}
	local, ok := s.secondary.(core.Lender)
	if !ok {
		return nil, fmt.Errorf("fallback: neither the primary nor the secondary (%T) can grant part of a request: %w", s.secondary, ratelimit.ErrUnavailable)
	}
	shared := make([]core.Loan, len(loans))
	for i, l := range loans {
		shared[i] = l
		shared[i].Spec = core.WithRule(l.Spec, s.share(core.Request{Key: l.Key, N: 1, Spec: l.Spec}))
	}
	lent, err := local.Lend(ctx, shared)
	for i := range lent {
		a, _ := (core.Request{Key: loans[i].Key, N: 1, Spec: loans[i].Spec}).Args() // checked by Lend
		lent[i].Outcome = underRule(lent[i].Outcome, a.Limit)
	}
	if err == nil && !lend.Debits(loans) {
		trace.Set(ctx, Secondary.String())
		if s.hooks.OnDecision != nil {
			for range loans {
				s.hooks.OnDecision(Secondary, 0)
			}
		}
	}
	return lent, err
}

// charge charges partial debits to the primary, waiting for it as long as ctx allows,
// and mirrors them onto this instance's shares; when the primary cannot take them (the
// breaker is open, it fails, it does not lend), to the shares alone, by the policy.
func (s *Store) charge(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	for _, l := range loans {
		if err := lend.Check(l); err != nil {
			return nil, err
		}
	}
	closed := s.BreakerState() == Closed
	if l, ok := s.primary.(core.Lender); ok && closed {
		lent, err := l.Lend(ctx, loans)
		if err == nil && s.policy == LocalShare {
			for i, loan := range loans {
				s.mirror(ctx, core.Request{Key: loan.Key, N: loan.Want, Spec: loan.Spec}, lent[i].Outcome)
			}
		}
		if err == nil || ctx.Err() != nil {
			return lent, err
		}
	}
	lent, err := s.lendLocally(ctx, loans)
	if err == nil && !closed { // counted on the share alone: the primary is charged them (see owe)
		for _, loan := range loans {
			s.owe(core.Request{Key: loan.Key, N: loan.Want, Spec: loan.Spec})
		}
	}
	return lent, err
}

// allPartial reports whether every loan is a partial take (no holder).
func allPartial(loans []core.Loan) bool {
	for _, l := range loans {
		if l.Holder != 0 {
			return false
		}
	}
	return true
}
