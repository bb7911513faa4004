package fleet_test

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/fleet"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

func client(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(redisstore.Recommended(&redis.Options{Addr: addr}))
	t.Cleanup(func() { c.Close() })
	return c
}

// TestInstancesRequired: a fleet without its instance count is an error, not a count of 1.
func TestInstancesRequired(t *testing.T) {
	for _, cfg := range []fleet.Config{{}, {Learn: true}, {Instances: -3}, {Instances: 2, Redis: []redisstore.Option{nil}},
		{Instances: 2, Learn: true, Fallback: []fallback.Option{nil}}, {Instances: 2, Leases: []hotkey.LeasesOption{nil}}} {
		if f, err := fleet.New(context.Background(), client(t, "127.0.0.1:1"), cfg); err == nil {
			f.Close(context.Background())
			t.Errorf("New(%+v): no error", cfg)
		}
	}
	if _, err := fleet.New(context.Background(), nil, fleet.Config{Instances: 2}); err == nil {
		t.Error("New with a nil client: no error")
	}
	var none *fleet.Fleet
	if err := none.Close(context.Background()); err != nil {
		t.Errorf("Close of a nil Fleet: %v", err)
	}
}

// TestLearnsTheCount: four instances that learn their count reach 4 within two beats;
// one that closes leaves it at once for the others' next beat; an instance whose Redis
// does not answer counts what it was told to assume.
func TestLearnsTheCount(t *testing.T) {
	srv := redistest.Start(t)
	var fs []*fleet.Fleet
	for range 4 {
		f, err := fleet.New(context.Background(), client(t, srv.Addr), fleet.Config{Instances: 2, Learn: true, Group: "gw", Exact: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close(context.Background()) })
		fs = append(fs, f)
	}
	if got := fs[3].Count(); got != 4 {
		t.Errorf("the fourth to start counts %d; want 4", got)
	}
	waitCount(t, fs, 4)
	if err := fs[3].Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitCount(t, fs[:3], 3)

	away, err := fleet.New(context.Background(), client(t, "127.0.0.1:1"), fleet.Config{Instances: 7, Learn: true})
	if err != nil {
		t.Fatal(err)
	}
	defer away.Close(context.Background())
	if got := away.Count(); got != 7 {
		t.Errorf("an instance that cannot reach Redis counts %d; want the 7 assumed", got)
	}
}

// waitCount polls until every instance of fs counts n, for up to three beats.
func waitCount(t *testing.T, fs []*fleet.Fleet, n int) {
	t.Helper()
	deadline := time.Now().Add(7 * time.Second)
	for {
		ok := true
		for _, f := range fs {
			ok = ok && f.Count() == n
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			for i, f := range fs {
				t.Errorf("instance %d counts %d; want %d", i, f.Count(), n)
			}
			return
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// TestFleetKeepsTheRule: four instances in tight loops on one key of 100 an hour admit
// at most the rule and an event each on trust, beside what their shares decided while
// Redis was late. After they close, Redis counts what they admitted: nothing created,
// nothing lost.
func TestFleetKeepsTheRule(t *testing.T) {
	srv := redistest.Start(t)
	rule := ratelimit.Rule{Limit: 100, Period: time.Hour, Burst: 100}
	var admitted, shares atomic.Int64 // shares: decisions of the fallback's shares, Redis late
	hooks := fallback.WithHooks(fallback.Hooks{OnDecision: func(s fallback.Source, _ time.Duration) {
		if s == fallback.Secondary {
			shares.Add(1)
		}
	}})
	var wg sync.WaitGroup
	var fs []*fleet.Fleet
	for range 4 {
		f, err := fleet.New(context.Background(), client(t, srv.Addr), fleet.Config{Instances: 4, Fallback: []fallback.Option{hooks}})
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
		l, err := tokenbucket.New(f.Store(), rule)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for range 400 {
				d, err := l.Allow(context.Background(), "k")
				if err == nil && d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	for _, f := range fs {
		if err := f.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}
	// A share may admit what Redis, late, would have denied: the fallback's bound, not
	// the leases'. A loaded machine makes Redis late now and then.
	got, over := admitted.Load(), shares.Load()
	if got > 104+over || got < 96 {
		t.Errorf("admitted %d of a rule of 100; want 96 to %d (an event on trust per instance, and %d decided on the shares)", got, 104+over, over)
	}
	l, err := tokenbucket.New(redisstore.New(srv.Client()), rule)
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.PeekN(context.Background(), "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	// What Redis counted: 100 less what it holds, a debt counting beyond 100. The refill
	// since the first take is a fraction of a token (one every 36s).
	counted := 99 - d.Remaining
	if !d.Allowed {
		counted = 99 + int64(math.Round(float64(d.RetryAfter)/float64(time.Hour/100)))
	}
	// Each admission is counted once. A share's decision whose call Redis may or may not
	// have counted is counted on the share alone (see fallback's late answers).
	if counted > got || counted < got-over {
		t.Errorf("after Close, Redis counts %d (%+v); want the %d admitted, less at most the %d decided on the shares", counted, d, got, over)
	}
}
