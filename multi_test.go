package ratelimit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// onlyApply hides a store's ApplyAll: ApplyAll then takes one by one, with refunds.
type onlyApply struct{ ratelimit.Store }

// ApplyAll returns each request's own Decision, all or none, on a BatchStore and on a
// store without batches alike.
func TestApplyAll(t *testing.T) {
	ctx := context.Background()
	for name, store := range map[string]ratelimit.Store{"batch": localstore.New(), "one by one": onlyApply{localstore.New()}} {
		t.Run(name, func(t *testing.T) {
			alg := tokenbucket.Algorithm()
			reqs := []core.Request{
				{Key: "a", N: 2, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(ratelimit.PerHour(5))}},
				{Key: "b", N: 2, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(ratelimit.PerHour(3))}}}
			ds, err := core.ApplyAll(ctx, store, reqs)
			if err != nil || len(ds) != 2 || !ds[0].Allowed() || !ds[1].Allowed() || ds[0].Remaining != 3 || ds[1].Remaining != 1 {
				t.Fatalf("first = %+v, %v; want both allowed, 3 and 1 left", ds, err)
			}
			ds, err = core.ApplyAll(ctx, store, reqs) // b has 1 left: denied, and a not counted
			if err != nil || !ds[0].Allowed() || ds[1].Allowed() || ds[1].Remaining != 1 {
				t.Fatalf("second = %+v, %v; want a allowed alone, b denied with 1 left", ds, err)
			}
			if d, err := store.Apply(ctx, core.Request{Key: "a", N: 3, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(ratelimit.PerHour(5))}}); err != nil || !d.Allowed() {
				t.Errorf("a after a denied ApplyAll = %+v, %v; want its 3 left", d, err)
			}
			for _, bad := range [][]core.Request{
				{reqs[0], reqs[0]},
				{{Key: "x", N: 1}},
				{{Key: "x", N: 1, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(ratelimit.PerHour(1)), Op: core.OpPeek}}}} {
				if _, err := core.ApplyAll(ctx, store, bad); err == nil {
					t.Errorf("ApplyAll(%+v): no error", bad)
				}
			}
		})
	}
	if _, err := core.ApplyAll(ctx, nil, nil); err == nil {
		t.Error("ApplyAll on a nil store: no error")
	}
}

// TestAllowAllDuplicateKey: two parts of one key are the caller's mistake, said once,
// with the algorithm, the key and the namespace.
func TestAllowAllDuplicateKey(t *testing.T) {
	l, err := tokenbucket.New(localstore.New(), ratelimit.PerSecond(3))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ratelimit.AllowAll(context.Background(), 1, ratelimit.Part{Limiter: l, Key: "k"}, ratelimit.Part{Limiter: l, Key: "k"})
	const want = `ratelimit: a key appears twice in one decision: tokenbucket key "k" of namespace "3/1s"`
	if !errors.Is(err, ratelimit.ErrDuplicateKey) || err.Error() != want {
		t.Errorf("err = %v; want %q", err, want)
	}
}
