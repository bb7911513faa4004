package localstore

import (
	"context"
	"errors"
	"slices"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

var _ ratelimit.BatchStore = (*Store)(nil)

// ApplyAll takes every request or none, atomically: it locks the shards of all the keys
// in ascending order (so that two batches never wait on each other in a cycle), then the
// keys (a new key locked before it enters its table), decides each request on a copy of
// its key's state, and writes the copies back only if every request is allowed. Errors
// as Apply's; a key named twice is an error wrapping ratelimit.ErrDuplicateKey.
func (s *Store) ApplyAll(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	args := make([]ratelimit.Args, len(reqs))
	shardOf := make([]int, len(reqs))
	hashes := make([]uint64, len(reqs))
	spaces := make([]*space, len(reqs))
	for i, r := range reqs {
		if r.Spec == nil {
			return nil, errNoSpec
		}
		sp, err := s.space(r.Spec.Algorithm, r.Spec.Namespace)
		if err != nil {
			return nil, err
		}
		if r.Spec.Op != "" || core.OfLeases(r.Spec.Algorithm) {
			return nil, errors.New("localstore: ApplyAll only takes, and no leases")
		}
		a, err := r.Args()
		if err != nil {
			return nil, err
		}
		hashes[i] = s.hash.sum(r.Key)
		spaces[i] = sp
		args[i], shardOf[i] = a, int(hashes[i]&s.mask)
	}
	if err := core.CheckDistinct("localstore", reqs); err != nil {
		return nil, err
	}
	order := slices.Clone(shardOf)
	slices.Sort(order)
	order = slices.Compact(order)
	for _, i := range order {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range order {
			s.shards[i].mu.Unlock()
		}
	}()
	now := s.now() // the caller's; each key's state holds its own latest instant

	entries := make([]*entry, len(reqs))
	defer func() { // before the shards'
		for _, e := range entries {
			if e != nil {
				e.mu.Unlock()
			}
		}
	}()
	states := make([]ratelimit.State, len(reqs))
	ds := make([]ratelimit.Outcome, len(reqs))
	all := true
	for i, r := range reqs {
		sh := &s.shards[shardOf[i]]
		if e := sh.table(spaces[i]).keys.get(hashes[i], r.Key); e != nil {
			e.mu.Lock()
			entries[i] = e
			if e.expires > now {
				states[i] = core.Clone(e.state)
			}
		}
		ds[i] = r.Spec.Algorithm.Step(&states[i], now, args[i])
		all = all && ds[i].Allowed
	}
	if !all {
		return ds, nil
	}
	for i, r := range reqs {
		e := entries[i]
		if e == nil {
			sh := &s.shards[shardOf[i]]
			e = &entry{}
			e.mu.Lock()
			entries[i] = e
			s.add(sh, &sh.table(spaces[i]).keys, hashes[i], r.Key, now, e)
		}
		e.state = states[i]
		e.expires = now + expiry(ds[i].Reset)
	}
	return ds, nil
}
