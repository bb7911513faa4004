package hotkey_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
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

func (s *switchable) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if s.down.Load() {
		return core.Outcome{}, ratelimit.ErrUnavailable
	}
	return s.Store.Apply(ctx, req)
}

func (s *switchable) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
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
	peek := &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "api", Rule: core.Rule(seedRule), Op: core.OpPeek}
	o, err := shared.Apply(context.Background(), core.Request{Key: key, N: 1, Spec: peek})
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

// ends records what each holder's last loan says (Loan.End), and can fail the refills
// of one holder's lease.
type ends struct {
	*localstore.Store
	fail atomic.Bool // refills (loans that want) fail, after they land
	mu   sync.Mutex
	last map[int64]core.Loan // each holder's latest loan
}

func (s *ends) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	got, err := s.Store.Lend(ctx, loans)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range loans {
		if l.Holder != 0 {
			s.last[l.Holder] = l
		}
	}
	if s.fail.Load() && loans[0].Want > 0 {
		return nil, ratelimit.ErrUnavailable
	}
	return got, err
}

// TestLeasesLastLoanEnds: a lease given back at Close ends its record (Loan.End), so that
// the key's other holders no longer count it; but not after a loan of it went
// unanswered, which may still land and must find the record. Either way the key gets
// back all it did not admit.
func TestLeasesLastLoanEnds(t *testing.T) {
	for _, lose := range []bool{false, true} {
		t.Run(fmt.Sprint("lost answer ", lose), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				shared := &ends{Store: localstore.New(), last: map[int64]core.Loan{}}
				in := newInstance(t, shared)
				start := time.Now()
				drive(t, "tenant", 1000, time.Second, []*instance{in}, []int{1})
				if lose {
					shared.fail.Store(true)
					drive(t, "tenant", 1000, 500*time.Millisecond, []*instance{in}, []int{1})
					shared.fail.Store(false)
				}
				elapsed := time.Since(start)
				if err := in.leases.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				if len(shared.last) != 1 {
					t.Fatalf("holders %v; want one", shared.last)
				}
				for h, l := range shared.last {
					if l.End == lose || l.Want != 0 {
						t.Errorf("holder %d's last loan %+v: want End %v, nothing wanted", h, l, !lose)
					}
				}
				want := 200 + int64(elapsed.Seconds()*100)
				if got := int64(in.admitted) + left(t, shared, "tenant"); got < want-1 || got > want {
					t.Errorf("admitted %d + left %d = %d; want the bucket and %v of refill, %d", in.admitted, got-int64(in.admitted), got, elapsed, want)
				}
			})
		})
	}
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

// TestLeasesQuietKeysOnTrust: keys that ask less than an event per refill interval and
// round trip (here one in 4 seconds, against 1s) are decided on trust, and never leased.
func TestLeasesQuietKeysOnTrust(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := newInstance(t, localstore.New())
		for range 30 {
			for k := range 100 {
				in.allow(t, "tenant-"+string(rune('a'+k%26))+string(rune('a'+k/26)))
			}
			time.Sleep(4 * time.Second)
		}
		if st := in.leases.Stats(); st.Leases != 0 || st.Local != 3000 || st.Trusted != 3000 || st.Exact != 0 {
			t.Errorf("%+v: want every decision on trust, no key leased", st)
		}
	})
}

// TestLeasesStatsCountDecisions: Stats counts decisions, one a take whatever its n: takes
// from a lease settled later at nothing (refunds to the lease) leave Local as they found
// it, never below, and debits, peeks and refunds are no decisions of the exact path
// (Exact counted a debit's size before).
func TestLeasesStatsCountDecisions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := newInstance(t, localstore.New())
		drive(t, "tenant", 80, 3*time.Second, []*instance{in}, []int{1}) // leased by now
		ctx := context.Background()
		before := in.leases.Stats()
		var charges []*ratelimit.Charge
		for range 10 {
			c, d, err := in.limiter.Charge(ctx, "tenant", 2)
			if err != nil || !d.Allowed {
				t.Fatalf("Charge(2): %+v, %v", d, err)
			}
			charges = append(charges, c)
		}
		for _, c := range charges {
			if _, err := c.Settle(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := in.limiter.Debit(ctx, "tenant", 50); err != nil {
			t.Fatal(err)
		}
		if _, err := in.limiter.PeekN(ctx, "tenant", 1); err != nil {
			t.Fatal(err)
		}
		st := in.leases.Stats()
		if st.Local-before.Local != 10 || st.Exact != before.Exact {
			t.Errorf("10 takes of 2 from the lease, refunded, a debit of 50 and a peek: Local %+d, Exact %+d; want +10 and +0",
				st.Local-before.Local, st.Exact-before.Exact)
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
		held := in.leases.Held("tenant")
		primary.down.Store(true)
		before := in.leases.Stats()
		drive(t, "tenant", 80, 500*time.Millisecond, []*instance{in}, []int{1})
		if got := in.leases.Stats().Local - before.Local; got < min(40, held) {
			t.Errorf("%d of the 40 decisions of the first half second without Redis from the lease, which held %d; want all it held", got, held)
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

// TestLeasesForRequests: only the requests ForRequests selects are leased; the others
// take the exact path, however busy.
func TestLeasesForRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := newInstance(t, localstore.New(), hotkey.ForRequests(func(_, key string) bool {
			return strings.HasPrefix(key, "hot:")
		}))
		for range 2000 {
			in.allow(t, "hot:a")
			in.allow(t, "cold:b")
			time.Sleep(time.Millisecond)
		}
		if st := in.leases.Stats(); st.Leases != 1 || st.Exact < 2000 || st.Local < 1500 {
			t.Errorf("%+v: want the hot key leased, every request of the cold one exact", st)
		}
	})
}

// TestLeasesOnRedis: four instances drive one hot key on a real Redis: it runs a script
// for fewer than one decision in 20, and once every instance has given back what it
// holds, what they admitted and what the key has left are its capacity, and no more than
// it refilled meanwhile.
func TestLeasesOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	rule := ratelimit.PerHour(50_000)
	const instances, workers, perWorker = 4, 8, 500
	start := time.Now()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var all []*hotkey.Leases
	for range instances {
		p, err := hotkey.NewLeases(redisstore.New(srv.Client(), redisstore.WithPrefix("hot")), hotkey.WithRefill(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, p)
		l, _ := tokenbucket.New(p, rule, ratelimit.WithNamespace("api"))
		for range workers {
			wg.Go(func() {
				for range perWorker {
					d, err := l.Allow(context.Background(), "tenant-big")
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
					time.Sleep(100 * time.Microsecond) // a request's own work, so that the run lasts a few refills
				}
			})
		}
	}
	wg.Wait()
	for _, p := range all {
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	calls := redistest.ScriptCalls(t, srv.Client())
	decisions := int64(instances * workers * perWorker)
	t.Logf("%d decisions in %v, %d admitted, %d scripts on Redis", decisions, elapsed, admitted.Load(), calls)
	if int64(calls)*20 > decisions {
		t.Errorf("Redis ran %d scripts for %d decisions; want fewer than 1 in 20", calls, decisions)
	}
	peek := &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "api", Rule: core.Rule(rule), Op: core.OpPeek}
	o, err := redisstore.New(srv.Client(), redisstore.WithPrefix("hot")).Apply(context.Background(), core.Request{Key: "tenant-big", N: 1, Spec: peek})
	if err != nil {
		t.Fatal(err)
	}
	refilled := int64(elapsed.Seconds()*50_000/3600) + 1
	if got := admitted.Load() + o.Remaining + 1; got < rule.Limit || got > rule.Limit+refilled {
		t.Errorf("admitted %d + left %d = %d; want the capacity, 50000, and at most %d refilled", admitted.Load(), o.Remaining+1, got, refilled)
	}
}

// stalled lends only once release is closed: a Redis that takes its time.
type stalled struct {
	*localstore.Store
	lends   atomic.Int64
	release chan struct{}
}

func (s *stalled) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	if loans[0].Holder != 0 && s.lends.Add(1) > 1 { // the refills of leases, not the charges on trust
		<-s.release
	}
	return s.Store.Lend(ctx, loans)
}

// TestLeasesNeverWait: while a refill is in flight, a key's requests spend what its
// lease holds without waiting. Another key's, whose first loan is queued behind the
// stalled refill, wait for it until 100ms after it was asked for, in all, then are
// decided on trust or on the next store.
func TestLeasesNeverWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		next := &stalled{Store: localstore.New(), release: make(chan struct{})}
		defer close(next.release)
		in := newInstance(t, next)
		for range 80 { // 100 a second: a lease of about a second's, and a top-up stalled
			in.allow(t, "busy")
			time.Sleep(10 * time.Millisecond)
		}
		if next.lends.Load() < 2 {
			t.Fatalf("%d refills; want the second one stalled", next.lends.Load())
		}
		before := in.leases.Stats()
		start := time.Now()
		for range 10 {
			in.allow(t, "busy")
		}
		if took := time.Since(start); took != 0 {
			t.Errorf("10 decisions from the lease took %v of the bubble's time; want none", took)
		}
		if st := in.leases.Stats(); st.Local-before.Local != 5 || st.Exact-before.Exact != 5 {
			t.Errorf("%+v, before %+v: want 5 of the busy key's requests from its lease, 5 on the next store", st, before)
		}
		before, start = in.leases.Stats(), time.Now()
		for range 10 {
			in.allow(t, "other")
		}
		if took := time.Since(start); took != 100*time.Millisecond {
			t.Errorf("10 decisions of a key whose first loan is stalled took %v of the bubble's time; want 100ms", took)
		}
		if st := in.leases.Stats(); st.Exact-before.Exact != 5 || st.Trusted-before.Trusted != 5 {
			t.Errorf("%+v, before %+v: want 5 of the other key's requests on trust (each charged before the next), 5 on the next store", st, before)
		}
	})
}

// slow is a next store 2ms away: every call takes 2ms of the bubble's time. It counts
// its takes and lends.
type slow struct {
	*localstore.Store
	applies, lends atomic.Int64
}

func (s *slow) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if req.Spec != nil && req.Spec.Op == core.OpTake {
		s.applies.Add(1)
	}
	time.Sleep(2 * time.Millisecond)
	return s.Store.Apply(ctx, req)
}

func (s *slow) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	s.lends.Add(1)
	time.Sleep(2 * time.Millisecond)
	return s.Store.Lend(ctx, loans)
}

// TestLeasesHotStart: a key of the seed's rule turns hot at once, asked 20,000 times a
// second over four instances a round trip of 1ms away, each request at its instant. In
// the first 300ms they admit what the exact path would, within 4%: the burst and the
// rate over that time (230), and never more than 4 beyond it (an event on trust each);
// with one call to the next store for 40 decisions at most. Before, the refills of a key
// at its rule came 250ms apart, and the four admitted its burst alone (200).
func TestLeasesHotStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		ls := make([]*tokenbucket.Limiter, 4)
		for i := range ls {
			ls[i], _ = tokenbucket.New(newLeases(t, shared, 4), seedRule)
		}
		const asks, over = 6000, 300 * time.Millisecond
		start := time.Now()
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := range asks {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * over / asks)
				if d, err := ls[i%4].Allow(context.Background(), "hot"); err == nil && d.Allowed {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		calls := shared.calls.Load()
		bound := seedRule.Burst + int64(float64(seedRule.Limit)*time.Since(start).Seconds())
		if got := admitted.Load(); got < bound*96/100 || got > bound+4 {
			t.Errorf("admitted %d of a key turning hot in %v; want the burst and the rate over it, %d, within 4%%", got, time.Since(start), bound)
		}
		if calls*40 > asks {
			t.Errorf("%d calls to the next store for %d decisions; want one for 40 at most", calls, asks)
		}
	})
}

// TestLeasesTurningBusy: a key asked 50 times at once, by callers arriving together,
// sends the next store one loan and a few takes, not a call per request until the loan
// lands; all 50 are admitted (the key holds 1,000). Before, 49 of the 50 called the next
// store: a spammer's first moments flooded Redis past the fallback's timeout, and its
// shares admitted a burst more.
func TestLeasesTurningBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		next := &slow{Store: localstore.New()}
		p, err := hotkey.NewLeases(next)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		l, _ := tokenbucket.New(p, ratelimit.Rule{Limit: 1000, Period: time.Second, Burst: 1000})
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 10 * time.Microsecond) // 50 in half a millisecond
				if d, err := l.Allow(context.Background(), "hot"); err == nil && d.Allowed {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != 50 {
			t.Errorf("admitted %d of 50", got)
		}
		if a, ls := next.applies.Load(), next.lends.Load(); a > 3 || ls > 3 {
			t.Errorf("the next store had %d takes and %d lends (a loan, the charge on trust); want at most 3 each", a, ls)
		}
	})
}

// TestLeasesCostAfter: a partial take and a debit through Leases decide on the next
// store, as they would without them.
func TestLeasesCostAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := hotkey.NewLeases(localstore.New())
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		l, _ := tokenbucket.New(p, ratelimit.PerSecond(10))
		ctx := context.Background()
		for i, want := range []int64{7, 3, 0} {
			if got, d, err := l.AllowAtMost(ctx, "k", 7); err != nil || got != want || d.Allowed != (want > 0) {
				t.Fatalf("AllowAtMost %d: %d, %+v, %v; want %d", i, got, d, err, want)
			}
		}
		time.Sleep(100 * time.Millisecond) // one event back
		d, err := l.Debit(ctx, "k", 5)
		if err != nil || d.Allowed || d.RetryAfter != 500*time.Millisecond {
			t.Fatalf("a debit of 5 with 1 left: %+v, %v; want denied for 500ms", d, err)
		}
	})
}

// TestLeasesNothingCreatesAllowance: three instances on Leases over one store, asked
// together about four times the rule of two keys, with quiet moments, charges settled
// later at their real cost (refunds to the lease that lent them, or to the store;
// debits), partial takes, debits, peeks, resets and changes of rule, every decision
// counted (limitertest.Reference): no window admits more than the rule, no sliding
// window's estimate at an admission exceeds it, and a bucket admits no more from any
// moment on than its capacity and its rate since, plus what the instances held then
// (spent from memory, counted when it was lent) and were given back since; beyond those,
// only the debts, and what the instances held of a key when a reset or a change of rule
// began anew (theirs until their next refill). Most decisions come from leases.
func TestLeasesNothingCreatesAllowance(t *testing.T) {
	// a bucket's burst small beside its rate, so that an event created now and then
	// shows within a run that spends all the bucket holds
	rules := [2]ratelimit.Rule{{Limit: 100, Period: time.Second, Burst: 20}, {Limit: 60, Period: time.Second, Burst: 10}}
	for _, k := range limitertest.Kinds {
		if !k.Algorithm.Lendable {
			continue
		}
		t.Run(k.Name, func(t *testing.T) {
			for seed := range uint64(3) {
				synctest.Test(t, func(t *testing.T) { runLeasedAllowance(t, k, rules, seed) })
			}
		})
	}
}

func runLeasedAllowance(t *testing.T, k limitertest.Kind, rules [2]ratelimit.Rule, seed uint64) {
	ctx := context.Background()
	shared := localstore.New()
	type inst struct {
		leases *hotkey.Leases
		lims   [2]*ratelimit.AlgorithmLimiter
	}
	var ins [3]inst
	for i := range ins {
		p, err := hotkey.NewLeases(shared, hotkey.WithRefill(100*time.Millisecond), hotkey.WithInstanceCount(func() int { return len(ins) }))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(ctx)
		ins[i].leases = p
		for r, rule := range rules {
			l, err := k.New(p, rule, ratelimit.WithNamespace("api"))
			if err != nil {
				t.Fatal(err)
			}
			ins[i].lims[r] = l.(*ratelimit.AlgorithmLimiter)
		}
	}
	held := func(key string) (n int64) {
		for _, in := range ins {
			n += in.leases.Held(key)
		}
		return n
	}
	ref := limitertest.NewReference(k.Name, rules, time.Now())
	ref.Trust(int64(len(ins))) // an event on trust per instance
	type pending struct {
		charge      *ratelimit.Charge
		key         string
		n, cost, at int64
		rule        int
	}
	var open []pending
	rng := rand.New(rand.NewPCG(seed, 7))
	debits := k.Algorithm.Debit != nil
	var log []string
	fail := func(format string, args ...any) {
		t.Helper()
		if len(log) > 40 {
			log = log[len(log)-40:]
		}
		t.Fatalf("seed %d: "+format+"\nthe last steps:\n%s", append(append([]any{seed}, args...), strings.Join(log, "\n"))...)
	}
	// under puts key under rule r, as an operation under it does: a segment begins
	under := func(key string, r int) {
		if ref.Rule(key) != r {
			ref.Restart(key, time.Now().UnixMicro(), r, held(key))
		}
	}
	for step := range 300 {
		pause := time.Duration(rng.IntN(20)) * time.Millisecond // the refillers run
		if rng.IntN(40) == 0 {
			pause = time.Duration(300+rng.IntN(1200)) * time.Millisecond // a quiet moment: leases are given back, or end
		}
		time.Sleep(pause)
		synctest.Wait()
		for _, key := range []string{"a", "b"} { // what the instances hold now, spent from memory
			ref.Mark(key, time.Now().UnixMicro(), held(key))
		}
		for range 1 + rng.IntN(12) {
			in := ins[rng.IntN(len(ins))]
			key := []string{"a", "b"}[rng.IntN(2)]
			r := ref.Rule(key)
			if rng.IntN(400) == 0 { // now and then, the key's rule changes
				r = 1 - r
			}
			l := in.lims[r]
			now := time.Now().UnixMicro()
			n := 1 + rng.Int64N(3)
			what := ""
			switch op := rng.IntN(100); {
			case op < 60:
				cost := n
				if op >= 35 { // a debt is rare, and small: its debt is slack the property allows
					cost = []int64{0, n / 2, 0, n / 2, n + 1}[rng.IntN(5)]
					if !debits {
						cost = min(cost, n)
					}
				}
				c, d, err := l.Charge(ctx, key, n)
				if err != nil {
					fail("Charge(%d): %v", n, err)
				}
				under(key, r)
				if d.Allowed {
					ref.Admit(key, now, cost, max(0, cost-n))
					if cost != n {
						open = append(open, pending{c, key, n, cost, now, r})
					}
				}
				what = fmt.Sprintf("take %d (costs %d): %v", n, cost, d.Allowed)
			case op < 80 && len(open) > 0:
				i := rng.IntN(len(open))
				pd := open[i]
				open = append(open[:i], open[i+1:]...)
				if _, err := pd.charge.Settle(ctx, pd.cost); err != nil {
					fail("Settle(%d): %v", pd.cost, err)
				}
				under(pd.key, pd.rule)
				if pd.cost < pd.n { // given back, maybe to a lease, to be admitted again
					ref.Refunded(pd.key, pd.at, pd.n-pd.cost)
				}
				key, what = pd.key, fmt.Sprintf("settle a take of %d at %d", pd.n, pd.cost)
			case op < 85:
				got, _, err := l.AllowAtMost(ctx, key, 1+rng.Int64N(20))
				if err != nil {
					fail("AllowAtMost: %v", err)
				}
				under(key, r)
				ref.Admit(key, now, got, 0)
				what = fmt.Sprintf("at most: %d", got)
			case op < 90 && debits:
				if _, err := l.Debit(ctx, key, 1+rng.Int64N(20)); err != nil {
					fail("Debit: %v", err)
				}
				under(key, r)
				what = "debit"
			case op < 90 || rng.IntN(8) > 0:
				if _, err := l.PeekN(ctx, key, n); err != nil {
					fail("PeekN: %v", err)
				}
				what = "peek"
			case op < 92:
				carry := held(key)
				if err := l.Reset(ctx, key); err != nil {
					fail("Reset: %v", err)
				}
				ref.Restart(key, now, r, carry)
				what = "reset"
			default:
				if _, err := l.PeekN(ctx, key, n); err != nil {
					fail("PeekN: %v", err)
				}
				what = "peek"
			}
			log = append(log, fmt.Sprintf("  %3d at %v, key %s under %v: %s", step, time.Duration(now)*time.Microsecond, key, rules[r], what))
			if msg := ref.Check(); msg != "" {
				fail("%s", msg)
			}
		}
	}
	var local, exact int64
	for _, in := range ins {
		st := in.leases.Stats()
		local, exact = local+st.Local, exact+st.Exact
	}
	if local < exact {
		t.Errorf("seed %d: %d decisions from leases, %d exact: want most from leases", seed, local, exact)
	}
}

// remote is a shared store a round trip away (rtt of the bubble's fake time per call),
// that counts its calls: what a Redis would see.
type remote struct {
	*localstore.Store
	rtt   time.Duration
	calls atomic.Int64
}

func (r *remote) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	r.calls.Add(1)
	time.Sleep(r.rtt)
	return r.Store.Apply(ctx, req)
}

func (r *remote) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	r.calls.Add(1)
	time.Sleep(r.rtt)
	return r.Store.ApplyAll(ctx, reqs)
}

func (r *remote) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	r.calls.Add(1)
	time.Sleep(r.rtt)
	return r.Store.Lend(ctx, loans)
}

// newLeases is Leases over next for one of instances instances, closed with the test.
func newLeases(t *testing.T, next ratelimit.Store, instances int) *hotkey.Leases {
	t.Helper()
	p, err := hotkey.NewLeases(next, hotkey.WithInstanceCount(func() int { return instances }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// admissions are the instants of a run's admissions, for its counts over windows.
type admissions struct {
	mu sync.Mutex
	at []time.Duration // since the run's start, in order
}

func (a *admissions) add(d time.Duration) {
	a.mu.Lock()
	a.at = append(a.at, d)
	a.mu.Unlock()
}

// in is how many were admitted in [from, to).
func (a *admissions) in(from, to time.Duration) (n int) {
	for _, d := range a.at {
		if d >= from && d < to {
			n++
		}
	}
	return n
}

// sliding is the fewest and the most admitted in any window of w that starts in [from,
// to-w], at every step.
func (a *admissions) sliding(w, from, to, step time.Duration) (least, most int) {
	least = -1
	for s := from; s+w <= to; s += step {
		n := a.in(s, s+w)
		if least < 0 || n < least {
			least = n
		}
		most = max(most, n)
	}
	return least, most
}

// TestLeasesAboveTheRuleStayLocal: a tenant asked four times its rule (100 a second,
// bursts of 200) over four instances (50/25/15/10%) a round trip of 1ms away: once
// leased, every decision is made from memory, denials and admissions alike, and the
// admissions follow the rule as the exact path's do: within 3% of it over each 10s, at
// most 5% above the burst and a second's rate in any sliding second, at least 90% of the
// rate in any sliding second after the first.
func TestLeasesAboveTheRuleStayLocal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		ins := make([]*tokenbucket.Limiter, 4)
		ps := make([]*hotkey.Leases, 4)
		for i := range ins {
			ps[i] = newLeases(t, shared, 4)
			ins[i], _ = tokenbucket.New(ps[i], seedRule, ratelimit.WithNamespace("api"))
		}
		var got admissions
		start := time.Now()
		const perSecond, run = 400, 21 * time.Second
		var before [4]hotkey.LeasesStats
		for i := range int(run / (time.Second / perSecond)) {
			at := start.Add(time.Duration(i) * time.Second / perSecond)
			time.Sleep(time.Until(at))
			if i == perSecond { // a second in: the key is leased everywhere
				for j, p := range ps {
					before[j] = p.Stats()
				}
			}
			in := []int{0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 0, 0, 1, 0, 0, 0, 3}[i%20] // 50/25/15/10%
			d, err := ins[in].Allow(context.Background(), "tenant")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				got.add(time.Since(start))
			}
		}
		for j, p := range ps {
			st := p.Stats()
			if exact := st.Exact - before[j].Exact; exact != 0 {
				t.Errorf("instance %d: %d decisions on the exact path once leased: %+v", j, exact, st)
			}
		}
		for from := time.Second; from+10*time.Second <= run; from += 10 * time.Second {
			if n := got.in(from, from+10*time.Second); n < 970 || n > 1030 {
				t.Errorf("admitted %d in the 10s from %v; want the rule's 1000 within 3%%", n, from)
			}
		}
		least, _ := got.sliding(time.Second, time.Second, run, 10*time.Millisecond)
		_, most := got.sliding(time.Second, 0, run, 10*time.Millisecond)
		if least < 90 || most > 315 {
			t.Errorf("the fewest admitted in a sliding second after the first %d (want 90 at least), the most %d (want 315 at most)", least, most)
		}
		if calls := shared.calls.Load(); calls*20 > perSecond*int64(run/time.Second) {
			t.Errorf("%d calls to the shared store for %d decisions; want one for 20 at most", calls, perSecond*int64(run/time.Second))
		}
	})
}

// TestLeasesWindowsAskedBeyond: four instances (50/25/15/10% of the requests) ask a key
// four times its rule of 100 a second, for each algorithm that lends. Every 10s after
// the first admits the rule within 3% (a sliding window 4.5%), and each of a fixed
// window's windows no more than its 100 and one event on trust per instance. A window's
// leases once left what the holders did not take unlent: what a fixed window left ended
// with it (0.91-0.96 of the rule), and a sliding window never lent it (0.72).
func TestLeasesWindowsAskedBeyond(t *testing.T) {
	for _, alg := range []*core.Algorithm{tokenbucket.Algorithm(), fixedwindow.Algorithm(), slidingwindow.Algorithm()} {
		t.Run(alg.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
				ins := make([]*ratelimit.AlgorithmLimiter, 4)
				for i := range ins {
					var err error
					ins[i], err = ratelimit.NewAlgorithmLimiter(newLeases(t, shared, 4), alg, ratelimit.PerSecond(100), ratelimit.WithNamespace("api"))
					if err != nil {
						t.Fatal(err)
					}
				}
				var got admissions
				start := time.Now()
				const perSecond, run = 400, 21 * time.Second
				for i := range int(run / (time.Second / perSecond)) {
					time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / perSecond)))
					in := []int{0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 0, 0, 1, 0, 0, 0, 3}[i%20]
					d, err := ins[in].Allow(context.Background(), "tenant")
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						got.add(time.Since(start))
					}
				}
				least := int64(970)
				if alg == slidingwindow.Algorithm() {
					// what the key frees in its window's last few ms is lent in the next, where
					// it frees that much less: 0.96-0.975 of the rule (the exact path 0.99)
					least = 955
				}
				for from := time.Second; from+10*time.Second <= run; from += 10 * time.Second {
					if n := got.in(from, from+10*time.Second); int64(n) < least || n > 1004 {
						t.Errorf("admitted %d in the 10s from %v; want the rule's 1000, %d at least", n, from, least)
					}
				}
				if alg == fixedwindow.Algorithm() {
					for from := time.Duration(0); from < run; from += time.Second {
						if n := got.in(from, from+time.Second); n > 104 {
							t.Errorf("admitted %d in the window from %v; want 100 at most, and one on trust per instance", n, from)
						}
					}
				}
			})
		})
	}
}

// TestLeasesRuleChange: four instances deciding a key leased under 1000 a second (bursts
// of 2000), asked 4000 a second, all move to 100 a second (bursts of 200) at once: from
// then on they admit no more than the new rule's burst and its rate over the time since
// the change, but for 1% of its 10s allowance, and keep deciding from memory. They admit
// its rate, every second after the first: the key was spent at the change, and what the
// leases held then (117-175 events in runs) goes back to it and is admitted in the first.
func TestLeasesRuleChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		ins := make([]*instance, 4)
		for i := range ins {
			ins[i] = newInstance(t, shared, hotkey.WithInstanceCount(func() int { return 4 }))
		}
		old := ratelimit.Rule{Limit: 1000, Period: time.Second, Burst: 2000}
		rule := ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 200}
		ctx := context.Background()
		tick := time.Second / 4000
		var changed time.Time
		var perSecond [3]int // admitted in each second after the first since the change
		admitted, local := 0, int64(0)
		for i := range 6 * 4000 {
			r := old
			if i >= 2*4000 {
				if changed.IsZero() {
					changed = time.Now()
					for _, in := range ins {
						local -= in.leases.Stats().Local
					}
				}
				r = rule
			}
			d, err := ins[i%4].limiter.AllowRule(ctx, "tenant", r, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed && !changed.IsZero() {
				admitted++
				// the seconds 1 to 4 after the change; a decision that waited for a refill
				// may come past the 4s the loop's ticks take
				if s := int(time.Since(changed)/time.Second) - 1; s >= 0 && s < len(perSecond) {
					perSecond[s]++
				}
				bound := 200 + int(100*time.Since(changed).Seconds()) + 10
				if admitted > bound {
					t.Fatalf("%d admitted %v after the change; want the new rule's %d at most", admitted, time.Since(changed), bound)
				}
			}
			time.Sleep(tick)
		}
		for _, in := range ins {
			local += in.leases.Stats().Local
		}
		if local < 4*4000*99/100 {
			t.Errorf("%d of the 16000 decisions under the new rule from leases; want 99%%", local)
		}
		for i, n := range perSecond {
			if n < 98 || n > 102 {
				t.Errorf("admitted %d in second %d after the change; want the new rule's rate of 100 (%v)", n, i+2, perSecond)
			}
		}
		if admitted < 400 {
			t.Errorf("admitted %d in the 4s after the change; want the new rule's rate over them at least, 400", admitted)
		}
	})
}

// TestLeasesSeveralLimits: the seed's case, a rate per (tenant, route) beside a tenant's
// hourly quota, decided together (ratelimit.AllowAll, as Middleware.Policies does) on
// four instances a round trip of 1ms away: once leased, every request is decided from
// memory, all or none, with one call to the shared store for 10 decisions at most (about 12.5: each
// instance renews its leases once a refill interval, and asks 20 a second of each); no
// limit admits more than its rule, and what the quota denies takes nothing from the rate.
func TestLeasesSeveralLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		type inst struct {
			p           *hotkey.Leases
			rate, quota *ratelimit.AlgorithmLimiter
		}
		ins := make([]inst, 4)
		for i := range ins {
			ins[i].p = newLeases(t, shared, 4)
			ins[i].rate, _ = tokenbucket.New(ins[i].p, seedRule, ratelimit.WithNamespace("rate"))
			ins[i].quota, _ = fixedwindow.New(ins[i].p, ratelimit.PerHour(1500), ratelimit.WithNamespace("quota"))
		}
		ctx := context.Background()
		start := time.Now()
		admitted, decisions := 0, 0
		var local int64
		for i := range 80 * 20 { // 80 a second for 20s: under the rate, over the quota after about 17s
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / 80)))
			in := ins[i%4]
			d, err := ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: in.rate, Key: "tenant/route"}, ratelimit.Part{Limiter: in.quota, Key: "tenant"})
			if err != nil {
				t.Fatal(err)
			}
			decisions++
			if d.Allowed {
				admitted++
			}
		}
		elapsed := time.Since(start)
		calls := shared.calls.Load()
		for _, in := range ins {
			st := in.p.Stats()
			local += st.Local
			if err := in.p.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if local < 2*int64(decisions)*95/100 || calls*10 > int64(decisions) {
			t.Errorf("%d of %d limits decided from leases, %d calls to the shared store; want 95%% and one call for 10 decisions at most", local, 2*decisions, calls)
		}
		peek := func(alg *core.Algorithm, ns, key string, rule ratelimit.Rule) int64 {
			o, err := shared.Store.Apply(ctx, core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: alg, Namespace: ns, Rule: core.Rule(rule), Op: core.OpPeek}})
			if err != nil {
				t.Fatal(err)
			}
			if !o.Allowed() {
				return 0
			}
			return o.Remaining + 1
		}
		quotaLeft := peek(fixedwindow.Algorithm(), "quota", "tenant", ratelimit.PerHour(1500))
		if admitted > 1500 || admitted+int(quotaLeft) != 1500 {
			t.Errorf("admitted %d, the quota has %d left; want 1500 together", admitted, quotaLeft)
		}
		rateLeft := peek(tokenbucket.Algorithm(), "rate", "tenant/route", seedRule)
		if want := int64(200 + 100*elapsed.Seconds()); int64(admitted)+rateLeft > want || rateLeft < 195 {
			t.Errorf("admitted %d, the rate has %d left of a bucket of 200 refilled by %v; want it full (what the quota denied took nothing)", admitted, rateLeft, elapsed)
		}
	})
}

// TestLeasesHotAtOnce: a key that turns hot, 20,000 requests a second from 32 callers over
// four instances a round trip of 1ms away, is leased within a few round trips: over its
// first 0.3s, one call to the shared store for 40 decisions at most.
func TestLeasesHotAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		ins := make([]*tokenbucket.Limiter, 4)
		for i := range ins {
			ins[i], _ = tokenbucket.New(newLeases(t, shared, 4), ratelimit.Rule{Limit: 10_000, Period: time.Second, Burst: 20_000})
		}
		const callers, each = 32, 6000 / 32 // 6000 in 0.3s
		start := time.Now()
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				for i := range each {
					time.Sleep(time.Until(start.Add(time.Duration(i*callers+c) * 50 * time.Microsecond)))
					if _, err := ins[c%4].Allow(context.Background(), "launch"); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if calls := shared.calls.Load(); calls*40 > callers*each {
			t.Errorf("%d calls to the shared store for %d decisions in %v; want one for 40 at most", calls, callers*each, time.Since(start))
		}
	})
}

// TestLeasesDebtReachesLeases: a daily budget of 100,000 tokens on four instances, each
// request admitted on an estimate of 1 and charged its 5,000 once answered (Charge, then
// Settle): each debit is charged to the lease that admitted it first, and a debt stops
// every lease, so the cluster admits the budget's 20 requests and at most one more per
// instance (the request each has in progress when the budget runs out), not what the
// leases held (75% over before).
func TestLeasesDebtReachesLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		ls := make([]*fixedwindow.Limiter, 4)
		for i := range ls {
			ls[i], _ = fixedwindow.New(newLeases(t, shared, 4), ratelimit.PerDay(100_000))
		}
		ctx := context.Background()
		start := time.Now()
		admitted := 0
		for i := range 40 * 20 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / 40)))
			c, d, err := ls[i%4].Charge(ctx, "tenant", 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
				if _, err := c.Settle(ctx, 5000); err != nil {
					t.Fatal(err)
				}
			}
		}
		if admitted < 20 || admitted > 20+len(ls) {
			t.Errorf("admitted %d requests of 5,000 tokens against 100,000 a day; want 20, and one more per instance at most", admitted)
		}
	})
}

// TestLeasesDebitsFromTheLease: the costs charged after the answers of a leased key are
// part of its lease's demand: one instance admitting 200 requests a second of one key,
// each charged 9 more once answered (Debit), against a rule of 5,000 a second. Once the
// refiller has seen a second of it, the lease holds what the debits spend too, and they
// are paid from memory: 2 calls to the shared store in the last two seconds (its
// refills), where a lease sized by the admissions alone made 35 (refills asked early, and
// what the lease could not pay).
func TestLeasesDebitsFromTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		l, _ := tokenbucket.New(newLeases(t, shared, 1), ratelimit.PerSecond(5000))
		ctx := context.Background()
		start := time.Now()
		var calls0 int64
		for i := range 200 * 4 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * 5 * time.Millisecond)))
			if i == 200*2 {
				calls0 = shared.calls.Load()
			}
			if d, err := l.Allow(ctx, "tenant"); err != nil || !d.Allowed {
				t.Fatalf("request %d: %+v, %v", i, d, err)
			}
			if _, err := l.Debit(ctx, "tenant", 9); err != nil {
				t.Fatal(err)
			}
		}
		if calls := shared.calls.Load() - calls0; calls > 10 {
			t.Errorf("%d calls to the shared store in the last 2s of 200 admissions and 200 debits of 9 a second; want 10 at most", calls)
		}
	})
}

// TestLeasesReserves: requests that keep a reserve for more important ones (priorities)
// are decided from the lease too, against the key's Remaining as the instance last heard
// it: the sheddable ones stop while the critical ones go on, and none takes the exact
// path once leased.
func TestLeasesReserves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newLeases(t, localstore.New(), 1)
		l, err := tokenbucket.New(p, seedRule, ratelimit.WithNamespace("api"), ratelimit.WithReserves(0, 50))
		if err != nil {
			t.Fatal(err)
		}
		critical := ratelimit.WithPriority(context.Background(), 0)
		sheddable := ratelimit.WithPriority(context.Background(), 1)
		var before hotkey.LeasesStats
		shed, crit := 0, 0
		for i := range 1000 { // 200 a second for 5s, half of each: twice the rule
			time.Sleep(5 * time.Millisecond)
			if i == 200 {
				before = p.Stats()
			}
			ctx, n := critical, &crit
			if i%2 == 1 {
				ctx, n = sheddable, &shed
			}
			d, err := l.Allow(ctx, "tenant")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed && i >= 200 {
				(*n)++
			}
		}
		if st := p.Stats(); st.Exact != before.Exact {
			t.Errorf("%d decisions on the exact path once leased: %+v", st.Exact-before.Exact, st)
		}
		t.Logf("critical %d, sheddable %d", crit, shed)
		if crit < 300 || shed > crit/4 {
			t.Errorf("over 4s at twice the rule: %d critical and %d sheddable admitted; want most of the rule's 400 to the critical", crit, shed)
		}
	})
}

// TestLeasesThroughAnOutageCount: four instances with the fallback store under their
// leases, a key asked four times its rule, its primary down for 5s: what the leases
// spend through the outage was taken from the fallback's shares when it was lent, so the
// leases and the shares together admit at most 1.1 times the rule over the outage (1.04
// times; 1.39 before), as the exact path does (1.00 times).
func TestLeasesThroughAnOutageCount(t *testing.T) {
	for _, leased := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			primary := &switchable{Store: localstore.New()}
			ins := make([]*tokenbucket.Limiter, 4)
			for i := range ins {
				var store ratelimit.Store = fallback.New(primary, localstore.New(), fallback.WithInstances(4))
				if leased {
					store = newLeases(t, store, 4)
				}
				ins[i], _ = tokenbucket.New(store, seedRule, ratelimit.WithNamespace("api"))
			}
			start := time.Now()
			admitted := 0
			for i := range 400 * 8 { // 3s up, 5s down
				time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / 400)))
				if i == 400*3 {
					primary.down.Store(true)
				}
				d, err := ins[i%4].Allow(context.Background(), "tenant")
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed && i >= 400*3 {
					admitted++
				}
			}
			t.Logf("leased %v: %d admitted in the 5s of the outage, %.2f times the rule", leased, admitted, float64(admitted)/500)
			if admitted > 550 {
				t.Errorf("leased %v: %d admitted in the 5s of the outage; want 1.1 times the rule's 500 at most", leased, admitted)
			}
		})
	}
}

// TestAfterCloseExact: after Close, a key's requests take the exact path: a fresh key of
// 10 an hour is admitted 10 of 11, none on trust (an event on trust after Close would
// have been charged by no one's background, and admitted the 11th).
func TestAfterCloseExact(t *testing.T) {
	p, err := hotkey.NewLeases(localstore.New())
	if err != nil {
		t.Fatal(err)
	}
	l, _ := fixedwindow.New(p, ratelimit.PerHour(10))
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 11 {
		if d, err := l.Allow(context.Background(), "fresh"); err == nil && d.Allowed {
			admitted++
		}
	}
	if st := p.Stats(); admitted != 10 || st.Trusted != 0 {
		t.Errorf("after Close: %d of 11 admitted, %d on trust; want 10, none on trust", admitted, st.Trusted)
	}
}

// counted is what a fixed window of rule in namespace ns counts of key on store, peeked.
func counted(t *testing.T, store ratelimit.Store, ns, key string, rule ratelimit.Rule) int64 {
	t.Helper()
	peek := &core.Spec{Algorithm: fixedwindow.Algorithm(), Namespace: ns, Rule: core.Rule(rule), Op: core.OpPeek}
	o, err := store.Apply(context.Background(), core.Request{Key: key, N: 1, Spec: peek})
	if err != nil {
		t.Fatal(err)
	}
	return rule.Limit - o.Remaining - 1
}

// lossy loses the answers of loans to holders, as a Redis call that timed out does: of
// every six calls, one lands and its answer is lost, one never lands, and one lands
// after the next call. The charges on trust (loans without a holder) it passes on.
type lossy struct {
	*localstore.Store
	mu    sync.Mutex
	calls int
	late  []core.Loan // a call's loans that land after the next call's
	off   atomic.Bool // every call lands and is answered
}

func (s *lossy) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	if loans[0].Holder == 0 {
		return s.Store.Lend(ctx, loans)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	late := s.late
	s.late = nil
	defer func() {
		if late != nil {
			s.Store.Lend(ctx, late)
		}
	}()
	if s.off.Load() {
		return s.Store.Lend(ctx, loans)
	}
	s.calls++
	switch s.calls % 6 {
	case 1: // landed, its answer lost
		s.Store.Lend(ctx, loans)
		return nil, ratelimit.ErrUnavailable
	case 3: // never landed
		return nil, ratelimit.ErrUnavailable
	case 5: // lands after the next call
		s.late = loans
		return nil, ratelimit.ErrUnavailable
	}
	return s.Store.Lend(ctx, loans)
}

// TestLeasesLostAnswers: two instances' loans of a busy key, and of one busy for a
// second, lose half their answers (landed, not landed, landed late): once the instances
// close, what the keys counted is what they admitted, to the event. Before loans were
// numbered, what a lost answer lent or gave back was lost with it.
func TestLeasesLostAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		rule := ratelimit.PerHour(1_000_000)
		var stores []*lossy
		var limiters []*fixedwindow.Limiter
		var leases []*hotkey.Leases
		for range 2 {
			s := &lossy{Store: shared}
			p, err := hotkey.NewLeases(s, hotkey.WithInstanceCount(func() int { return 2 }))
			if err != nil {
				t.Fatal(err)
			}
			l, _ := fixedwindow.New(p, rule, ratelimit.WithNamespace("lost"))
			stores, leases, limiters = append(stores, s), append(leases, p), append(limiters, l)
		}
		admitted := map[string]int64{}
		for i := range 3000 {
			for _, l := range limiters {
				for _, key := range []string{"busy", "brief"} {
					if key == "brief" && i >= 1000 {
						continue
					}
					if d, err := l.Allow(context.Background(), key); err != nil {
						t.Fatal(err)
					} else if d.Allowed {
						admitted[key]++
					}
				}
			}
			time.Sleep(time.Millisecond)
		}
		var failed int64
		for i, p := range leases {
			failed += p.Stats().Failed
			stores[i].off.Store(true)
			if err := p.Close(context.Background()); err != nil {
				t.Error(err)
			}
		}
		if failed == 0 {
			t.Fatal("no loan failed")
		}
		for key, n := range admitted {
			if used := counted(t, shared, "lost", key, rule); used != n {
				t.Errorf("%s: admitted %d, counted %d (%d loans failed)", key, n, used, failed)
			}
		}
	})
}

// TestLeasesOfADebitedKey: a key whose first request was a debit, a settlement or kept a
// reserve is leased as any: its loans lend (a loan of the debit's Spec was refused by
// every store, so the key's refills all failed and its refunds were lost), and what its
// refunds give back reaches the key.
func TestLeasesOfADebitedKey(t *testing.T) {
	for _, first := range []string{"debit", "settle", "reserve"} {
		t.Run(first, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				shared := localstore.New()
				p, err := hotkey.NewLeases(shared)
				if err != nil {
					t.Fatal(err)
				}
				rule := ratelimit.PerDay(1_000_000)
				l, _ := fixedwindow.New(p, rule, ratelimit.WithNamespace("first"), ratelimit.WithReserves(0, 10))
				ctx := context.Background()
				switch first {
				case "debit":
					_, err = l.Debit(ctx, "k", 5)
				case "settle": // a refund, made before the key was known
					var c *ratelimit.Charge
					if c, _, err = l.Charge(ctx, "k", 2); err == nil {
						_, err = c.Settle(ctx, 1)
					}
				case "reserve":
					_, err = l.Allow(ratelimit.WithPriority(ctx, ratelimit.Normal), "k")
				}
				if err != nil {
					t.Fatal(err)
				}
				var charged int64
				for range 2000 {
					c, d, err := l.Charge(ctx, "k", 3)
					if err != nil || !d.Allowed {
						t.Fatalf("%+v, %v", d, err)
					}
					if _, err := c.Settle(ctx, 1); err != nil {
						t.Fatal(err)
					}
					charged++
					time.Sleep(time.Millisecond)
				}
				st := p.Stats()
				if err := p.Close(ctx); err != nil {
					t.Fatal(err)
				}
				if st.Failed != 0 || st.Local < 1500 {
					t.Errorf("%+v: want no failed refill, most decisions from the lease", st)
				}
				want := charged
				switch first {
				case "debit":
					want += 5
				case "settle", "reserve":
					want++
				}
				if used := counted(t, shared, "first", "k", rule); used != want {
					t.Errorf("counted %d; want %d, each charge's 1", used, want)
				}
			})
		})
	}
}

// TestLeasesComeBack: a leased key goes quiet until its lease ends (what it spent stays
// out on its record until the record's TTL), and comes back, within that TTL or after,
// or under a rule its algorithm reads the same: what the key counts is what was admitted.
// (A new entry of the key once took the old record for its own, counted nothing out,
// and its first loan gave back what the old lease had spent: 1,995 events created.)
func TestLeasesComeBack(t *testing.T) {
	for _, quiet := range []time.Duration{3 * time.Second, 4 * time.Second, 5 * time.Second, 8 * time.Second, 0} {
		name := "quiet " + quiet.String()
		if quiet == 0 {
			name = "a window's burst changed"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				shared := localstore.New()
				p, err := hotkey.NewLeases(shared)
				if err != nil {
					t.Fatal(err)
				}
				rule := ratelimit.PerHour(1_000_000)
				l, _ := fixedwindow.New(p, rule, ratelimit.WithNamespace("back"))
				other := rule // quiet 0: the rule changes instead, to one a fixed window reads the same
				other.Burst = 7
				l2, _ := fixedwindow.New(p, other, ratelimit.WithNamespace("back"))
				var admitted int64
				run := func(l *fixedwindow.Limiter, d time.Duration) {
					for range int(d / time.Millisecond) {
						if dec, err := l.Allow(context.Background(), "k"); err != nil {
							t.Fatal(err)
						} else if dec.Allowed {
							admitted++
						}
						time.Sleep(time.Millisecond)
					}
				}
				run(l, 2*time.Second)
				if quiet == 0 {
					run(l2, 2*time.Second)
				} else {
					time.Sleep(quiet)
					run(l, 2*time.Second)
				}
				if err := p.Close(context.Background()); err != nil {
					t.Error(err)
				}
				if used := counted(t, shared, "back", "k", rule); used != admitted {
					t.Errorf("admitted %d, counted %d", admitted, used)
				}
			})
		})
	}
}

// TestLeasesSmallBurstAtItsRule: a bucket of 500 a second holding 100 (it fills in
// 200ms, less than a refill interval's look) asked 4,000 a second on each of four
// instances is admitted its rule: refilled at the looks alone, what it accrued past its
// burst between them was lost (2,838 of 5,100).
func TestLeasesSmallBurstAtItsRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		rule := ratelimit.Rule{Limit: 500, Period: time.Second, Burst: 100}
		ctx := context.Background()
		var admitted atomic.Int64
		var wg sync.WaitGroup
		var ps []*hotkey.Leases
		for range 4 {
			p, err := hotkey.NewLeases(shared, hotkey.WithInstanceCount(func() int { return 4 }))
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
			l, _ := tokenbucket.New(p, rule, ratelimit.WithNamespace("small"))
			for range 2 {
				wg.Go(func() {
					for range 20_000 {
						if d, err := l.Allow(ctx, "k"); err == nil && d.Allowed {
							admitted.Add(1)
						}
						time.Sleep(500 * time.Microsecond)
					}
				})
			}
		}
		wg.Wait()
		for _, p := range ps {
			if err := p.Close(ctx); err != nil {
				t.Error(err)
			}
		}
		if got, rule := admitted.Load(), int64(100+5000); got < rule*97/100 || got > rule+4 {
			t.Errorf("admitted %d in 10s; want the rule's %d (at least 97%%, at most 4 over: the instances' trust)", got, rule)
		}
	})
}

// failDebits fails the next debits with a receipt (a settlement) before they land.
type failDebits struct {
	*localstore.Store
	fail atomic.Int64
}

func (f *failDebits) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if req.Spec.Op == core.OpDebit && req.Receipt != nil && f.fail.Add(-1) >= 0 {
		return core.Outcome{}, ratelimit.ErrUnavailable
	}
	return f.Store.Apply(ctx, req)
}

// TestLeasesSettlementRetried: a charge from a lease settled above its cost, whose lease
// pays part and whose rest fails at the next store, then settled again as Settle asks:
// the key is charged the cost once (the retry charged the lease's part a second time).
func TestLeasesSettlementRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &failDebits{Store: localstore.New()}
		rule := ratelimit.PerHour(1_000_000)
		p, err := hotkey.NewLeases(shared)
		if err != nil {
			t.Fatal(err)
		}
		l, _ := fixedwindow.New(p, rule, ratelimit.WithNamespace("retry"))
		ctx := context.Background()
		var want int64
		for range 2000 { // leased
			if d, _ := l.Allow(ctx, "k"); d.Allowed {
				want++
			}
			time.Sleep(time.Millisecond)
		}
		c, _, err := l.Charge(ctx, "k", 10)
		if err != nil || c == nil {
			t.Fatal(err)
		}
		shared.fail.Store(1)
		if _, err := c.Settle(ctx, 5000); !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Fatalf("the first settlement: %v; want ErrUnavailable", err)
		}
		if _, err := c.Settle(ctx, 5000); err != nil {
			t.Fatal(err)
		}
		want += 5000
		if err := p.Close(ctx); err != nil {
			t.Error(err)
		}
		if used := counted(t, shared, "retry", "k", rule); used != want {
			t.Errorf("counted %d; want %d", used, want)
		}
	})
}

// TestLeasesResetAfterTrust: a key's request admitted on trust, then the key reset at
// once: the charge lands before the reset, and the restored key is full.
func TestLeasesResetAfterTrust(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		p, err := hotkey.NewLeases(shared)
		if err != nil {
			t.Fatal(err)
		}
		rule := ratelimit.PerHour(100)
		l, _ := fixedwindow.New(p, rule, ratelimit.WithNamespace("trust"))
		ctx := context.Background()
		if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed || p.Stats().Trusted != 1 {
			t.Fatalf("%+v, %v, %+v; want admitted on trust", d, err, p.Stats())
		}
		if err := l.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(ctx); err != nil {
			t.Error(err)
		}
		if used := counted(t, shared, "trust", "k", rule); used != 0 {
			t.Errorf("after the reset: the key counts %d; want it full", used)
		}
	})
}

// TestLeasesRefundAfterTheLeaseEnded: charges taken from a key's lease are settled at no
// cost after the key went quiet for up to 10s (its lease ended, and its record): every
// charge comes back, as on the store alone (a refund of a lease that had ended gave
// nothing back: 995 of 1,000 events lost), over the store and over the fallback.
func TestLeasesRefundAfterTheLeaseEnded(t *testing.T) {
	for _, overFallback := range []bool{false, true} {
		for _, gap := range []time.Duration{0, 1500 * time.Millisecond, 3 * time.Second, 10 * time.Second} {
			t.Run(fmt.Sprintf("fallback %v, %v quiet", overFallback, gap), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					shared := localstore.New()
					var next ratelimit.Store = shared
					if overFallback {
						next = fallback.New(shared, localstore.New(), fallback.WithTimeout(time.Second))
					}
					p, err := hotkey.NewLeases(next)
					if err != nil {
						t.Fatal(err)
					}
					rule := ratelimit.PerHour(1_000_000)
					l, _ := fixedwindow.New(p, rule, ratelimit.WithNamespace("late"))
					ctx := context.Background()
					var want int64
					var parked []*ratelimit.Charge
					for i := range 2000 {
						if i%10 == 0 {
							c, d, err := l.Charge(ctx, "k", 5)
							if err != nil || !d.Allowed {
								t.Fatal(d, err)
							}
							parked = append(parked, c)
						} else if d, _ := l.Allow(ctx, "k"); d.Allowed {
							want++
						}
						time.Sleep(time.Millisecond)
					}
					time.Sleep(gap)
					for _, c := range parked {
						if _, err := c.Settle(ctx, 0); err != nil {
							t.Fatal(err)
						}
					}
					if err := p.Close(ctx); err != nil {
						t.Error(err)
					}
					if used := counted(t, shared, "late", "k", rule); used != want {
						t.Errorf("%d charges of 5 settled at 0: counted %d; want %d", len(parked), used, want)
					}
				})
			})
		}
	}
}

// TestLeasesRefundInALaterWindow: charges taken from a lease in a key's second window,
// settled at no cost in that window once the lease ended: every one comes back, as on
// the store alone (refunded as of the lease's first loan, in the first window, they gave
// back nothing).
func TestLeasesRefundInALaterWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := localstore.New()
		p, err := hotkey.NewLeases(shared)
		if err != nil {
			t.Fatal(err)
		}
		rule := ratelimit.Rule{Limit: 1_000_000, Period: 10 * time.Second}
		l, _ := fixedwindow.New(p, rule, ratelimit.WithNamespace("windows"))
		ctx := context.Background()
		start := time.Now().Truncate(10 * time.Second)
		var admitted int64
		var parked []*ratelimit.Charge
		for i := 0; time.Since(start) < 12*time.Second; i++ {
			if time.Since(start) > 11*time.Second && i%10 == 0 {
				c, d, err := l.Charge(ctx, "k", 5)
				if err != nil || !d.Allowed {
					t.Fatal(d, err)
				}
				parked = append(parked, c)
			} else if d, _ := l.Allow(ctx, "k"); d.Allowed && time.Since(start) >= 10*time.Second {
				admitted++
			}
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(4 * time.Second) // the lease ends, and its record; still the second window
		for _, c := range parked {
			if _, err := c.Settle(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Close(ctx); err != nil {
			t.Error(err)
		}
		if used := counted(t, shared, "windows", "k", rule); used != admitted {
			t.Errorf("the second window counts %d; want the %d admitted in it, the %d charges given back", used, admitted, len(parked))
		}
	})
}

// TestLeasesResetAfterABurst: a burst of requests makes a key busy, and the key is reset
// at once, while its first loan waits to go out: the restored key stays full (the loan,
// sent after the reset, lent to an entry that had ended: 67 events lost until its record
// ended).
func TestLeasesResetAfterABurst(t *testing.T) {
	for _, n := range []int{5, 20, 50} {
		t.Run(fmt.Sprint(n, " requests"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				shared := localstore.New()
				p, err := hotkey.NewLeases(shared)
				if err != nil {
					t.Fatal(err)
				}
				rule := ratelimit.PerHour(1_000_000)
				l, _ := fixedwindow.New(p, rule, ratelimit.WithNamespace("burst"))
				ctx := context.Background()
				for range n {
					l.Allow(ctx, "k")
				}
				if err := l.Reset(ctx, "k"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * time.Second)
				if err := p.Close(ctx); err != nil {
					t.Error(err)
				}
				if used := counted(t, shared, "burst", "k", rule); used != 0 {
					t.Errorf("after the reset: the key counts %d; want it full", used)
				}
			})
		})
	}
}
