package hotkey_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// seedRule is the target use's rule: 100 a second, bursts of 200.
var seedRule = ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 200}

// switchable is a shared store whose loans can be made to fail, as a Redis that went
// away would fail them.
type switchable struct {
	*localstore.Store
	down atomic.Bool
}

func (s *switchable) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	if s.down.Load() {
		return ratelimit.Outcome{}, ratelimit.ErrUnavailable
	}
	return s.Store.Apply(ctx, req)
}

func (s *switchable) Lend(ctx context.Context, loans []ratelimit.Loan) ([]ratelimit.Lent, error) {
	if s.down.Load() {
		return nil, ratelimit.ErrUnavailable
	}
	return s.Store.Lend(ctx, loans)
}

// instance is one application instance: a limiter on Leases over the shared store.
type instance struct {
	leases   *hotkey.Leases
	limiter  *tokenbucket.Limiter
	admitted int
}

func newInstance(t *testing.T, shared ratelimit.Store, opts ...hotkey.LeasesOption) *instance {
	t.Helper()
	p, err := hotkey.NewLeases(shared, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	l, err := tokenbucket.New(p, seedRule, ratelimit.WithNamespace("api"))
	if err != nil {
		t.Fatal(err)
	}
	return &instance{leases: p, limiter: l}
}

func (in *instance) allow(t *testing.T, key string) {
	t.Helper()
	d, err := in.limiter.Allow(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		in.admitted++
	}
}

// left is what the shared store's key has left now, once the instances gave back what
// they held.
func left(t *testing.T, shared ratelimit.Store, key string) int64 {
	t.Helper()
	peek := &ratelimit.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "api", Rule: seedRule, Op: "peek"}
	o, err := shared.Apply(context.Background(), ratelimit.Request{Key: key, N: 1, Spec: peek})
	if err != nil {
		t.Fatal(err)
	}
	if !o.Allowed() {
		return 0
	}
	return o.Remaining + 1
}

// drive sends each instance its share of perSecond requests a second on key for d, at
// even intervals, and returns when d has passed.
func drive(t *testing.T, key string, perSecond int, d time.Duration, ins []*instance, shares []int) {
	t.Helper()
	tick := time.Second / time.Duration(perSecond)
	total := 0
	for _, s := range shares {
		total += s
	}
	for i := range int(d / tick) {
		at := i % total // instance j takes shares[j] of every total ticks
		for j, s := range shares {
			if at < s {
				ins[j].allow(t, key)
				break
			}
			at -= s
		}
		time.Sleep(tick)
	}
}

// TestLeasesConserve: one key asked 10 times its rule for 3s: after the first refill
// interval, the requests are decided from the lease, with a refill for more than 20 of
// them; and the instance never admits an event the key did not have: what it admitted
// and what the key has left once the lease is given back are the bucket and its refill.
func TestLeasesConserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		in := newInstance(t, shared)
		start := time.Now()
		drive(t, "tenant", 1000, 3*time.Second, []*instance{in}, []int{1})
		elapsed := time.Since(start)
		if err := in.leases.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		st := in.leases.Stats()
		t.Logf("%+v, admitted %d", st, in.admitted)
		if st.Local < 2500 || st.Refills*20 > st.Local {
			t.Errorf("%+v: want most of 3000 decisions from the lease, a refill for 20 at least", st)
		}
		want := 200 + int64(elapsed.Seconds()*100)
		if got := int64(in.admitted) + left(t, shared, "tenant"); got < want-1 || got > want {
			t.Errorf("admitted %d + left %d = %d; want the bucket and %v of refill, %d", in.admitted, got-int64(in.admitted), got, elapsed, want)
		}
	})
}

// TestLeasesShared: four instances sharing one key unevenly (50/25/15/10%), at 4 times
// its rule for 10s: together they admit what the bucket gives, exactly, each instance
// some of it.
func TestLeasesShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		ins := make([]*instance, 4)
		for i := range ins {
			ins[i] = newInstance(t, shared, hotkey.WithInstanceCount(func() int { return 4 }))
		}
		start := time.Now()
		drive(t, "tenant", 400, 10*time.Second, ins, []int{10, 5, 3, 2})
		elapsed := time.Since(start)
		admitted := int64(0)
		for i, in := range ins {
			if err := in.leases.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Logf("instance %d: %+v, admitted %d", i, in.leases.Stats(), in.admitted)
			if in.admitted < 20 {
				t.Errorf("instance %d admitted %d of its %d%%: starved", i, in.admitted, []int{50, 25, 15, 10}[i])
			}
			admitted += int64(in.admitted)
		}
		want := 200 + int64(elapsed.Seconds()*100)
		if got := admitted + left(t, shared, "tenant"); got < want-1 || got > want {
			t.Errorf("admitted %d + left %d = %d; want %d", admitted, got-admitted, got, want)
		}
	})
}

// TestLeasesFollowTraffic: a key's traffic moves from one instance to another: the new
// one reaches the rule's rate within a few refill intervals, and the old one gives back
// what it held.
func TestLeasesFollowTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		a, b := newInstance(t, shared), newInstance(t, shared)
		drive(t, "tenant", 300, 5*time.Second, []*instance{a, b}, []int{1, 0})
		drive(t, "tenant", 300, time.Second, []*instance{a, b}, []int{0, 1}) // a second to move
		before := b.admitted
		drive(t, "tenant", 300, 4*time.Second, []*instance{a, b}, []int{0, 1})
		if got := b.admitted - before; got < 380 {
			t.Errorf("the new instance admitted %d in 4s; want the rule's 400, within 5%%", got)
		}
		if st := a.leases.Stats(); st.Leases != 0 {
			t.Errorf("the old instance still leases %d keys: %+v", st.Leases, st)
		}
	})
}

// TestLeasesOutliveTheirHolder: an instance dies holding a lease; once its loan's TTL has
// passed, the other instance admits the whole rule again.
func TestLeasesOutliveTheirHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		dying := &switchable{Store: shared}
		a, b := newInstance(t, dying), newInstance(t, shared)
		drive(t, "tenant", 300, 3*time.Second, []*instance{a, b}, []int{1, 1})
		dying.down.Store(true) // a can no longer reach the store: it neither refills nor gives back
		drive(t, "tenant", 300, 3*time.Second, []*instance{a, b}, []int{0, 1})
		before := b.admitted
		drive(t, "tenant", 300, 4*time.Second, []*instance{a, b}, []int{0, 1})
		if got := b.admitted - before; got < 388 {
			t.Errorf("the live instance admitted %d in 4s after the dead one's TTL; want 97%% of the rule's 400", got)
		}
	})
}

// TestLeasesRevoke: a reset through one instance ends the other's lease at its next
// refill, within one refill interval.
func TestLeasesRevoke(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		a, b := newInstance(t, shared), newInstance(t, shared)
		drive(t, "tenant", 300, 2*time.Second, []*instance{a, b}, []int{1, 1})
		if err := b.limiter.Reset(context.Background(), "tenant"); err != nil {
			t.Fatal(err)
		}
		drive(t, "tenant", 300, 250*time.Millisecond, []*instance{a, b}, []int{1, 0})
		if st := a.leases.Stats(); st.Revoked != 1 {
			t.Errorf("%+v: want the lease revoked once", st)
		}
	})
}

// TestLeasesQuietKeysExact: keys that ask less than an event per refill interval and
// round trip (here one in 4 seconds, against 1s) take the exact path, and are never
// leased.
func TestLeasesQuietKeysExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := newInstance(t, localstore.New())
		for range 30 {
			for k := range 100 {
				in.allow(t, "tenant-"+string(rune('a'+k%26))+string(rune('a'+k/26)))
			}
			time.Sleep(4 * time.Second)
		}
		if st := in.leases.Stats(); st.Leases != 0 || st.Local != 0 || st.Exact != 3000 {
			t.Errorf("%+v: want every decision exact, no key leased", st)
		}
	})
}

// TestLeasesThroughAnOutage: under the fallback store, a lease keeps serving while Redis
// is away, until what it holds is spent or it ends; then the fallback's shares decide.
// No request gets an error.
func TestLeasesThroughAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		primary := &switchable{Store: localstore.New()}
		store := fallback.New(primary, localstore.New(), fallback.WithInstances(2))
		in := newInstance(t, store)
		drive(t, "tenant", 80, 3*time.Second, []*instance{in}, []int{1}) // under the rule
		primary.down.Store(true)
		before := in.leases.Stats()
		drive(t, "tenant", 80, 500*time.Millisecond, []*instance{in}, []int{1})
		if got := in.leases.Stats().Local - before.Local; got != 40 {
			t.Errorf("%d of the 40 decisions of the first half second without Redis from the lease; want all", got)
		}
		drive(t, "tenant", 80, 3*time.Second, []*instance{in}, []int{1})
		admitted := in.admitted
		drive(t, "tenant", 300, 2*time.Second, []*instance{in}, []int{1})
		if got := in.admitted - admitted; got > 200 {
			t.Errorf("admitted %d in 2s once the lease ended, asked 300 a second; want at most the share's burst of 100 and 50 a second, 200", got)
		}
	})
}

// TestNewLeasesNeedsALender: Leases needs a store that lends.
func TestNewLeasesNeedsALender(t *testing.T) {
	if _, err := hotkey.NewLeases(struct{ ratelimit.Store }{localstore.New()}); err == nil {
		t.Error("NewLeases over a store that does not lend: no error")
	}
}

// TestLeasesAllOrNone: several limits at once go to the next store, all or none: a
// request the second limit denies takes nothing from the first.
func TestLeasesAllOrNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		p, err := hotkey.NewLeases(shared)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		rate, _ := tokenbucket.New(p, seedRule, ratelimit.WithNamespace("api"))
		tight, _ := tokenbucket.New(p, ratelimit.PerHour(1), ratelimit.WithNamespace("tight"))
		ctx := context.Background()
		for i, want := range []bool{true, false, false} {
			d, err := ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: rate, Key: "k"}, ratelimit.Part{Limiter: tight, Key: "k"})
			if err != nil || d.Allowed != want {
				t.Fatalf("request %d: %+v, %v; want allowed %v", i, d, err, want)
			}
		}
		if got := left(t, shared, "k"); got != 199 {
			t.Errorf("the rate's key has %d left; want 199, taken once", got)
		}
	})
}
