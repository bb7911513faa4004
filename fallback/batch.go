package fallback

import (
	"context"
	"errors"

	"github.com/ratelimit-go/ratelimit"
)

var _ ratelimit.BatchStore = (*Store)(nil)

// ApplyAll decides reqs all or none: on the primary within the timeout (atomically when
// it is a ratelimit.BatchStore, else one by one with refunds), or, when the primary
// cannot decide, by the policy on the secondary, with each rule's share, all or none
// again. Errors as Apply's.
func (s *Store) ApplyAll(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	capacities := make([]int64, len(reqs))
	for i, r := range reqs {
		if r.Algorithm == nil {
			return nil, errors.New("fallback: request has no algorithm")
		}
		if r.Op != ratelimit.Take {
			return nil, errors.New("fallback: ApplyAll takes; it does not " + r.Op.String())
		}
		a, err := r.Algorithm.Prepare(r.Rule, r.N)
		if err != nil {
			return nil, err // the caller's mistake, not the primary's
		}
		capacities[i] = a.Limit
	}
	if err := ratelimit.CheckDistinct(reqs); err != nil {
		return nil, err
	}
	if ok, probe := s.breaker.allow(); ok {
		ds, err := askPrimary(ctx, s, probe, func(pctx context.Context) ([]ratelimit.Decision, error) {
			return applyAll(pctx, s.primary, reqs)
		})
		if err == nil || ctx.Err() != nil {
			return ds, err
		}
	}
	ds, err := s.decideAllLocally(ctx, reqs, capacities)
	if err == nil && s.hooks.OnDecision != nil {
		s.hooks.OnDecision(Secondary, 0)
	}
	return ds, err
}

func applyAll(ctx context.Context, store ratelimit.Store, reqs []ratelimit.Request) ([]ratelimit.Decision, error) {
	if bs, ok := store.(ratelimit.BatchStore); ok {
		return bs.ApplyAll(ctx, reqs)
	}
	return ratelimit.ApplyEach(ctx, store, reqs)
}

// decideAllLocally decides reqs by the policy while the primary cannot.
func (s *Store) decideAllLocally(ctx context.Context, reqs []ratelimit.Request, capacities []int64) ([]ratelimit.Decision, error) {
	ds := make([]ratelimit.Decision, len(reqs))
	switch s.policy {
	case AllowAll:
		for i, r := range reqs {
			ds[i] = ratelimit.Decision{Allowed: true, Limit: capacities[i], Remaining: capacities[i] - r.N}
		}
		return ds, nil
	case DenyAll:
		for i := range reqs {
			ds[i] = ratelimit.Decision{Limit: capacities[i], RetryAfter: s.breaker.retryAfter()}
		}
		return ds, nil
	}
	shares := make([]ratelimit.Request, len(reqs))
	fits := true
	for i, r := range reqs {
		r.Rule = r.Rule.Share(s.instances)
		shares[i] = r
		share := max(1, (capacities[i]+s.instances-1)/s.instances)
		ds[i] = ratelimit.Decision{Limit: share, RetryAfter: s.breaker.retryAfter()}
		fits = fits && r.N <= share
	}
	if !fits { // some share can never hold n: none is taken, all wait for the primary
		return ds, nil
	}
	return applyAll(ctx, s.secondary, shares)
}
