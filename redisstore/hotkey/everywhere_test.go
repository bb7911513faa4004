package hotkey_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// remote is a shared store a round trip away (rtt of the bubble's fake time per call),
// that counts its calls: what a Redis would see.
type remote struct {
	*localstore.Store
	rtt   time.Duration
	calls atomic.Int64
}

func (r *remote) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	r.calls.Add(1)
	time.Sleep(r.rtt)
	return r.Store.Apply(ctx, req)
}

func (r *remote) ApplyAll(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Outcome, error) {
	r.calls.Add(1)
	time.Sleep(r.rtt)
	return r.Store.ApplyAll(ctx, reqs)
}

func (r *remote) Lend(ctx context.Context, loans []ratelimit.Loan) ([]ratelimit.Lent, error) {
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

// TestLeasesRuleChange: four instances deciding a key leased under 1000 a second (bursts
// of 2000), asked 4000 a second, all move to 100 a second (bursts of 200) at once: from
// then on they admit no more than the new rule's burst and its rate over the time since
// the change, but for 1% of its 10s allowance, and keep deciding from memory.
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
		if admitted < 500 {
			t.Errorf("admitted %d in the 4s after the change; want the new rule's 600, but for what the leases start with", admitted)
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
			rate, quota ratelimit.Limiter
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
		peek := func(alg *ratelimit.Algorithm, ns, key string, rule ratelimit.Rule) int64 {
			o, err := shared.Store.Apply(ctx, ratelimit.Request{Key: key, N: 1, Spec: &ratelimit.Spec{Algorithm: alg, Namespace: ns, Rule: rule, Op: "peek"}})
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

// optimisticInstances are n instances with WithOptimistic over shared, each with a
// fixed window of rule, their Leases beside.
func optimisticInstances(t *testing.T, shared ratelimit.Store, n int, rule ratelimit.Rule) ([]*fixedwindow.Limiter, []*hotkey.Leases) {
	t.Helper()
	ls, ps := make([]*fixedwindow.Limiter, n), make([]*hotkey.Leases, n)
	for i := range ls {
		p, err := hotkey.NewLeases(shared, hotkey.WithInstanceCount(func() int { return n }), hotkey.WithOptimistic())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		ps[i] = p
		ls[i], _ = fixedwindow.New(p, rule, ratelimit.WithNamespace("api"))
	}
	return ls, ps
}

// TestLeasesOptimisticQuietKeys: with WithOptimistic, the quiet keys (200 tenants, each
// asked once in 2s by one of four instances a round trip of 1ms away) are decided from
// memory, their first request on an instance too, and every admission is charged to the
// shared store: none waits, none is beyond the rule, and each key's count is exact.
func TestLeasesOptimisticQuietKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared, rule, ls, ps := quietCluster(t)
		admitted := map[string]int64{}
		start := time.Now()
		for i := range 1000 { // 100 a second for 10s
			time.Sleep(time.Until(start.Add(time.Duration(i) * 10 * time.Millisecond)))
			key := fmt.Sprintf("tenant-%d", i%200)
			before := time.Now()
			d, err := ls[(i/200+i)%4].Allow(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(before); took != 0 {
				t.Fatalf("request %d waited %v", i, took)
			}
			if d.Allowed {
				admitted[key]++
			}
		}
		time.Sleep(100 * time.Millisecond) // the charges in the background go out (a thirty-second of the refill interval) and land
		var st hotkey.LeasesStats
		for _, p := range ps {
			s := p.Stats()
			st.Local, st.Exact, st.Ahead, st.Excess = st.Local+s.Local, st.Exact+s.Exact, st.Ahead+s.Ahead, st.Excess+s.Excess
		}
		if st.Exact != 0 || st.Local != 1000 || st.Ahead != 1000 || st.Excess != 0 {
			t.Errorf("%+v: want 1000 decisions from memory, all admitted ahead, none beyond the rule", st)
		}
		for i := range 200 {
			key := fmt.Sprintf("tenant-%d", i)
			o, err := shared.Store.Apply(context.Background(), ratelimit.Request{Key: key, N: 1,
				Spec: &ratelimit.Spec{Algorithm: fixedwindow.Algorithm(), Namespace: "api", Rule: rule, Op: "peek"}})
			if err != nil {
				t.Fatal(err)
			}
			if admitted[key] != 5 || o.Remaining+1 != 1000-5 {
				t.Fatalf("%s: admitted %d, %d left of 1000; want 5, each charged", key, admitted[key], o.Remaining+1)
			}
		}
	})
}

// TestLeasesOptimisticChargesTogether: with WithOptimistic, the admissions made ahead
// ride few calls to the shared store (400 quiet tenants in 100ms over four instances: at
// most one call per 10 decisions), and Close charges those still queued: each key's count
// is exact once the instances are closed, and none was admitted beyond the rule.
func TestLeasesOptimisticChargesTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared, rule, ls, ps := quietCluster(t)
		admitQuiet(t, ls, nil)
		st := closeAll(t, ps)
		if calls := shared.calls.Load(); st.Ahead != 400 || st.Excess != 0 || calls*10 > 400 {
			t.Errorf("%+v, %d calls to the shared store: want 400 admitted ahead, none beyond the rule, in 40 calls at most", st, calls)
		}
		for i := range 400 {
			if left := leftOf(t, shared, fmt.Sprintf("tenant-%d", i), rule); left != 999 {
				t.Fatalf("tenant-%d: %d left of 1000 after one admission; want 999 (charged by Close)", i, left)
			}
		}
	})
}

// quietCluster is four instances with WithOptimistic a round trip of 1ms from a shared
// store, deciding a fixed window of 1000 an hour in namespace "api".
func quietCluster(t *testing.T) (*remote, ratelimit.Rule, []*fixedwindow.Limiter, []*hotkey.Leases) {
	shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
	rule := ratelimit.PerHour(1000)
	ls, ps := optimisticInstances(t, shared, 4, rule)
	return shared, rule, ls, ps
}

// admitQuiet admits each of 400 quiet tenants once, a quarter of a millisecond apart, on
// the instances in turn, and calls then (unless nil) after each admission.
func admitQuiet(t *testing.T, ls []*fixedwindow.Limiter, then func(l *fixedwindow.Limiter, key string)) {
	t.Helper()
	start := time.Now()
	for i := range 400 {
		time.Sleep(time.Until(start.Add(time.Duration(i) * 250 * time.Microsecond)))
		l, key := ls[i%len(ls)], fmt.Sprintf("tenant-%d", i)
		if d, err := l.Allow(context.Background(), key); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", key, d, err)
		}
		if then != nil {
			then(l, key)
		}
	}
}

// closeAll closes the instances (what they queued charged, what they hold given back),
// and returns their stats added up.
func closeAll(t *testing.T, ps []*hotkey.Leases) hotkey.LeasesStats {
	t.Helper()
	var st hotkey.LeasesStats
	for _, p := range ps {
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		s := p.Stats()
		st.Local, st.Exact, st.Ahead, st.Excess = st.Local+s.Local, st.Exact+s.Exact, st.Ahead+s.Ahead, st.Excess+s.Excess
	}
	return st
}

// leftOf is what key has left of rule, a fixed window in namespace "api", on the shared
// store: its Remaining after a take of one, plus one.
func leftOf(t *testing.T, shared *remote, key string, rule ratelimit.Rule) int64 {
	t.Helper()
	o, err := shared.Store.Apply(context.Background(), ratelimit.Request{Key: key, N: 1,
		Spec: &ratelimit.Spec{Algorithm: fixedwindow.Algorithm(), Namespace: "api", Rule: rule, Op: "peek"}})
	if err != nil {
		t.Fatal(err)
	}
	return o.Remaining + 1
}

// TestLeasesOptimisticDebits: with WithOptimistic, the costs of quiet tenants' answers
// (400 tenants, each admitted once by one of four instances and debited 19 events 20ms
// later, as Middleware.Cost charges an answer that cost more than its estimate) ride the
// calls of the charges made ahead, and each key is charged exactly after Close. A debit
// this instance knows would leave the key nothing takes the exact path, and its answer
// (the key in debt) denies the instance's next admissions from memory; a debit made
// ahead comes off the instance's share at once, so that the admissions after it wait for
// the next answer instead of spending what the debit took.
func TestLeasesOptimisticDebits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared, rule, ls, ps := quietCluster(t)
		ctx := context.Background()
		var debits sync.WaitGroup
		admitQuiet(t, ls, func(l *fixedwindow.Limiter, key string) {
			debits.Go(func() {
				time.Sleep(20 * time.Millisecond)
				if d, err := l.Debit(ctx, key, 19); err != nil || !d.Allowed || d.Remaining != 979 {
					t.Errorf("%s: a debit of 19 after one admission: %+v, %v; want allowed, 979 left", key, d, err)
				}
			})
		})
		debits.Wait()
		st := closeAll(t, ps)
		if calls := shared.calls.Load(); st.Ahead != 400 || st.Exact != 0 || st.Excess != 0 || calls*10 > 400 {
			t.Errorf("%+v, %d calls to the shared store: want 400 admitted ahead, none exact or beyond the rule, in 40 calls at most (with the 400 debits)", st, calls)
		}
		for i := range 400 {
			if left := leftOf(t, shared, fmt.Sprintf("tenant-%d", i), rule); left != 980 {
				t.Fatalf("tenant-%d: %d left of 1000 after an admission and a debit of 19; want 980 (charged by Close)", i, left)
			}
		}

		l, p := optimisticInstances(t, shared, 4, rule)
		for _, key := range []string{"share", "debt"} {
			if d, _ := l[0].Allow(ctx, key); !d.Allowed {
				t.Fatalf("%s: a first admission: %+v", key, d)
			}
		}
		time.Sleep(100 * time.Millisecond) // charged: the instance knows 999 are left, 249 of them its share
		if d, _ := l[0].Debit(ctx, "share", 300); !d.Allowed || d.Remaining != 698 {
			t.Errorf("a debit of 300 of the 999 left: %+v; want allowed, 698 left", d)
		}
		exact := p[0].Stats().Exact
		if d, _ := l[0].Allow(ctx, "share"); !d.Allowed || p[0].Stats().Exact != exact+1 {
			t.Errorf("the admission after it: %+v, %d exact; want admitted by the exact path, its share spent by the debit", d, p[0].Stats().Exact-exact)
		}
		if d, _ := l[0].Debit(ctx, "debt", 2000); d.Allowed || d.RetryAfter <= 0 {
			t.Errorf("a debit past what the key has: %+v; want the exact path's denial, in debt", d)
		}
		local := p[0].Stats().Local
		if d, _ := l[0].Allow(ctx, "debt"); d.Allowed || p[0].Stats().Local != local+1 {
			t.Errorf("an admission of the key in debt: %+v; want denied from memory", d)
		}
		closeAll(t, p)
		if left := leftOf(t, shared, "share", rule); left != 1000-1-300-1 {
			t.Errorf("after an admission, a debit of 300 and an admission: %d left; want %d", left, 1000-1-300-1)
		}
	})
}

// TestLeasesOptimisticLeasesWhatPays: with WithOptimistic, a key is leased when it asks
// an instance a quarter of its share of the rule or more (400 a second on four
// instances: 25 a second), measured over a quarter of a refill interval at least. Two
// requests of a quiet key a millisecond apart, every two seconds, lease nothing (they
// are decided ahead); a key asked 100 a second is leased within its first quarter
// second.
func TestLeasesOptimisticLeasesWhatPays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		ls, ps := optimisticInstances(t, shared, 4, ratelimit.PerSecond(400))
		ctx := context.Background()
		allow := func(key string) {
			t.Helper()
			if d, err := ls[0].Allow(ctx, key); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v, %v", key, d, err)
			}
		}
		for range 5 {
			allow("quiet")
			time.Sleep(time.Millisecond)
			allow("quiet")
			time.Sleep(2 * time.Second)
			if st := ps[0].Stats(); st.Leases != 0 || st.Local != st.Ahead {
				t.Fatalf("%+v: want no lease of a key asked twice every 2s, its requests decided ahead", st)
			}
		}
		start := time.Now()
		for i := range 25 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * 10 * time.Millisecond)))
			allow("busy")
		}
		if st := ps[0].Stats(); st.Leases != 1 {
			t.Errorf("%+v: want the key asked 100 a second leased in its first quarter second", st)
		}
	})
}

// failing is a shared store whose calls fail while fail is set, as a Redis that is away
// fails them without the fallback store.
type failing struct {
	*remote
	fail atomic.Bool
}

func (f *failing) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	if f.fail.Load() {
		return ratelimit.Outcome{}, errors.New("the shared store is away")
	}
	return f.remote.Apply(ctx, req)
}

func (f *failing) Lend(ctx context.Context, loans []ratelimit.Loan) ([]ratelimit.Lent, error) {
	if f.fail.Load() {
		return nil, errors.New("the shared store is away")
	}
	return f.remote.Lend(ctx, loans)
}

// TestLeasesOptimisticUncharged: with WithOptimistic, what was admitted ahead, or debited
// with those admissions, and could not be charged (the shared store failed the call) is
// counted in LeasesStats.Uncharged, not lost silently: three admissions on trust and a
// debit of 19, 22 events, none of them counted by the shared store.
func TestLeasesOptimisticUncharged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &failing{remote: &remote{Store: localstore.New(), rtt: time.Millisecond}}
		rule := ratelimit.PerHour(1000)
		ls, ps := optimisticInstances(t, shared, 4, rule)
		ctx := context.Background()
		if d, err := ls[0].Allow(ctx, "known"); err != nil || !d.Allowed {
			t.Fatalf("known: %+v, %v", d, err)
		}
		time.Sleep(100 * time.Millisecond) // charged: the key is known
		shared.fail.Store(true)
		for _, key := range []string{"a", "b", "c"} {
			if d, err := ls[0].Allow(ctx, key); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v, %v; want admitted ahead, on trust", key, d, err)
			}
		}
		if d, err := ls[0].Debit(ctx, "known", 19); err != nil || !d.Allowed {
			t.Fatalf("a debit of 19: %+v, %v; want charged with the admissions", d, err)
		}
		st := closeAll(t, ps)
		if got := ps[0].Stats().Uncharged; got != 22 || st.Ahead != 4 {
			t.Errorf("%+v, %d uncharged: want the 3 admissions and the debit of 19 that could not be charged, 22", st, got)
		}
		shared.fail.Store(false)
		for key, want := range map[string]int64{"a": 1000, "b": 1000, "c": 1000, "known": 999} {
			if left := leftOf(t, shared.remote, key, rule); left != want {
				t.Errorf("%s: %d left; want %d, the failed charges counted nowhere", key, left, want)
			}
		}
	})
}

// TestLeasesOptimisticSeveralLimits: with WithOptimistic, a request under two limits (a
// rate and a small quota, as Middleware.Policies makes) of quiet tenants is decided from
// memory, all or none: 100 tenants, each asked 12 times over 24s by one of four
// instances in turn, against a quota of 8 an hour. No decision takes the exact path, what
// the quota denied took nothing from the rate, and beyond its 8 the quota admitted at
// most one event per instance (the event on trust of a key it last heard of long ago),
// each counted in LeasesStats.Excess.
func TestLeasesOptimisticSeveralLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		rate, quota := ratelimit.PerHour(1000), ratelimit.PerHour(8)
		type inst struct {
			p           *hotkey.Leases
			rate, quota ratelimit.Limiter
		}
		ins := make([]inst, 4)
		for i := range ins {
			p, err := hotkey.NewLeases(shared, hotkey.WithInstanceCount(func() int { return 4 }), hotkey.WithOptimistic())
			if err != nil {
				t.Fatal(err)
			}
			ins[i].p = p
			ins[i].rate, _ = fixedwindow.New(p, rate, ratelimit.WithNamespace("rate"))
			ins[i].quota, _ = fixedwindow.New(p, quota, ratelimit.WithNamespace("quota"))
		}
		admitted := map[string]int64{}
		start := time.Now()
		for i := range 1200 { // 50 a second for 24s
			time.Sleep(time.Until(start.Add(time.Duration(i) * 20 * time.Millisecond)))
			key, in := fmt.Sprintf("tenant-%d", i%100), ins[(i/100+i)%4]
			d, err := ratelimit.AllowAll(context.Background(), 1, ratelimit.Part{Limiter: in.rate, Key: key}, ratelimit.Part{Limiter: in.quota, Key: key})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted[key]++
			}
		}
		var st hotkey.LeasesStats
		for _, in := range ins {
			if err := in.p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			s := in.p.Stats()
			st.Local, st.Exact, st.Ahead, st.Excess = st.Local+s.Local, st.Exact+s.Exact, st.Ahead+s.Ahead, st.Excess+s.Excess
		}
		t.Logf("%+v", st)
		if st.Local < 2*1200*9/10 {
			t.Errorf("%+v: want 9 in 10 of the 2,400 limits decided from memory at least", st)
		}
		peek := func(ns, key string, rule ratelimit.Rule) int64 {
			o, err := shared.Store.Apply(context.Background(), ratelimit.Request{Key: key, N: 1,
				Spec: &ratelimit.Spec{Algorithm: fixedwindow.Algorithm(), Namespace: ns, Rule: rule, Op: "peek"}})
			if err != nil {
				t.Fatal(err)
			}
			if !o.Allowed() {
				return 0
			}
			return o.Remaining + 1
		}
		over := int64(0)
		for i := range 100 {
			key := fmt.Sprintf("tenant-%d", i)
			if rateLeft := peek("rate", key, rate); rateLeft != 1000-admitted[key] {
				t.Fatalf("%s: admitted %d, the rate has %d left of 1000; want what the quota denied uncounted", key, admitted[key], rateLeft)
			}
			over += max(0, admitted[key]-8)
		}
		if over != st.Excess || over > 4*100 || st.Exact != 0 {
			t.Errorf("the quota of 8 admitted %d more over the 100 tenants, LeasesStats.Excess %d, %d on the exact path; want one per instance and tenant at most, each counted, none exact", over, st.Excess, st.Exact)
		}
	})
}

// TestLeasesOptimisticBound: with WithOptimistic, a key of 40 an hour asked by four
// instances every quarter of a millisecond, a round trip of 5ms away: each instance
// admits at most one event ahead of Redis's answer at a time, so the cluster admits at
// most one event per instance beyond the rule in the round trip the key runs out, and
// LeasesStats.Excess counts them; a rule smaller than the instances (5 a minute on 20)
// keeps the exact path and never admits more.
func TestLeasesOptimisticBound(t *testing.T) {
	for _, tc := range []struct {
		rule      ratelimit.Rule
		instances int
	}{{ratelimit.PerHour(40), 4}, {ratelimit.PerMinute(5), 20}} {
		synctest.Test(t, func(t *testing.T) {
			shared := &remote{Store: localstore.New(), rtt: 5 * time.Millisecond}
			ls, ps := optimisticInstances(t, shared, tc.instances, tc.rule)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for _, l := range ls {
				wg.Go(func() {
					for range 200 {
						d, err := l.Allow(context.Background(), "login")
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							admitted.Add(1)
						}
						time.Sleep(250 * time.Microsecond)
					}
				})
			}
			wg.Wait()
			time.Sleep(100 * time.Millisecond) // the last charges go out and land
			var excess, small int64
			for _, p := range ps {
				excess, small = excess+p.Stats().Excess, small+p.Stats().Small
			}
			got, limit := admitted.Load(), tc.rule.Limit
			t.Logf("%v on %d instances: admitted %d, excess %d, kept exact %d", tc.rule, tc.instances, got, excess, small)
			switch {
			case limit < int64(tc.instances) && (got > limit || small == 0):
				t.Errorf("%v on %d instances: admitted %d (%d kept exact); want the rule's %d at most, on the exact path", tc.rule, tc.instances, got, small, limit)
			case got > limit+int64(tc.instances) || got-excess > limit:
				t.Errorf("%v on %d instances: admitted %d, %d of them counted beyond the rule; want %d at most, and one per instance beyond it at most", tc.rule, tc.instances, got, excess, limit)
			}
		})
	}
}

// TestLeasesOptimisticRefund: with WithOptimistic, a take admitted ahead with a receipt (a
// Charge, as the Middleware makes) and settled at nothing gives its events back once its
// charge has landed: what the key has left and what the leases hold are the rule less
// the one event kept, none lost and none created.
func TestLeasesOptimisticRefund(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared, rule, ls, ps := quietCluster(t)
		ctx := context.Background()
		if d, err := ls[0].Allow(ctx, "tenant"); err != nil || !d.Allowed { // one event on trust: the key is heard of
			t.Fatalf("Allow: %+v, %v", d, err)
		}
		time.Sleep(100 * time.Millisecond) // its charge goes out and lands
		c, d, err := ls[0].Charge(ctx, "tenant", 5)
		if err != nil || !d.Allowed {
			t.Fatalf("Charge(5): %+v, %v", d, err)
		}
		if st := ps[0].Stats(); st.Ahead != 2 || st.Exact != 0 {
			t.Fatalf("%+v: want both takes admitted ahead", st)
		}
		if _, err := c.Settle(ctx, 0); err != nil { // before its charge has landed
			t.Fatal(err)
		}
		synctest.Wait() // a refill of the key, if one is under way, lands in a lease
		held := int64(0)
		for _, p := range ps {
			held += p.Held("tenant")
		}
		if left := leftOf(t, shared, "tenant", rule); left+held != 999 {
			t.Errorf("%d left and %d held by leases after a take of 1 and a take of 5 settled at 0; want 999", left, held)
		}
	})
}
