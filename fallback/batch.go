package fallback

import (
	"context"
	"errors"
	"fmt"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
	"github.com/ratelimit-go/ratelimit/internal/trace"
)

// shareCapacity is the most req's rule, already a share, admits at once; 0 if the share
// is not a rule the algorithm can count.
func shareCapacity(req core.Request) int64 {
	a, err := req.Spec.Algorithm.Prepare(req.Spec.Rule, 1)
	if err != nil {
		return 0
	}
	return a.Limit
}

var _ core.BatchStore = (*Store)(nil)

// ApplyAll decides reqs all or none. It asks the primary within the timeout: atomically
// when the primary batches, else one by one with refunds. When the primary
// cannot decide, it decides by the policy on the secondary, with each rule's share, all
// or none again. Its errors are Apply's.
func (s *Store) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	capacities := make([]int64, len(reqs))
	for i, r := range reqs {
		if r.Spec.Algorithm == nil {
			return nil, errors.New("fallback: request has no algorithm")
		}
		if r.Spec.Op != core.OpTake || core.OfLeases(r.Spec.Algorithm) {
			return nil, errors.New("fallback: ApplyAll only takes, and no leases")
		}
		a, err := r.Args()
		if err != nil {
			return nil, err // the caller's mistake, not the primary's
		}
		capacities[i] = a.Limit
	}
	if err := core.CheckDistinct("fallback", reqs); err != nil {
		return nil, err
	}
	var lt *late // the takes, which the primary may count after the wait
	start := s.clock.Now()
	refused := true // the breaker let no call through: the primary counts nothing of them
	if ok, probe := s.breaker.allow(); ok {
		refused = false
		preqs := core.InnerReceipts(reqs)
		if s.policy == LocalShare {
			lt = newLate(preqs)
		}
		ds, err := askPrimary(ctx, s, probe, len(reqs), false, func(pctx context.Context) ([]core.Outcome, error) {
			return applyAll(pctx, s.primary, preqs)
		}, func(pctx context.Context, ds []core.Outcome, err error) {
			if lt != nil {
				s.answered(pctx, lt, err, ds, allAllowed(ds))
			}
		})
		if err == nil && s.policy == LocalShare {
			all := true
			for _, d := range ds {
				all = all && d.Allowed()
			}
			for i, d := range ds {
				if all || !d.Allowed() { // when one is denied, none of the others was counted
					s.mirror(ctx, preqs[i], d)
				}
			}
		}
		if err == nil {
			core.WireReceipts(reqs, preqs, ds, int64(Primary), 0)
		}
		if err == nil || ctx.Err() != nil || errors.Is(err, errors.ErrUnsupported) {
			if err != nil && ctx.Err() != nil && lt != nil { // the caller gave up: no decision, the call goes on
				s.decided(ctx, lt, false)
			}
			return ds, err // the primary cannot batch these keys: the caller takes them one by one
		}
		if lt != nil && !errors.Is(err, errTimedOut) { // it failed in time: it counted nothing
			lt = nil
		}
	}
	lreqs := core.InnerReceipts(reqs)
	ds, err := s.decideAllLocally(ctx, lreqs, capacities)
	if refused && err == nil && allAllowed(ds) {
		for i, r := range reqs {
			if r.Receipt != nil {
				s.oweTake(r, lreqs[i].Receipt) // charged with a receipt, its settlement there (see oweTake)
			} else {
				s.owe(r) // the primary is charged it (see owe)
			}
		}
	}
	if lt != nil && err == nil && !allAllowed(ds) {
		if outs, ok := s.stillCounted(ctx, lt, start); ok { // the primary, late, admitted them: its decision
			s.decided(ctx, lt, true)
			for i, d := range outs {
				s.mirror(ctx, lt.takes[i], d)
			}
			core.WireReceipts(reqs, lt.takes, outs, int64(Primary), 0)
			trace.Set(ctx, Primary.String())
			return outs, nil
		}
	}
	if lt != nil {
		admitted := err == nil && allAllowed(ds)
		for i, r := range lreqs {
			if admitted && r.Receipt != nil {
				s.route(r.Receipt, lt, i)
			}
		}
		s.decided(ctx, lt, admitted)
	}
	if err == nil {
		core.WireReceipts(reqs, lreqs, ds, int64(Secondary), max(1, s.clock.Now().UnixMicro()))
		trace.Set(ctx, Secondary.String())
		if s.hooks.OnDecision != nil {
			for range reqs {
				s.hooks.OnDecision(Secondary, 0)
			}
		}
	}
	return ds, err
}

// allAllowed reports whether every one of os was allowed.
func allAllowed(os []core.Outcome) bool {
	for _, o := range os {
		if !o.Allowed() {
			return false
		}
	}
	return len(os) > 0
}

// applyAll is store's ApplyAll, or errors.ErrUnsupported for a store that cannot batch.
func applyAll(ctx context.Context, store ratelimit.Store, reqs []core.Request) ([]core.Outcome, error) {
	if bs, ok := store.(core.BatchStore); ok {
		return bs.ApplyAll(ctx, reqs)
	}
	return nil, fmt.Errorf("fallback: %T decides one key at a time: %w", store, errors.ErrUnsupported)
}

// decideAllLocally decides reqs by the policy while the primary cannot.
func (s *Store) decideAllLocally(ctx context.Context, reqs []core.Request, capacities []int64) ([]core.Outcome, error) {
	ds := make([]core.Outcome, len(reqs))
	switch s.policy {
	case FailOpen:
		for i, r := range reqs {
			ds[i] = core.Args{Limit: capacities[i]}.Outcome(true, capacities[i]-r.N, 0, 0)
		}
		return ds, nil
	case FailClosed:
		for i := range reqs {
			ds[i] = core.Args{Limit: capacities[i]}.Outcome(false, 0, s.breaker.retryAfter(), 0)
		}
		return ds, nil
	}
	shares := make([]core.Request, len(reqs))
	fits := true
	for i, r := range reqs {
		r.Spec = core.WithRule(r.Spec, core.Share(r.Spec.Rule, s.n()))
		shares[i] = r
		share := shareCapacity(r)
		ds[i] = core.Args{Limit: capacities[i]}.Outcome(false, 0, s.breaker.retryAfter(), 0)
		fits = fits && r.N <= share-mathx.Keep(share, r.Spec.Reserve)
	}
	if !fits { // some share can never hold n: none is taken, all wait for the primary
		return ds, nil
	}
	ds, err := applyAll(ctx, s.secondary, shares)
	for i := range ds {
		ds[i] = underRule(ds[i], capacities[i])
	}
	return ds, err
}
