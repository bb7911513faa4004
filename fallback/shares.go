package fallback

import (
	"context"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
	"github.com/ratelimit-go/ratelimit/internal/trace"
)

// release gives back a lease the primary granted after its decision was made on the
// secondary (its answer came after the timeout): nobody holds it, and left alone it
// would keep a slot of the in-flight limit until it expired.
func (s *Store) release(ctx context.Context, req core.Request, d core.Outcome) {
	if req.Spec.Op == core.OpTake && d.Allowed() && core.OfLeases(req.Spec.Algorithm) {
		req.Spec = core.WithOp(req.Spec, core.OpRefund)
		s.primary.Apply(ctx, req)
	}
}

// mirror applies to the secondary, on this instance's share, what the primary decided
// for it, so that when the primary fails the share has already spent what the cluster
// has: an admission of n takes n from the share if it holds them, a denial (the key is
// spent cluster-wide) empties it, and a reset resets it (a refund of a rate algorithm's
// take gives nothing back to the share: it never took those events with a receipt). Without it the
// primary and the shares each admit a full allowance whenever the breaker flaps. The
// leases of an in-flight limit are mirrored one by one, with their ids, so that a
// release or an extension finds its lease on the share too; a denial leaves the share's
// leases alone.
func (s *Store) mirror(ctx context.Context, req core.Request, d core.Outcome) {
	if req.Spec.Op == core.OpPeek || req.Spec.Op == core.OpRefund && !core.OfLeases(req.Spec.Algorithm) {
		return // a refund of the share's own takes alone: what it mirrored stays spent
	}
	req.Receipt = nil // the primary's, not the share's
	req.Spec = core.WithRule(req.Spec, s.share(req))
	if req.Spec.Op == core.OpExtend && !d.Allowed() {
		return // a lease the primary no longer holds: the share's copy expires by itself
	}
	if req.Spec.Op == core.OpTake {
		share := shareCapacity(req)
		if share == 0 || (!d.Allowed() && d.Remaining > 0) { // nothing to mirror; or n was too many, the key not spent
			return
		}
		if !d.Allowed() && core.OfLeases(req.Spec.Algorithm) {
			return // the share's leases are those of requests in progress: they stay
		}
		if !d.Allowed() {
			empty := req
			empty.Spec = core.WithOp(req.Spec, core.OpReset)
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
func (s *Store) share(req core.Request) core.Rule {
	if !core.OfLeases(req.Spec.Algorithm) {
		return core.Share(req.Spec.Rule, s.n())
	}
	return core.PortionLeases(req.Spec.Rule, 1, s.n())
}

// underRule is o, a decision of a share, under the rule's Limit, capacity: the limit a
// client is told is the rule's, whatever part of it this instance decides on.
func underRule(o core.Outcome, capacity int64) core.Outcome {
	return core.Args{Limit: capacity}.Outcome(o.Allowed(), min(o.Remaining, capacity), o.Wait, o.Reset)
}

// n is the number of instances sharing the rule now.
func (s *Store) n() int64 {
	if s.count != nil {
		return int64(max(1, s.count()))
	}
	return s.instances
}

// decideLocally decides by the policy while the primary cannot; capacity is the most the
// rule allows at once.
func (s *Store) decideLocally(ctx context.Context, req core.Request, capacity int64) (core.Outcome, error) {
	var d core.Outcome
	var err error
	switch s.policy {
	case FailOpen:
		d = core.Args{Limit: capacity}.Outcome(true, max(0, capacity-req.N), 0, 0)
	case FailClosed:
		d = core.Args{Limit: capacity}.Outcome(false, 0, s.breaker.retryAfter(), 0)
	default:
		// this instance's share of the rule; its capacity is the rule's divided likewise,
		// and the Decision says the rule's (what a client reads as the limit)
		req.Spec = core.WithRule(req.Spec, s.share(req))
		if share := shareCapacity(req); req.Spec.Op != core.OpDebit && req.N > share-mathx.Keep(share, req.Spec.Reserve) { // never fits the share
			d = core.Args{Limit: capacity}.Outcome(false, 0, s.breaker.retryAfter(), 0) // wait for the primary
		} else if d, err = s.secondary.Apply(ctx, req); err == nil {
			d = underRule(d, capacity)
		}
	}
	if err == nil && req.Spec.Op == core.OpTake {
		trace.Set(ctx, Secondary.String())
		if s.hooks.OnDecision != nil {
			s.hooks.OnDecision(Secondary, 0)
		}
	}
	return d, err
}
