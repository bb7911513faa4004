package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"reflect"
)

// Part is one limit of a decision under several (see AllowAll): a limiter of one of the
// algorithm packages (its New's, or a fixedwindow.QuotaLimiter; any other does not
// compile) and the key it limits. Limits of another kind join one decision through
// ApplyAll, with Requests of their own.
type Part struct {
	Limiter algorithmBased
	Key     string
}

// AllowAll admits n events under every part, or under none: a request a tenant's daily
// plan allows but its per-route rate denies consumes nothing from the plan.
//
//	plan, _ := tokenbucket.New(store, ratelimit.PerDay(10_000), ratelimit.WithNamespace("plan"))
//	rate, _ := tokenbucket.New(store, ratelimit.PerSecond(20), ratelimit.WithNamespace("rate"))
//	d, err := ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: plan, Key: tenant},
//		ratelimit.Part{Limiter: rate, Key: tenant})
//
// The parts must share one Store and name distinct (limiter namespace, key) pairs. On a
// BatchStore the decision is atomic (one lock, one script; on Redis Cluster when the keys
// share a hash slot: the same key, or keys of one redisstore.TaggedKey tag). Otherwise the
// parts are taken one by one and, when one denies, the ones taken are refunded: never
// counted in the end, but visible to a concurrent request meanwhile.
//
// The Decision is denied if any part denies, with the longest RetryAfter of the denials;
// Limit and Remaining are the tightest part's (the least remaining); ResetAfter and Delay
// are the longest.
func AllowAll(ctx context.Context, n int64, parts ...Part) (Decision, error) {
	if len(parts) == 0 {
		return Decision{}, errors.New("ratelimit: AllowAll without parts")
	}
	reqs := make([]Request, len(parts))
	var store Store
	for i, p := range parts {
		var l *AlgorithmLimiter
		if p.Limiter != nil {
			l = p.Limiter.base()
		}
		if l == nil {
			return Decision{}, fmt.Errorf("ratelimit: AllowAll: part %d has no limiter", i)
		}
		if i == 0 {
			store = l.store
		} else if !sameStore(store, l.store) {
			return Decision{}, fmt.Errorf("ratelimit: AllowAll: part %d has another store than part 0 (%T)", i, l.store)
		}
		if _, err := l.alg.Prepare(l.rule, n); err != nil {
			return Decision{}, err
		}
		reqs[i] = Request{Key: p.Key, N: n, Spec: l.takes[l.priority(ctx)]}
	}
	ds, err := ApplyAll(ctx, store, reqs)
	if err != nil {
		return Decision{}, err
	}
	return combine(ds), nil
}

// algorithmBased is a limiter built on AlgorithmLimiter: every algorithm package's
// Limiter, and a type that embeds one. Part and Policy take it, so that another limiter
// does not compile there.
type algorithmBased interface {
	Limiter
	base() *AlgorithmLimiter
}

// ApplyAll takes reqs on store all or none, as AllowAll does for its parts. It returns
// each request's Decision as it would be alone: a request that would be allowed alone
// says so, even when another denies and nothing was counted. It serves an application
// that builds its own Requests, one limit per rule of a rule engine, say. The requests must
// be takes of distinct (algorithm, namespace, key) triples. On a BatchStore that can
// decide them together it is one atomic decision; otherwise they are taken one by one
// and, when one is denied, those taken before are refunded.
func ApplyAll(ctx context.Context, store Store, reqs []Request) ([]Decision, error) {
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
	if err := distinct(reqs); err != nil {
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
	ds := make([]Decision, len(os))
	for i, o := range os {
		ds[i] = o.Decision()
	}
	return ds, nil
}

// sameStore is a == b, without the panic of == on values of an uncomparable type: such a
// store is the same only as itself by identity, which cannot be told, so it is not.
func sameStore(a, b Store) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

// distinct returns an error if two requests name the same algorithm, namespace and key.
func distinct(reqs []Request) error {
	type id struct {
		alg     *Algorithm
		ns, key string
	}
	seen := make(map[id]bool, len(reqs))
	for _, r := range reqs {
		k := id{r.Spec.Algorithm, r.Spec.Namespace, r.Key}
		if seen[k] {
			return fmt.Errorf("%w: %s key %q of namespace %q", ErrDuplicateKey, r.Spec.Algorithm.Name, r.Key, r.Spec.Namespace)
		}
		seen[k] = true
	}
	return nil
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
			back.Spec = withOp(back.Spec, OpRefund)
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
			peek.Spec = withOp(peek.Spec, OpPeek)
			if ds[k], err = store.Apply(ctx, peek); err != nil {
				return nil, err
			}
		}
		return ds, nil // those refunded say, as on a BatchStore, that they would be allowed alone
	}
	return ds, nil
}

// combine is the Decision of several limits decided together (see AllowAll).
func combine(ds []Decision) Decision {
	out := Decision{Allowed: true}
	for i, d := range ds {
		if !d.Allowed {
			out.Allowed = false
			out.RetryAfter = max(out.RetryAfter, d.RetryAfter)
		}
		if i == 0 || d.Remaining < out.Remaining {
			out.Limit, out.Remaining = d.Limit, d.Remaining
		}
		out.ResetAfter = max(out.ResetAfter, d.ResetAfter)
		out.Delay = max(out.Delay, d.Delay)
	}
	if !out.Allowed {
		out.Delay = 0
	}
	return out
}
