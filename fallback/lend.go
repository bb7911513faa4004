package fallback

import (
	"context"
	"fmt"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

var _ ratelimit.Lender = (*Store)(nil)

// Lend lends from the primary, when it is a ratelimit.Lender and the breaker is closed.
// A loan waits for the primary as long as ctx allows (a refill of leases, not a
// decision: no timeout of the store's applies), and never falls back to the secondary:
// the events lent are the primary's, which every instance shares, while the secondary's
// shares are this instance's alone. While the breaker is open, and for a primary that
// does not lend, it returns an error wrapping ratelimit.ErrUnavailable: the holders'
// leases then run out by themselves, and their requests are decided here, on the
// shares.
//
// Partial takes (loans without a holder: AlgorithmLimiter.AllowAtMost) are decisions of
// their own: while the primary cannot lend, they take from this instance's share on the
// secondary, as a take would.
func (s *Store) Lend(ctx context.Context, loans []ratelimit.Loan) ([]ratelimit.Lent, error) {
	l, ok := s.primary.(ratelimit.Lender)
	if !ok {
		return nil, fmt.Errorf("fallback: the primary (%T) does not lend: %w", s.primary, ratelimit.ErrUnavailable)
	}
	b := s.BreakerState()
	if b == Closed {
		return l.Lend(ctx, loans)
	}
	if local, partial := s.secondary.(ratelimit.Lender); partial && s.policy == LocalShare && allPartial(loans) {
		shared := make([]ratelimit.Loan, len(loans))
		for i, loan := range loans {
			shared[i] = loan
			shared[i].Spec = core.WithRule(loan.Spec, core.Share(loan.Spec.Rule, s.n()))
		}
		return local.Lend(ctx, shared)
	}
	return nil, fmt.Errorf("fallback: the primary is unavailable (the breaker is %v): %w", b, ratelimit.ErrUnavailable)
}

// allPartial reports whether every loan is a partial take (no holder).
func allPartial(loans []ratelimit.Loan) bool {
	for _, l := range loans {
		if l.Holder != 0 {
			return false
		}
	}
	return true
}
