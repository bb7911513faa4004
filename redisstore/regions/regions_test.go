package regions_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/regions"
)

// region is one region of a test: its Redis, its Regions and its limiter.
type region struct {
	srv     *redistest.Server
	regions *regions.Regions
	limiter *fixedwindow.Limiter
}

// twoRegions starts two real Redis servers, "eu" (the leader) and "us", on one fake
// clock, each with a fixed window of rule split between them, intervals of a minute.
func twoRegions(t *testing.T, rule ratelimit.Rule) (eu, us *region, clk *clock.Fake) {
	t.Helper()
	clk = clock.NewFake(limitertest.Start) // midnight: an interval and a window begin
	srvs := map[string]*redistest.Server{"eu": redistest.Start(t), "us": redistest.Start(t)}
	clients := map[string]redis.Scripter{}
	for name, srv := range srvs {
		clients[name] = srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	}
	prefix := "regions" + strconv.FormatInt(time.Now().UnixNano(), 10)
	make := func(name string) *region {
		r, err := regions.New(name, clients, regions.WithClock(clk),
			regions.WithInterval(time.Minute), regions.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		store := r.Store(redisstore.New(clients[name], redisstore.WithClock(clk), redisstore.WithPrefix(prefix)))
		l, err := fixedwindow.New(store, rule, ratelimit.WithNamespace("api"))
		if err != nil {
			t.Fatal(err)
		}
		return &region{srv: srvs[name], regions: r, limiter: l}
	}
	return make("eu"), make("us"), clk
}

// take asks n times for key, and returns how many were admitted.
func (r *region) take(t *testing.T, key string, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		d, err := r.limiter.Allow(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}

// syncRegions flushes and reads both regions' weights, as Run does every second.
func syncRegions(t *testing.T, rs ...*region) {
	t.Helper()
	for _, r := range rs {
		if err := r.regions.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := r.regions.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Traffic 70/30 moves the weights from 50/50 to 70/30 in two intervals (one step of 100
// thousandths each), and no further; only the leader rebalances, once per interval.
func TestRegionsFollowTraffic(t *testing.T) {
	eu, us, clk := twoRegions(t, ratelimit.PerMinute(100_000))
	want := [][2]int64{{600, 400}, {700, 300}, {700, 300}}
	for i, w := range want {
		eu.take(t, "tenant", 700)
		us.take(t, "tenant", 300)
		syncRegions(t, eu, us)
		clk.Set(limitertest.Start.Add(time.Duration(i+1)*time.Minute + 2*time.Second))
		syncRegions(t, eu, us) // both report the new interval, as Run does every second
		if moved, err := us.regions.Rebalance(context.Background()); err != nil || moved != nil {
			t.Fatalf("interval %d: the follower rebalanced: %v, %v", i+1, moved, err)
		}
		moved, err := eu.regions.Rebalance(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := moved["api"]; got["eu"] != w[0] || got["us"] != w[1] {
			t.Fatalf("interval %d: moved to %v; want eu %d, us %d", i+1, got, w[0], w[1])
		}
		if again, err := eu.regions.Rebalance(context.Background()); err != nil || again != nil {
			t.Fatalf("interval %d: rebalanced twice: %v, %v", i+1, again, err)
		}
		prev := eu.regions.Weight("api")
		syncRegions(t, eu, us)
		if e, u := eu.regions.Weight("api"), us.regions.Weight("api"); e != prev || u != w[1] {
			t.Fatalf("interval %d, within the grace: eu %d, us %d; want eu still %d, us lowered to %d at once", i+1, e, u, prev, w[1])
		}
		clk.Advance(3 * time.Second) // the raised weight's grace
		if e, u := eu.regions.Weight("api"), us.regions.Weight("api"); e != w[0] || u != w[1] {
			t.Fatalf("interval %d: weights in force eu %d, us %d; want %v", i+1, e, u, w)
		}
		clk.Set(limitertest.Start.Add(time.Duration(i+1)*time.Minute + 10*time.Second))
	}
}

// In every window the regions together admit at most the rule, and at most the rule plus
// a step of it in a window where the weights move. Here each region spends its share at
// the start of each window, the worst case: the lowered region has spent its old share
// before its weight goes down, the raised one spends its new one after.
func TestRegionsBound(t *testing.T) {
	const limit = 1000
	eu, us, clk := twoRegions(t, ratelimit.PerMinute(limit))
	wantTotal := []int{1000, 1100, 1100, 1050, 1000} // weights 50/50, 60/40, 70/30, 75/25, 75/25
	for minute, want := range wantTotal {
		start := limitertest.Start.Add(time.Duration(minute) * time.Minute)
		clk.Set(start)
		admitted := eu.take(t, "tenant", 3*limit) + us.take(t, "tenant", limit) // demand 75/25
		syncRegions(t, eu, us)
		before := eu.regions.Weight("api") + us.regions.Weight("api")*1000
		clk.Set(start.Add(2 * time.Second))
		if _, err := eu.regions.Rebalance(context.Background()); err != nil {
			t.Fatal(err)
		}
		syncRegions(t, eu, us)
		clk.Set(start.Add(5 * time.Second)) // past the grace: the raised weight is in force
		admitted += eu.take(t, "tenant", 3*limit) + us.take(t, "tenant", limit)
		moved := eu.regions.Weight("api")+us.regions.Weight("api")*1000 != before
		bound := limit
		if moved {
			bound += limit / 10
		}
		if admitted > bound || admitted != want {
			t.Fatalf("minute %d: the regions admitted %d (want %d); the bound is %d", minute, admitted, want, bound)
		}
		if sum := eu.regions.Weight("api") + us.regions.Weight("api"); sum > 1000 {
			t.Fatalf("minute %d: weights in force add up to %d", minute, sum)
		}
	}
	if e, u := eu.regions.Weight("api"), us.regions.Weight("api"); e != 750 || u != 250 {
		t.Errorf("weights after 75/25 traffic: eu %d, us %d; want 750, 250", e, u)
	}
}

// A region cut off keeps its weights: the leader moves nothing when it cannot read
// every region, and a region that cannot read its own Redis keeps what it read.
func TestRegionCutOff(t *testing.T) {
	eu, us, clk := twoRegions(t, ratelimit.PerMinute(100_000))
	eu.take(t, "tenant", 900)
	us.take(t, "tenant", 100)
	syncRegions(t, eu, us)
	clk.Set(limitertest.Start.Add(time.Minute + 2*time.Second))
	syncRegions(t, eu, us)
	if _, err := eu.regions.Rebalance(context.Background()); err != nil {
		t.Fatal(err)
	}
	syncRegions(t, eu, us)
	clk.Advance(3 * time.Second)
	if e, u := eu.regions.Weight("api"), us.regions.Weight("api"); e != 600 || u != 400 {
		t.Fatalf("weights eu %d, us %d; want 600, 400", e, u)
	}
	us.srv.Kill()
	eu.take(t, "tenant", 900)
	if err := eu.regions.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Set(limitertest.Start.Add(2*time.Minute + 2*time.Second))
	if moved, err := eu.regions.Rebalance(context.Background()); err == nil {
		t.Fatalf("rebalanced without the other region: %v", moved)
	}
	if err := us.regions.Refresh(context.Background()); err == nil {
		t.Fatal("the cut-off region read its weights")
	}
	syncRegions(t, eu)
	if e, u := eu.regions.Weight("api"), us.regions.Weight("api"); e != 600 || u != 400 {
		t.Errorf("after the cut: weights eu %d, us %d; want 600, 400 kept", e, u)
	}
}

// Bad regions are refused at New, and a rule too small for a region's weight is
// an error that says so, consuming nothing.
func TestRegionsBadInput(t *testing.T) {
	c := redistest.Start(t).Client()
	for name, clients := range map[string]map[string]redis.Scripter{
		"one region":   {"eu": c},
		"self missing": {"us": c, "ap": c},
		"nil client":   {"eu": c, "us": (*redis.Client)(nil)},
	} {
		if _, err := regions.New("eu", clients); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	r, err := regions.New("eu", map[string]redis.Scripter{"eu": c, "us": c})
	if err != nil {
		t.Fatal(err)
	}
	l, err := fixedwindow.New(r.Store(redisstore.New(c, redisstore.WithPrefix(freshPrefix()))), ratelimit.PerSecond(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "k"); !errors.Is(err, ratelimit.ErrInvalidRule) {
		t.Errorf("1 a second split in two: %v; want ErrInvalidRule", err)
	}
}

// Several limits at once through a region: all or none, each under the region's share.
func TestRegionsApplyAll(t *testing.T) {
	c := redistest.Start(t).Client()
	r, err := regions.New("eu", map[string]redis.Scripter{"eu": c, "us": c})
	if err != nil {
		t.Fatal(err)
	}
	store := r.Store(redisstore.New(c, redisstore.WithPrefix(freshPrefix())))
	alg := fixedwindow.Algorithm()
	reqs := []core.Request{
		{Key: "k", N: 5, Spec: &core.Spec{Algorithm: alg, Namespace: "a", Rule: core.Rule(ratelimit.PerHour(10))}},
		{Key: "k", N: 5, Spec: &core.Spec{Algorithm: alg, Namespace: "b", Rule: core.Rule(ratelimit.PerHour(100))}}}
	ds, err := core.ApplyAll(context.Background(), store, reqs)
	if err != nil || !ds[0].Allowed() || ds[0].Limit() != 5 || ds[0].Remaining != 0 || ds[1].Limit() != 50 || ds[1].Remaining != 45 {
		t.Fatalf("first = %+v, %v; want both allowed under half of each rule", ds, err)
	}
	ds, err = core.ApplyAll(context.Background(), store, reqs)
	if err != nil || ds[0].Allowed() || !ds[1].Allowed() {
		t.Fatalf("second = %+v, %v; want a denied, b allowed alone", ds, err)
	}
	ds, err = core.ApplyAll(context.Background(), store, reqs[1:])
	if err != nil || !ds[0].Allowed() || ds[0].Remaining != 40 {
		t.Fatalf("b alone = %+v, %v; want allowed with 40 left (the denied batch took nothing)", ds, err)
	}
}

// A region cut off from its own Redis across an interval's end keeps its demand, and
// adds it to the interval it was made in when it reconnects; until it has reported since
// that interval ended, the leader moves no weight, then moves them toward the traffic
// as it was, not away from it (it read us's last interval as empty, once).
func TestRegionReconnects(t *testing.T) {
	eu, us, clk := twoRegions(t, ratelimit.PerMinute(100_000))
	syncRegions(t, eu, us)
	us.srv.Pause() // us's gateways cannot reach their Redis; the leader cannot either
	eu.take(t, "tenant", 300)
	for range 7 { // 700 takes on us's store while its Redis is away: each fails, and counts as demand
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		if _, err := us.limiter.AllowN(ctx, "tenant", 100); err == nil {
			t.Fatal("a decision on a paused Redis succeeded")
		}
		cancel()
	}
	if err := eu.regions.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	if err := us.regions.Flush(ctx); err == nil {
		t.Fatal("us flushed with its Redis paused")
	}
	cancel()
	us.srv.Resume()
	clk.Set(limitertest.Start.Add(time.Minute + 2*time.Second)) // the next interval
	if err := eu.regions.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if moved, err := eu.regions.Rebalance(context.Background()); err != nil || moved != nil {
		t.Fatalf("rebalanced before us reported the interval: %v, %v", moved, err)
	}
	if err := us.regions.Flush(context.Background()); err != nil { // back: the minute before's 700
		t.Fatal(err)
	}
	moved, err := eu.regions.Rebalance(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := moved["api"]; got["eu"] != 400 || got["us"] != 600 {
		t.Errorf("after us reconnected: moved to %v; want eu 400, us 600 (toward 30/70)", got)
	}
}

var prefixes atomic.Int64

// freshPrefix is a key prefix no other test uses.
func freshPrefix() string { return "regions-test" + strconv.FormatInt(prefixes.Add(1), 10) }

// TestRunReportsErrors: Run hands the errors of its rounds to WithOnError's function and
// goes on, and returns its context's error when it ends.
func TestRunReportsErrors(t *testing.T) {
	eu, us := redistest.Start(t), redistest.Start(t)
	clients := map[string]redis.Scripter{
		"eu": eu.Client(func(o *redis.Options) { o.MaxRetries = -1 }),
		"us": us.Client(func(o *redis.Options) { o.MaxRetries = -1; o.DialerRetries = 1 }),
	}
	eu.Kill() // this region's own Redis: every round's reads and flushes fail
	errs := make(chan error, 100)
	r, err := regions.New("eu", clients, regions.WithPrefix(freshPrefix()), regions.WithOnError(func(err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if err := <-errs; err == nil {
		t.Error("a nil error reported")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v; want its context's error", err)
	}
}
