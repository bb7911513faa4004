package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// BatchStore is a Store that decides several takes at once, all or none: either every
// request is allowed and counted, or none is counted. ApplyAll returns each request's
// Decision, in order, as it would be alone (when any is denied, none was counted).
// localstore, redisstore and fallback are BatchStores.
type BatchStore interface {
	Store
	ApplyAll(ctx context.Context, reqs []Request) ([]Decision, error)
}

// ErrDuplicateKey: one decision names the same algorithm and key twice.
var ErrDuplicateKey = errors.New("ratelimit: a key appears twice in one decision")

// Part is one limit of a decision under several: a limiter (every algorithm's is one)
// and the key it limits.
type Part struct {
	Limiter interface {
		Algorithm() *Algorithm
		Rule() Rule
		Store() Store
	}
	Key string
}

// AllowAll admits n events under every part, or under none: a request a tenant's daily
// plan allows but its per-route rate denies consumes nothing from the plan. The parts
// must share one Store. On a BatchStore the decision is atomic (one lock, one script);
// on another Store the parts are taken one by one and, when one denies, the ones taken
// are refunded: never counted in the end, but visible to a concurrent request meanwhile.
//
// The Decision is denied if any part denies, with the longest RetryAfter of the denials;
// Limit and Remaining are the tightest part's (the least remaining); ResetAfter and Delay
// are the longest.
func AllowAll(ctx context.Context, n int64, parts ...Part) (Decision, error) {
	if len(parts) == 0 {
		return Decision{}, errors.New("ratelimit: AllowAll without parts")
	}
	store := parts[0].Limiter.Store()
	reqs := make([]Request, len(parts))
	for i, p := range parts {
		if p.Limiter.Store() != store {
			return Decision{}, errors.New("ratelimit: the parts of AllowAll must share one store")
		}
		alg, rule := p.Limiter.Algorithm(), p.Limiter.Rule()
		if _, err := alg.Prepare(rule, n); err != nil {
			return Decision{}, err
		}
		reqs[i] = Request{Algorithm: alg, Key: p.Key, Rule: rule, N: n}
	}
	if err := CheckDistinct(reqs); err != nil {
		return Decision{}, err
	}
	var ds []Decision
	var err error
	if bs, ok := store.(BatchStore); ok {
		ds, err = bs.ApplyAll(ctx, reqs)
	} else {
		ds, err = ApplyEach(ctx, store, reqs)
	}
	if err != nil {
		return Decision{}, err
	}
	return Combine(ds), nil
}

// CheckDistinct returns ErrDuplicateKey if two requests name the same algorithm and key.
func CheckDistinct(reqs []Request) error {
	type id struct {
		alg *Algorithm
		key string
	}
	seen := make(map[id]bool, len(reqs))
	for _, r := range reqs {
		if seen[id{r.Algorithm, r.Key}] {
			return fmt.Errorf("%w: %s %q", ErrDuplicateKey, r.Algorithm.Name, r.Key)
		}
		seen[id{r.Algorithm, r.Key}] = true
	}
	return nil
}

// ApplyEach takes reqs one by one on store and, when one is denied, refunds those taken
// before it: all or none in the end, but not atomic (see AllowAll). Stores use it for
// what they cannot decide at once.
func ApplyEach(ctx context.Context, store Store, reqs []Request) ([]Decision, error) {
	ds := make([]Decision, len(reqs))
	for i, r := range reqs {
		d, err := store.Apply(ctx, r)
		if err == nil && d.Allowed {
			ds[i] = d
			continue
		}
		for j := range i { // give back what was taken
			back := reqs[j]
			back.Op = Refund
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
			peek.Op = Peek
			if ds[k], err = store.Apply(ctx, peek); err != nil {
				return nil, err
			}
		}
		for j := range i {
			ds[j].Allowed = false
		}
		return ds, nil
	}
	return ds, nil
}

// Combine is the Decision of several limits decided together (see AllowAll).
func Combine(ds []Decision) Decision {
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

// Multi is a Limiter that admits only what each of its limiters admits, all or none, on
// one key family: limiter i limits TaggedKey(key, i), so that all the keys of one key
// share a Redis Cluster hash slot and are decided in one script. It is safe for
// concurrent use.
type Multi struct {
	parts []Part
}

var _ Limiter = (*Multi)(nil)

// NewMulti returns a Multi of limiters, which must share one store.
func NewMulti(limiters ...interface {
	Algorithm() *Algorithm
	Rule() Rule
	Store() Store
}) (*Multi, error) {
	if len(limiters) == 0 {
		return nil, errors.New("ratelimit: NewMulti without limiters")
	}
	m := &Multi{}
	for _, l := range limiters {
		if l.Store() != limiters[0].Store() {
			return nil, errors.New("ratelimit: the limiters of a Multi must share one store")
		}
		m.parts = append(m.parts, Part{Limiter: l})
	}
	return m, nil
}

// Allow is AllowN with n = 1.
func (m *Multi) Allow(ctx context.Context, key string) (Decision, error) {
	return m.AllowN(ctx, key, 1)
}

// AllowN admits n events for key under every limiter, or under none.
func (m *Multi) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	parts := make([]Part, len(m.parts))
	for i, p := range m.parts {
		parts[i] = Part{Limiter: p.Limiter, Key: TaggedKey(key, strconv.Itoa(i))}
	}
	return AllowAll(ctx, n, parts...)
}
