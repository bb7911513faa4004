package core

import (
	"context"
	"errors"
	"fmt"
)

// ApplyAll takes reqs on store all or none, and returns each request's Outcome as it
// would be alone: a request that would be allowed alone says so, even when another denies
// and nothing was counted. The requests must be takes of distinct (algorithm, namespace,
// key) triples. On a BatchStore that can decide them together it is one atomic decision;
// otherwise they are taken one by one and, when one is denied, those taken before are
// refunded.
func ApplyAll(ctx context.Context, store Store, reqs []Request) ([]Outcome, error) {
	if store == nil {
		return nil, errors.New("ratelimit: ApplyAll on a nil store")
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	for i, r := range reqs {
		if r.Spec == nil || r.Spec.Algorithm == nil || r.Spec.Op != OpTake {
			return nil, fmt.Errorf("ratelimit: ApplyAll: request %d is not a take of an algorithm", i)
		}
	}
	if err := CheckDistinct("", reqs); err != nil { // ErrDuplicateKey names the module
		return nil, err
	}
	for _, r := range reqs {
		if _, err := r.Args(); err != nil {
			return nil, err
		}
	}
	var os []Outcome
	var err error
	if len(reqs) == 1 { // one limit: the store's Apply, its own fastest path (hotkey.Leases' from a lease)
		var o Outcome
		if o, err = store.Apply(ctx, reqs[0]); err == nil {
			os = []Outcome{o}
		}
	} else if bs, ok := store.(BatchStore); ok {
		os, err = bs.ApplyAll(ctx, reqs)
	}
	if os == nil && (err == nil || errors.Is(err, errors.ErrUnsupported)) {
		os, err = applyEach(ctx, store, reqs)
	}
	if err != nil {
		return nil, err
	}
	return os, nil
}

// applyEach takes reqs one by one on store and, when one is denied, refunds those taken
// before it, each with the receipt of its take: all or none in the end, but not atomic.
// A request that carries a Receipt of its own keeps it.
func applyEach(ctx context.Context, store Store, reqs []Request) ([]Outcome, error) {
	ds := make([]Outcome, len(reqs))
	taken := make([]Request, len(reqs))
	for i, r := range reqs {
		if r.Receipt == nil {
			r.Receipt = &Receipt{}
		}
		taken[i] = r
		d, err := store.Apply(ctx, r)
		if err == nil && d.Allowed() {
			ds[i] = d
			continue
		}
		for j := range i { // give back what was taken
			back := taken[j]
			back.Spec = WithOp(back.Spec, OpRefund)
			if _, rerr := store.Apply(context.WithoutCancel(ctx), back); rerr != nil && err == nil {
				err = rerr
			}
		}
		if err != nil {
			return nil, err
		}
		ds[i] = d
		for k := i + 1; k < len(reqs); k++ { // the rest, as they stand
			peek := reqs[k]
			peek.Spec = WithOp(peek.Spec, OpPeek)
			if ds[k], err = store.Apply(ctx, peek); err != nil {
				return nil, err
			}
		}
		return ds, nil // those refunded say, as on a BatchStore, that they would be allowed alone
	}
	return ds, nil
}
