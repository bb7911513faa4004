package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Part is one limit of a decision under several (see AllowAll). It pairs a limiter with
// the key it limits. The limiter comes from an algorithm package: its New's, or a
// fixedwindow.QuotaLimiter. Any other does not compile.
type Part struct {
	Limiter algorithmBased
	Key     string
}

// AllowAll admits n events under every part, or under none. Say a tenant's daily plan
// allows a request, but its per-route rate denies it. Then the request consumes nothing
// from the plan.
//
//	plan, _ := tokenbucket.New(store, ratelimit.PerDay(10_000), ratelimit.WithNamespace("plan"))
//	rate, _ := tokenbucket.New(store, ratelimit.PerSecond(20), ratelimit.WithNamespace("rate"))
//	d, err := ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: plan, Key: tenant},
//		ratelimit.Part{Limiter: rate, Key: tenant})
//
// The parts must share one Store. No two may share an algorithm, a namespace and a key,
// or the error wraps ErrDuplicateKey. On localstore, redisstore and fallback, the
// decision is atomic. On Redis Cluster, that holds when the keys share a hash slot: the
// same key, or keys of one redisstore.TaggedKey tag. Otherwise the parts are taken one
// by one. When one denies, the ones taken are refunded. They are never counted in the
// end, but a concurrent request may see them meanwhile.
//
// The Decision is denied if any part denies, with the longest RetryAfter of the denials.
// Limit and Remaining are those of the tightest part, the one with the least remaining.
// ResetAfter and Delay are the longest.
func AllowAll(ctx context.Context, n int64, parts ...Part) (Decision, error) {
	if len(parts) == 0 {
		return Decision{}, errors.New("ratelimit: AllowAll without parts")
	}
	reqs := make([]core.Request, len(parts))
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
		if _, err := l.alg.Prepare(core.Rule(l.rule), n); err != nil {
			return Decision{}, err
		}
		reqs[i] = core.Request{Key: p.Key, N: n, Spec: l.takes[l.priority(ctx)]}
	}
	// one atomic decision on a store that decides a batch together (localstore under one
	// lock, redisstore in one script); elsewhere the parts are taken one by one, with
	// refunds when one denies
	ds, err := applyAll(ctx, store, reqs)
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

// applyAll is core.ApplyAll's Decisions.
func applyAll(ctx context.Context, store Store, reqs []core.Request) ([]Decision, error) {
	os, err := core.ApplyAll(ctx, store, reqs)
	if err != nil {
		return nil, err
	}
	ds := make([]Decision, len(os))
	for i, o := range os {
		ds[i] = decisionOf(o)
	}
	return ds, nil
}

// sameStore is a == b, without the panic of == on values of an uncomparable type: such a
// store is the same only as itself by identity, which cannot be told, so it is not.
func sameStore(a, b Store) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
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
