package hotkey_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// The fleet tests run instances as a gateway's are run: each with a client of its own,
// the fallback store over Redis, and Leases over that, on one real Redis; their callers
// run at once, in tight loops, as an attacker's would.

// fleet is n instances on one Redis.
type fleet struct {
	t      *testing.T
	srv    *redistest.Server
	direct *redisstore.Store // Redis itself, for what a key has left
	leases []*hotkey.Leases
	shares atomic.Int64 // decisions the fallback's shares made: Redis answered late
}

func newFleet(t *testing.T, n int, opts ...hotkey.LeasesOption) *fleet {
	t.Helper()
	srv := redistest.Start(t)
	f := &fleet{t: t, srv: srv, direct: redisstore.New(srv.Client())}
	for range n {
		c := redis.NewClient(redisstore.Recommended(&redis.Options{Addr: srv.Addr}))
		t.Cleanup(func() { c.Close() })
		rs := redisstore.New(c)
		if err := rs.LoadScripts(context.Background()); err != nil { // as a gateway does before it serves
			t.Fatal(err)
		}
		store := fallback.New(rs, localstore.New(), fallback.WithInstances(n), fallback.WithHooks(fallback.Hooks{
			OnDecision: func(source fallback.Source, _ time.Duration) {
				if source != fallback.Primary {
					f.shares.Add(1)
				}
			},
		}))
		p, err := hotkey.NewLeases(store, append([]hotkey.LeasesOption{hotkey.WithInstanceCount(func() int { return n })}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		f.leases = append(f.leases, p)
	}
	return f
}

// newLimiter is an algorithm's constructor.
type newLimiter func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (*ratelimit.AlgorithmLimiter, error)

// limiters are one limiter of rule per instance, made by make, in namespace ns.
func (f *fleet) limiters(make newLimiter, rule ratelimit.Rule, ns string) []*ratelimit.AlgorithmLimiter {
	f.t.Helper()
	var ls []*ratelimit.AlgorithmLimiter
	for _, p := range f.leases {
		l, err := make(p, rule, ratelimit.WithNamespace(ns))
		if err != nil {
			f.t.Fatal(err)
		}
		ls = append(ls, l)
	}
	return ls
}

// close closes every instance: what they queued is charged, what they hold given back.
// A Close that reports a failed give-back is logged, not fatal: the fallback refuses a
// give-back while its breaker is open (under -race decisions miss its 5ms, and it opens),
// and what that lease held ends with its record; the tests' counts on Redis say what
// was lost, within their bounds.
func (f *fleet) close() {
	f.t.Helper()
	for _, p := range f.leases {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := p.Close(ctx); err != nil {
			f.t.Logf("Close: %v", err)
		}
		cancel()
	}
}

// left is what key has left on Redis, of a limiter made by make under rule in
// namespace ns: a peek's Remaining, plus the one it would take.
func (f *fleet) left(make newLimiter, rule ratelimit.Rule, ns, key string) int64 {
	f.t.Helper()
	direct, err := make(f.direct, rule, ratelimit.WithNamespace(ns))
	if err != nil {
		f.t.Fatal(err)
	}
	d, err := direct.PeekN(context.Background(), key, 1)
	if err != nil {
		f.t.Fatal(err)
	}
	if !d.Allowed {
		return 0
	}
	return d.Remaining + 1
}

// hammer runs callers goroutines on each limiter, each asking key in a tight loop until
// d has passed, and returns how many were admitted.
func hammer(ls []*ratelimit.AlgorithmLimiter, key string, callers int, d time.Duration) int64 {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for _, l := range ls {
		for range callers {
			wg.Go(func() {
				for time.Now().Before(stop) {
					if dd, err := l.Allow(context.Background(), key); err == nil && dd.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return admitted.Load()
}

// trusted is the most events the instances may admit beyond a key's rule together: one
// each, on trust (the default of hotkey.WithTrust).
func trusted(n int) int64 { return int64(n) }

// beyond is the most a key may be admitted beyond its rule so far: an event on trust per
// instance, and what the fallback's shares decided (each may admit what Redis, late,
// counted as spent: a loaded machine's Redis answers past the fallback's 5ms).
func (f *fleet) beyond() int64 {
	return trusted(len(f.leases)) + f.shares.Load()
}

// TestFleetTightLoops: four instances, each with four callers in a tight loop on one key
// of 1,000 an hour (a fixed window, and a token bucket of burst 1,000), and on 20 keys: no
// key is admitted more than its rule, plus an event on trust per instance; and nothing
// is lost: the key's 1,000 are all admitted.
func TestFleetTightLoops(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances for seconds")
	}
	f := newFleet(t, 4)
	rule := ratelimit.PerHour(1000)
	for _, c := range []struct {
		name string
		make newLimiter
	}{{"fixedwindow", fixedwindow.New}, {"tokenbucket", tokenbucket.New}} {
		ls := f.limiters(c.make, rule, "tight-"+c.name)
		got := hammer(ls, "k", 4, 1500*time.Millisecond)
		if got > rule.Limit+f.beyond() || got < rule.Limit*97/100 {
			t.Errorf("%s: four instances in tight loops on a key of %v: %d admitted; want %d, and at most %d beyond it", c.name, rule, got, rule.Limit, f.beyond())
		}
	}
	ls := f.limiters(fixedwindow.New, rule, "tight-keys")
	var wg sync.WaitGroup
	got := make([]int64, 20)
	for k := range got {
		wg.Go(func() { got[k] = hammer(ls, fmt.Sprintf("key-%d", k), 1, time.Second) })
	}
	wg.Wait()
	for k, n := range got {
		if n > rule.Limit+f.beyond() {
			t.Errorf("key-%d of 20, four instances in tight loops: %d admitted; want %d at most, and %d beyond it", k, n, rule.Limit, f.beyond())
		}
	}
}

// TestFleetReset: two instances drain a day's bucket of 2,000 in tight loops, then one
// resets it: within a refill interval every instance admits again, together the 2,000
// the reset restored (give or take their events on trust), no more, and what they hold
// goes back at Close: nothing is lost.
func TestFleetReset(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances for seconds")
	}
	f := newFleet(t, 2)
	rule := ratelimit.PerDay(2000)
	ls := f.limiters(tokenbucket.New, rule, "reset")
	if got := hammer(ls, "k", 4, 1500*time.Millisecond); got > rule.Limit+f.beyond() {
		t.Fatalf("before the reset: %d admitted; want %d at most", got, rule.Limit+f.beyond())
	}
	carry := f.leases[1].Held("k") // the other instance's, taken before the reset: spent until its next refill
	if err := ls[0].Reset(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	after := hammer(ls, "k", 4, 2*time.Second)
	f.close()
	left := f.left(tokenbucket.New, rule, "reset", "k")
	if after > rule.Limit+f.beyond()+carry || after < rule.Limit*96/100 {
		t.Errorf("after a reset: %d admitted in 2s, %d left on Redis; want the %d it restored, within %d and the %d held then", after, left, rule.Limit, f.beyond(), carry)
	}
	// the charges of events admitted before the reset (on trust, or on the fallback's
	// shares) may land after it, and take from what it restored
	if after+left < rule.Limit-f.beyond() {
		t.Errorf("after a reset and Close: %d admitted and %d left on Redis; want %d together, within %d: events lost", after, left, rule.Limit, f.beyond())
	}
}

// TestFleetHotKey: a key of 5,000 a day turns hot at once on four instances, asked
// 20,000 times a second for 0.4s (open loop, each request on a goroutine of its own at
// its instant): the instances admit what the exact path would (its 5,000, give or take
// their events on trust), and after Close what they admitted and what Redis has left make
// the 5,000: nothing stranded on loan (less, at most, one event per decision the
// fallback's shares made while Redis was late).
func TestFleetHotKey(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances for seconds")
	}
	f := newFleet(t, 4)
	rule := ratelimit.PerDay(5000)
	ls := f.limiters(fixedwindow.New, rule, "hot")
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 8000 {
		time.Sleep(time.Until(start.Add(time.Duration(i) * 50 * time.Microsecond)))
		wg.Go(func() {
			if d, err := ls[i%4].Allow(context.Background(), "k"); err == nil && d.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	f.close()
	got, left := admitted.Load(), f.left(fixedwindow.New, rule, "hot", "k")
	least := rule.Limit * 90 / 100
	if redistest.RaceEnabled { // the detector slows the instances past the asks: what they hold goes back at Close
		least = rule.Limit / 2
	}
	if got > rule.Limit+f.beyond() || got < least {
		t.Errorf("8,000 asks in 0.4s of a key of 5,000 a day on four instances: %d admitted; want 5,000 (at least %d), and at most %d beyond", got, least, f.beyond())
	}
	// a take a share decided, which Redis counted too late to reconcile, stays counted
	// there (see TestFleetRefunds)
	if shares := f.shares.Load(); got+left < rule.Limit-shares {
		t.Errorf("after Close: %d admitted, %d left on Redis: %d stranded, beyond the %d decisions of the shares", got, left, rule.Limit-got-left, shares)
	}
}

// TestFleetRefunds: four instances take a key's events with Charges in tight loops,
// settling each at no cost: every one comes back, wherever it was taken (a lease, the
// exact path, on trust), and after Close the key has all it had, but for what the
// fallback's shares decided while Redis was late (see below).
func TestFleetRefunds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances for seconds")
	}
	f := newFleet(t, 4)
	rule := ratelimit.PerHour(1000)
	ls := f.limiters(fixedwindow.New, rule, "refunds")
	var wg sync.WaitGroup
	var charged, failed atomic.Int64
	stop := time.Now().Add(time.Second)
	for _, l := range ls {
		for range 4 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					c, d, err := l.Charge(context.Background(), "k", 1)
					if err != nil || !d.Allowed {
						continue
					}
					charged.Add(1)
					if _, err := c.Settle(context.Background(), 0); err != nil {
						failed.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	f.close()
	// A take the fallback decided on a share while Redis counted it too late to reconcile
	// (past a second, or failed after it was sent) stays counted on Redis: its refund goes
	// to the share. So each share decision may keep one event of the key; none else may.
	left, shares := f.left(fixedwindow.New, rule, "refunds", "k"), f.shares.Load()
	if left > rule.Limit || left < rule.Limit-shares || failed.Load() != 0 {
		t.Errorf("%d charges settled at no cost (%d failed, %d decided on the shares): %d left of %d after Close; want all, less at most the shares' decisions",
			charged.Load(), failed.Load(), shares, left, rule.Limit)
	}
}

// TestFleetDenialTellsTheRule: a denial from a lease's memory says the rule's Limit, and
// the time until the key is full. The window is a day's: a minute's ended between the
// hammer and the last request in one run of a hundred.
func TestFleetDenialTellsTheRule(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances for seconds")
	}
	f := newFleet(t, 2)
	rule := ratelimit.PerDay(100)
	ls := f.limiters(fixedwindow.New, rule, "denial")
	hammer(ls, "k", 2, 500*time.Millisecond)
	d, err := ls[0].Allow(context.Background(), "k")
	if err != nil || d.Allowed || d.Limit != 100 || d.RetryAfter <= 0 || d.ResetAfter < d.RetryAfter || d.ResetAfter > 24*time.Hour {
		t.Errorf("a denial of a key spent: %+v, %v; want the rule's Limit of 100, and the time to the window's end", d, err)
	}
}

// TestFleetResetReachesEveryInstance: four instances drain a day's key of 2,000, and keep
// asking it, each a request every 2ms (denied from memory); one resets it twice, just
// after another instance's refill answered (its lease dry, the key at its rule): every
// instance admits again within a refill interval (1s; 750ms in runs, and 1.25s allowed
// on a loaded machine, without RATELIMIT_EXACT_TIMING), and no one instance takes the
// restored key whole (it was lent all to the first to ask, and the others admitted
// nothing for seconds).
func TestFleetResetReachesEveryInstance(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances for seconds")
	}
	const n = 4
	f := newFleet(t, n)
	rule := ratelimit.PerDay(2000)
	ls := f.limiters(fixedwindow.New, rule, "reach")
	hammer(ls, "k", 4, 1200*time.Millisecond)
	var mark atomic.Int64
	first := make([]atomic.Int64, n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() {
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if d, err := l.Allow(context.Background(), "k"); err == nil && d.Allowed && mark.Load() != 0 {
					first[i].CompareAndSwap(0, time.Now().UnixNano())
				}
			}
		})
	}
	poll := time.NewTicker(100 * time.Microsecond)
	defer poll.Stop()
	refills := f.leases[1].Stats().Refills
	for deadline := time.Now().Add(5 * time.Second); f.leases[1].Stats().Refills == refills && time.Now().Before(deadline); {
		<-poll.C
	}
	for range 2 {
		if err := ls[0].Reset(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
	}
	mark.Store(time.Now().UnixNano())
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		all := true
		for i := range first {
			all = all && first[i].Load() != 0
		}
		if all {
			break
		}
		<-poll.C
	}
	close(stop)
	wg.Wait()
	within := 1250 * time.Millisecond // a loaded machine's timers fire late
	if redistest.ExactTiming() {
		within = time.Second
	}
	for i := range first {
		at := first[i].Load()
		if took := time.Duration(at - mark.Load()); at == 0 || took > within {
			t.Errorf("instance %d admitted again %v after the reset (0: not in 3s); want within a refill interval, %v here (%+v %p)", i, took, within, f.leases[i].Stats(), f.leases[i])
		}
	}
}
