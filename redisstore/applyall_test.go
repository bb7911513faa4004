package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// TestApplyAllScriptsBounded: 300 ApplyAll calls, each of 1 to 20 requests of the five
// algorithms in a random mix and order (as an Envoy request's descriptors come), load
// at most one script into Redis per algorithm, where a script per list of algorithms
// once grew Redis by 80 KB a request and was never dropped.
func TestApplyAllScriptsBounded(t *testing.T) {
	client := redistest.Start(t).Client()
	s := redisstore.New(client, freshPrefix())
	ctx := context.Background()
	algs := []*core.Algorithm{tokenbucket.Algorithm(), fixedwindow.Algorithm(), slidingwindow.Algorithm(),
		slidinglog.Algorithm(), leakybucket.Algorithm()}
	random := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		reqs := make([]core.Request, 1+random.IntN(20))
		for j := range reqs {
			reqs[j] = core.Request{Key: fmt.Sprint("{t", i, "}:", j), N: 1, Spec: &core.Spec{Algorithm: algs[random.IntN(len(algs))], Rule: core.Rule(ratelimit.PerMinute(100))}}
		}
		ds, err := s.ApplyAll(ctx, reqs)
		if err != nil || len(ds) != len(reqs) {
			t.Fatalf("ApplyAll %d: %v, %v", i, ds, err)
		}
		for j, d := range ds {
			if !d.Allowed() || d.Remaining != 99 {
				t.Fatalf("ApplyAll %d, request %d (%s): %+v; want allowed, 99 left", i, j, reqs[j].Spec.Algorithm.Name, d)
			}
		}
	}
	info := client.Info(ctx, "memory").Val()
	m := regexp.MustCompile(`number_of_cached_scripts:(\d+)`).FindStringSubmatch(info)
	if m == nil {
		t.Fatalf("INFO memory has no number_of_cached_scripts: %q", info)
	}
	if n, _ := strconv.Atoi(m[1]); n > len(algs) {
		t.Errorf("300 ApplyAll calls of random lists loaded %d scripts; want at most %d, one per algorithm", n, len(algs))
	}
}

// TestApplyAllCapped: ApplyAll of more than MaxApplyAll requests is refused as
// unsupported, counting nothing, and AllowAll then takes them one by one, all or none.
func TestApplyAllCapped(t *testing.T) {
	client := redistest.Start(t).Client()
	s := redisstore.New(client, freshPrefix())
	ctx := context.Background()
	reqs := make([]core.Request, redisstore.MaxApplyAll+1)
	parts := make([]ratelimit.Part, len(reqs))
	limiter, err := fixedwindow.New(s, ratelimit.PerMinute(1))
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		key := fmt.Sprint("{t}:", i)
		reqs[i] = core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: fixedwindow.Algorithm(), Rule: core.Rule(ratelimit.PerMinute(1))}}
		parts[i] = ratelimit.Part{Limiter: limiter, Key: key}
	}
	if ds, err := s.ApplyAll(ctx, reqs); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("ApplyAll of %d: %v, %v; want errors.ErrUnsupported", len(reqs), ds, err)
	}
	if d, err := ratelimit.AllowAll(ctx, 1, parts...); err != nil || !d.Allowed {
		t.Fatalf("AllowAll of %d parts: %+v, %v; want allowed, one by one", len(parts), d, err)
	}
	if d, err := ratelimit.AllowAll(ctx, 1, parts...); err != nil || d.Allowed {
		t.Fatalf("AllowAll of %d parts again: %+v, %v; want denied (each 1 a minute)", len(parts), d, err)
	}
}
