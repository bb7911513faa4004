package hotkey_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
)

// trustInstances are n instances over shared, each with a
// fixed window of rule, their Leases beside.
func trustInstances(t *testing.T, shared ratelimit.Store, n int, rule ratelimit.Rule) ([]*fixedwindow.Limiter, []*hotkey.Leases) {
	t.Helper()
	ls, ps := make([]*fixedwindow.Limiter, n), make([]*hotkey.Leases, n)
	for i := range ls {
		p, err := hotkey.NewLeases(shared, hotkey.WithInstanceCount(func() int { return n }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		ps[i] = p
		ls[i], _ = fixedwindow.New(p, rule, ratelimit.WithNamespace("api"))
	}
	return ls, ps
}

// TestTrustQuietKeys: the quiet keys (200 tenants, each
// asked once in 2s by one of four instances a round trip of 1ms away) are decided from
// memory, their first request on an instance too, and every admission is charged to the
// shared store: none waits, none is beyond the rule, and each key's count is exact.
func TestTrustQuietKeys(t *testing.T) {
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
			st.Local, st.Exact, st.Trusted, st.Short = st.Local+s.Local, st.Exact+s.Exact, st.Trusted+s.Trusted, st.Short+s.Short
		}
		if st.Exact != 0 || st.Local != 1000 || st.Trusted != 1000 || st.Short != 0 {
			t.Errorf("%+v: want 1000 decisions from memory, all admitted on trust, none beyond the rule", st)
		}
		for i := range 200 {
			key := fmt.Sprintf("tenant-%d", i)
			o, err := shared.Store.Apply(context.Background(), core.Request{Key: key, N: 1,
				Spec: &core.Spec{Algorithm: fixedwindow.Algorithm(), Namespace: "api", Rule: core.Rule(rule), Op: core.OpPeek}})
			if err != nil {
				t.Fatal(err)
			}
			if admitted[key] != 5 || o.Remaining+1 != 1000-5 {
				t.Fatalf("%s: admitted %d, %d left of 1000; want 5, each charged", key, admitted[key], o.Remaining+1)
			}
		}
	})
}

// TestTrustChargesTogether: the admissions made on trust
// ride few calls to the shared store (400 quiet tenants in 100ms over four instances: at
// most one call per 10 decisions), and Close charges those still queued: each key's count
// is exact once the instances are closed, and none was admitted beyond the rule.
func TestTrustChargesTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared, rule, ls, ps := quietCluster(t)
		admitQuiet(t, ls, nil)
		st := closeAll(t, ps)
		if calls := shared.calls.Load(); st.Trusted != 400 || st.Short != 0 || calls*10 > 400 {
			t.Errorf("%+v, %d calls to the shared store: want 400 admitted on trust, none beyond the rule, in 40 calls at most", st, calls)
		}
		for i := range 400 {
			if left := leftOf(t, shared, fmt.Sprintf("tenant-%d", i), rule); left != 999 {
				t.Fatalf("tenant-%d: %d left of 1000 after one admission; want 999 (charged by Close)", i, left)
			}
		}
	})
}

// quietCluster is four instances with leases (trust on) a round trip of 1ms from a shared
// store, deciding a fixed window of 1000 an hour in namespace "api".
func quietCluster(t *testing.T) (*remote, ratelimit.Rule, []*fixedwindow.Limiter, []*hotkey.Leases) {
	shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
	rule := ratelimit.PerHour(1000)
	ls, ps := trustInstances(t, shared, 4, rule)
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
		st.Local, st.Exact, st.Trusted, st.Short = st.Local+s.Local, st.Exact+s.Exact, st.Trusted+s.Trusted, st.Short+s.Short
	}
	return st
}

// leftOf is what key has left of rule, a fixed window in namespace "api", on the shared
// store: its Remaining after a take of one, plus one.
func leftOf(t *testing.T, shared *remote, key string, rule ratelimit.Rule) int64 {
	t.Helper()
	o, err := shared.Store.Apply(context.Background(), core.Request{Key: key, N: 1,
		Spec: &core.Spec{Algorithm: fixedwindow.Algorithm(), Namespace: "api", Rule: core.Rule(rule), Op: core.OpPeek}})
	if err != nil {
		t.Fatal(err)
	}
	return o.Remaining + 1
}

// TestTrustDebits: the costs of quiet tenants' answers
// (400 tenants, each admitted once by one of four instances and debited 19 events 20ms
// later, as Middleware.Cost charges an answer that cost more than its estimate) ride the
// calls of the charges made on trust, and each key is charged exactly after Close. A debit
// this instance knows would leave the key nothing takes the exact path, and its answer
// (the key in debt) denies the instance's next admissions from memory; a debit made
// ahead comes off the instance's share at once, so that the admissions after it wait for
// the next answer instead of spending what the debit took.
func TestTrustDebits(t *testing.T) {
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
		if calls := shared.calls.Load(); st.Trusted != 400 || st.Exact != 0 || st.Short != 0 || calls*10 > 400 {
			t.Errorf("%+v, %d calls to the shared store: want 400 admitted on trust, none exact or beyond the rule, in 40 calls at most (with the 400 debits)", st, calls)
		}
		for i := range 400 {
			if left := leftOf(t, shared, fmt.Sprintf("tenant-%d", i), rule); left != 980 {
				t.Fatalf("tenant-%d: %d left of 1000 after an admission and a debit of 19; want 980 (charged by Close)", i, left)
			}
		}

		l, p := trustInstances(t, shared, 4, rule)
		for _, key := range []string{"share", "debt"} {
			if d, _ := l[0].Allow(ctx, key); !d.Allowed {
				t.Fatalf("%s: a first admission: %+v", key, d)
			}
		}
		time.Sleep(100 * time.Millisecond) // charged: the instance knows 999 are left, 249 of them its share
		if d, _ := l[0].Debit(ctx, "share", 300); !d.Allowed || d.Remaining != 698 {
			t.Errorf("a debit of 300 of the 999 left: %+v; want allowed, 698 left", d)
		}
		trusted := p[0].Stats().Trusted
		if d, _ := l[0].Allow(ctx, "share"); !d.Allowed || d.Remaining != 698 || p[0].Stats().Trusted != trusted+1 {
			t.Errorf("the admission after it: %+v, %d on trust; want admitted on trust, 698 left as far as the instance knows", d, p[0].Stats().Trusted-trusted)
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

// TestTrustLeasesWhatPays: a key is leased when it asks
// an instance a quarter of its share of the rule or more (400 a second on four
// instances: 25 a second), measured over a quarter of a refill interval at least. Two
// requests of a quiet key a millisecond apart, every two seconds, lease nothing (they
// are decided ahead); a key asked 100 a second is leased within its first quarter
// second.
func TestTrustLeasesWhatPays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		ls, ps := trustInstances(t, shared, 4, ratelimit.PerSecond(400))
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
			if st := ps[0].Stats(); st.Leases != 0 || st.Local != st.Trusted {
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

func (f *failing) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if f.fail.Load() {
		return core.Outcome{}, errors.New("the shared store is away")
	}
	return f.remote.Apply(ctx, req)
}

func (f *failing) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	if f.fail.Load() {
		return nil, errors.New("the shared store is away")
	}
	return f.remote.Lend(ctx, loans)
}

// TestTrustUncharged: what was admitted on trust, or debited
// with those admissions, and could not be charged (the shared store failed the call) is
// counted in LeasesStats.Uncharged and said by Close's error, not lost silently: three
// admissions on trust and a debit of 19, 22 events, none of them counted by the shared
// store.
func TestTrustUncharged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &failing{remote: &remote{Store: localstore.New(), rtt: time.Millisecond}}
		rule := ratelimit.PerHour(1000)
		ls, ps := trustInstances(t, shared, 4, rule)
		ctx := context.Background()
		if d, err := ls[0].Allow(ctx, "known"); err != nil || !d.Allowed {
			t.Fatalf("known: %+v, %v", d, err)
		}
		time.Sleep(100 * time.Millisecond) // charged: the key is known
		shared.fail.Store(true)
		for _, key := range []string{"a", "b", "c"} {
			if d, err := ls[0].Allow(ctx, key); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v, %v; want admitted on trust, on trust", key, d, err)
			}
		}
		if d, err := ls[0].Debit(ctx, "known", 19); err != nil || !d.Allowed {
			t.Fatalf("a debit of 19: %+v, %v; want charged with the admissions", d, err)
		}
		if err := ps[0].Close(ctx); !errors.Is(err, ratelimit.ErrUnavailable) || !strings.Contains(err.Error(), "the charges of 22 events failed") {
			t.Errorf("Close: %v; want the 22 events whose charges failed, ErrUnavailable", err)
		}
		st := closeAll(t, ps[1:])
		st.Trusted += ps[0].Stats().Trusted
		if got := ps[0].Stats().Uncharged; got != 22 || st.Trusted != 4 {
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

// TestTrustSeveralLimits: a request under two limits (a rate and a small quota, as
// Middleware.Policies makes) of quiet tenants is decided from memory, all or none: 100
// tenants, each asked 12 times over 24s by one of four instances in turn, against a
// quota of 8 an hour. Most decisions are made in memory (the quota's last events, fewer
// than one per instance, take the exact path), what the quota denied took nothing from
// the rate, and beyond its 8 the quota admitted at most one event per instance, each
// counted in LeasesStats.Short.
func TestTrustSeveralLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := &remote{Store: localstore.New(), rtt: time.Millisecond}
		rate, quota := ratelimit.PerHour(1000), ratelimit.PerHour(8)
		type inst struct {
			p           *hotkey.Leases
			rate, quota *ratelimit.AlgorithmLimiter
		}
		ins := make([]inst, 4)
		for i := range ins {
			p, err := hotkey.NewLeases(shared, hotkey.WithInstanceCount(func() int { return 4 }))
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
			st.Local, st.Exact, st.Trusted, st.Short = st.Local+s.Local, st.Exact+s.Exact, st.Trusted+s.Trusted, st.Short+s.Short
		}
		t.Logf("%+v", st)
		if st.Local < 2*1200*7/10 { // the quota's last events, below one per instance, on the exact path
			t.Errorf("%+v: want 7 in 10 of the 2,400 limits decided from memory at least", st)
		}
		peek := func(ns, key string, rule ratelimit.Rule) int64 {
			o, err := shared.Store.Apply(context.Background(), core.Request{Key: key, N: 1,
				Spec: &core.Spec{Algorithm: fixedwindow.Algorithm(), Namespace: ns, Rule: core.Rule(rule), Op: core.OpPeek}})
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
		if over > st.Short || over > 4*100 {
			t.Errorf("the quota of 8 admitted %d more over the 100 tenants, LeasesStats.Short %d; want one per instance and tenant at most, each counted", over, st.Short)
		}
	})
}

// TestTrustBound: a key of 40 an hour asked by four
// instances every quarter of a millisecond, a round trip of 5ms away: each instance
// admits at most one event ahead of Redis's answer at a time, so the cluster admits at
// most one event per instance beyond the rule in the round trip the key runs out, and
// LeasesStats.Short counts them; a rule smaller than the instances (5 a minute on 20)
// keeps the exact path and never admits more.
func TestTrustBound(t *testing.T) {
	for _, tc := range []struct {
		rule      ratelimit.Rule
		instances int
	}{{ratelimit.PerHour(40), 4}, {ratelimit.PerMinute(5), 20}} {
		synctest.Test(t, func(t *testing.T) {
			shared := &remote{Store: localstore.New(), rtt: 5 * time.Millisecond}
			ls, ps := trustInstances(t, shared, tc.instances, tc.rule)
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
			var owed, trusted int64
			for _, p := range ps {
				owed, trusted = owed+p.Stats().Short, trusted+p.Stats().Trusted
			}
			got, limit := admitted.Load(), tc.rule.Limit
			t.Logf("%v on %d instances: admitted %d, %d on trust, %d of them owed", tc.rule, tc.instances, got, trusted, owed)
			switch {
			case limit < int64(tc.instances) && (got > limit || trusted != 0):
				t.Errorf("%v on %d instances: admitted %d (%d on trust); want the rule's %d at most, none on trust", tc.rule, tc.instances, got, trusted, limit)
			case got > limit+int64(tc.instances) || got-owed > limit:
				t.Errorf("%v on %d instances: admitted %d, %d of them owed; want %d at most, and one per instance beyond it at most", tc.rule, tc.instances, got, owed, limit)
			}
		})
	}
}

// TestTrustRefund: a take admitted on trust with a receipt (a
// Charge, as the Middleware makes) and settled at nothing gives its events back once its
// charge has landed: what the key has left and what the leases hold are the rule less
// the one event kept, none lost and none created.
func TestTrustRefund(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared, rule, ls, ps := quietCluster(t)
		ctx := context.Background()
		if d, err := ls[0].Allow(ctx, "tenant"); err != nil || !d.Allowed { // one event on trust: the key is heard of
			t.Fatalf("Allow: %+v, %v", d, err)
		}
		time.Sleep(100 * time.Millisecond) // its charge goes out and lands
		c, d, err := ls[0].Charge(ctx, "tenant", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("Charge(1): %+v, %v", d, err)
		}
		if st := ps[0].Stats(); st.Trusted != 2 || st.Exact != 0 {
			t.Fatalf("%+v: want both takes admitted on trust", st)
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
			t.Errorf("%d left and %d held by leases after a take of 1 and a take of 1 settled at 0; want 999", left, held)
		}
	})
}
