package localstore

import (
	"context"
	"errors"
	"slices"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

var _ core.BatchStore = (*Store)(nil)

// ApplyAll takes every request or none, atomically. It decides each request on a copy of
// its key's state, and writes the copies back only if every request is allowed. Its
// errors are Apply's. A key named twice is an error wrapping ratelimit.ErrDuplicateKey.
func (s *Store) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	// It locks the shards of all the keys in ascending order, so that two batches never
	// wait on each other in a cycle. It then locks the keys, a new key before it enters
	// its table.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := s.newBatch(reqs)
	if err != nil {
		return nil, err
	}
	unlock := b.lock()
	defer unlock()
	now := s.now() // the caller's; each key's state holds its own latest instant
	if ds, all := b.decide(now); !all {
		return ds, nil
	}
	return b.commit(now), nil
}

// batch is the requests of one ApplyAll, and what deciding them needs.
type batch struct {
	s       *Store
	reqs    []core.Request
	args    []core.Args
	hashes  []uint64
	shardOf []int
	spaces  []*space
	entries []*entry // locked by decide; nil for a key not yet held
	states  []core.State
	ds      []core.Outcome
}

// newBatch checks reqs and derives what deciding them needs; errors as Apply's.
func (s *Store) newBatch(reqs []core.Request) (*batch, error) {
	n := len(reqs)
	b := &batch{s: s, reqs: reqs, args: make([]core.Args, n), hashes: make([]uint64, n), shardOf: make([]int, n),
		spaces: make([]*space, n), entries: make([]*entry, n), states: make([]core.State, n), ds: make([]core.Outcome, n)}
	for i, r := range reqs {
		if r.Spec == nil {
			return nil, errNoSpec
		}
		sp, err := s.space(r.Spec.Algorithm, r.Spec.Namespace)
		if err != nil {
			return nil, err
		}
		if r.Spec.Op != core.OpTake || core.OfLeases(r.Spec.Algorithm) {
			return nil, errors.New("localstore: ApplyAll only takes, and no leases")
		}
		if b.args[i], err = r.Args(); err != nil {
			return nil, err
		}
		b.hashes[i] = s.hash.sum(r.Key)
		b.spaces[i], b.shardOf[i] = sp, int(b.hashes[i]&s.mask)
	}
	return b, core.CheckDistinct("localstore", reqs)
}

// lock locks the shards of the batch's keys in ascending order, so that two batches never
// wait on each other in a cycle; the function it returns unlocks the keys decide locked,
// then the shards.
func (b *batch) lock() (unlock func()) {
	order := slices.Clone(b.shardOf)
	slices.Sort(order)
	order = slices.Compact(order)
	for _, i := range order {
		b.s.shards[i].mu.Lock()
	}
	return func() {
		for _, e := range b.entries {
			if e != nil {
				e.mu.Unlock()
			}
		}
		for _, i := range order {
			b.s.shards[i].mu.Unlock()
		}
	}
}

// decide decides each request on a copy of its key's state, locking the keys held, and
// reports whether every one is allowed; the shards are locked.
func (b *batch) decide(now int64) ([]core.Outcome, bool) {
	all := true
	for i, r := range b.reqs {
		sh := &b.s.shards[b.shardOf[i]]
		if e := sh.table(b.spaces[i]).keys.get(b.hashes[i], r.Key); e != nil {
			e.mu.Lock()
			b.entries[i] = e
			if e.expires > now {
				b.states[i] = core.Clone(e.state)
			}
		}
		b.ds[i] = r.Spec.Algorithm.Step(&b.states[i], now, b.args[i])
		all = all && b.ds[i].Allowed()
	}
	return b.ds, all
}

// commit writes the decided states back, each new key locked before it enters its table.
func (b *batch) commit(now int64) []core.Outcome {
	for i, r := range b.reqs {
		e := b.entries[i]
		if e == nil {
			sh := &b.s.shards[b.shardOf[i]]
			e = &entry{}
			e.mu.Lock()
			b.entries[i] = e
			b.s.add(sh, &sh.table(b.spaces[i]).keys, b.hashes[i], r.Key, now, e)
		}
		e.state = b.states[i]
		e.keep(b.spaces[i].alg, now, b.ds[i].Reset)
		if rc := r.Receipt; rc != nil {
			rc.At = e.state.Time
		}
	}
	return b.ds
}
