package fallback

import (
	"context"
	"fmt"

	"github.com/ratelimit-go/ratelimit"
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
func (s *Store) Lend(ctx context.Context, loans []ratelimit.Loan) ([]ratelimit.Lent, error) {
	l, ok := s.primary.(ratelimit.Lender)
	if !ok {
		return nil, fmt.Errorf("fallback: the primary (%T) does not lend: %w", s.primary, ratelimit.ErrUnavailable)
	}
	if b := s.BreakerState(); b != Closed {
		return nil, fmt.Errorf("fallback: the primary is unavailable (the breaker is %v): %w", b, ratelimit.ErrUnavailable)
	}
	return l.Lend(ctx, loans)
}
