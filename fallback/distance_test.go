package fallback_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// recommendedClient is a client with the options the package doc recommends.
func recommendedClient(addr string) *redis.Client {
	return redis.NewClient(redisstore.Recommended(&redis.Options{Addr: addr}))
}

// network is what a delaying proxy adds between the store and Redis.
type network struct {
	name          string
	delay, jitter time.Duration
	heldEvery     int64 // every heldEvery'th reply is held
	heldFor       time.Duration
	wantByRedis   float64 // the share of decisions Redis must make, where the machine is quiet
}

// traffic is how decisions arrive.
type traffic struct {
	name string
	run  func(seconds float64, decide func(key string)) // drives decide for that long
}

// together is 8 callers that fire at once, 25 times a second: 200 decisions a second.
var together = traffic{"8 callers together", func(seconds float64, decide func(string)) {
	const callers, every = 8, 40 * time.Millisecond
	next := time.Now()
	for range int(seconds * 25) {
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				<-gate
				decide(fmt.Sprint("tenant-", c))
			})
		}
		time.Sleep(time.Until(next)) // the load's pace, not a wait for an event
		close(gate)
		wg.Wait()
		next = next.Add(every)
	}
}}

// spread is 2,500 decisions a second over 100 keys, from 64 workers: each decision is
// due at its time, and one the pacer is late for goes at once, with the others it is
// late for.
var spread = traffic{"2,500/s over 100 keys", func(seconds float64, decide func(string)) {
	const workers, every = 64, 400 * time.Microsecond
	total := int(seconds * 2500)
	jobs := make(chan string, total)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for key := range jobs {
				decide(key)
			}
		})
	}
	start := time.Now()
	for i := range total {
		if wait := time.Until(start.Add(time.Duration(i) * every)); wait > 0 {
			time.Sleep(wait) // the load's pace, not a wait for an event
		}
		jobs <- fmt.Sprint("tenant-", rand.IntN(100))
	}
	close(jobs)
	wg.Wait()
}}

// TestRedisFarAway: with Redis behind a delaying proxy (1, 2.5 or 4ms away, 2.5ms with
// +-1.5ms of jitter, or 2.5ms with every 100th reply held 50ms), the default timeout and
// the package doc's client options, callers that fire together or a steady 2,500
// decisions a second have Redis decide nearly every decision: a reply that comes late
// is a live Redis, so the breaker stays closed, and the timeout follows the measured
// round trip. Redis accepts no more connections over a run than the client's pool holds.
//
// Each case is one run of 2 seconds, as it comes, after half a second of the same
// traffic that is not counted, as an application in service has had: the store has
// measured the round trip that its timeout follows. The share of decisions Redis makes is a
// measure of time, which other work on the machine takes from (go test runs packages side
// by side; the race detector slows every round trip several times over): the shares are
// held where the machine is quiet, with RATELIMIT_EXACT_TIMING=1 (.ci/run runs this test
// so, alone and without the race detector), and only logged elsewhere. Even there a
// moment of the machine's own (a collection, another process) makes a batch late, and
// one late batch of the 8 callers is 2% of a run: the bounds sit below what two such
// moments cost, and above what the faults they guard against cost (a timeout that does
// not follow the round trip, a breaker that opens on late replies: from a few percent to
// every decision on the shares). What does not depend on the machine's speed is held
// everywhere: no decision fails, and the connections stay within the pool.
func TestRedisFarAway(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 25s of paced traffic")
	}
	srv := redistest.Start(t)
	for _, n := range []network{
		{name: "1ms", delay: time.Millisecond, wantByRedis: 0.95},
		{name: "2.5ms", delay: 2500 * time.Microsecond, wantByRedis: 0.95},
		{name: "4ms", delay: 4 * time.Millisecond, wantByRedis: 0.90},
		{name: "2.5ms+-1.5ms", delay: 2500 * time.Microsecond, jitter: 1500 * time.Microsecond, wantByRedis: 0.93},
		{name: "2.5ms, 1 reply in 100 held 50ms", delay: 2500 * time.Microsecond, heldEvery: 100, heldFor: 50 * time.Millisecond, wantByRedis: 0.93},
	} {
		for _, tr := range []traffic{together, spread} {
			t.Run(n.name+", "+tr.name, func(t *testing.T) {
				r := farAwayRun(t, srv.Addr, n, tr)
				t.Logf("%s, %s: %.1f%% by Redis, p50 %v, p99 %v, %d connections, breaker opened %d times",
					n.name, tr.name, 100*r.byRedis, r.p50, r.p99, r.conns, r.opened)
				if r.conns > int64(r.pool) {
					t.Errorf("Redis accepted %d connections over the run; want at most the pool's %d", r.conns, r.pool)
				}
				if redistest.ExactTiming() {
					if r.byRedis < n.wantByRedis {
						t.Errorf("Redis decided %.1f%% of the decisions; want at least %.0f%%", 100*r.byRedis, 100*n.wantByRedis)
					}
					if r.opened > 0 {
						t.Errorf("the breaker opened %d times on a Redis that answers every call", r.opened)
					}
				}
			})
		}
	}
}

type farAway struct {
	byRedis  float64
	p50, p99 time.Duration
	conns    int64
	pool     int
	opened   int64
}

// farAwayRun is one run of TestRedisFarAway: traffic on a new client and store.
func farAwayRun(t *testing.T, addr string, n network, tr traffic) farAway {
	p := redistest.StartProxy(t, addr)
	client := recommendedClient(p.Addr)
	defer client.Close()
	in := newInstance(t, client, localstore.New(), ratelimit.PerSecond(1_000_000))
	p.SetDelay(n.delay)
	p.SetJitter(n.jitter)
	if err := in.redis.LoadScripts(context.Background(), tokenbucket.Algorithm()); err != nil {
		t.Fatal(err) // as an application warms its store before it serves
	}
	p.HoldEvery(n.heldEvery, n.heldFor)
	tr.run(0.5, func(key string) { in.limiter.Allow(context.Background(), key) })
	in.bySource[fallback.Primary].Store(0)
	in.bySource[fallback.Secondary].Store(0)
	var mu sync.Mutex
	var took []time.Duration
	tr.run(2, func(key string) {
		start := time.Now()
		d, err := in.limiter.Allow(context.Background(), key)
		elapsed := time.Since(start)
		if err != nil || !d.Allowed {
			t.Errorf("a decision: %+v, %v", d, err)
		}
		mu.Lock()
		took = append(took, elapsed)
		mu.Unlock()
	})
	slices.Sort(took)
	primary, secondary := in.bySource[fallback.Primary].Load(), in.bySource[fallback.Secondary].Load()
	return farAway{
		byRedis: float64(primary) / float64(primary+secondary),
		p50:     took[len(took)/2].Round(10 * time.Microsecond),
		p99:     took[len(took)*99/100].Round(10 * time.Microsecond),
		conns:   p.Accepted(),
		pool:    client.Options().PoolSize,
		opened:  in.opened.Load(),
	}
}

// TestBreakerClosesOnFarRedis: with Redis 2.5ms away, a Redis that stops answering opens
// the breaker, and once it answers again the breaker closes and Redis decides again:
// the late replies of the outage were read or dropped with their connections, and a
// probe on a warm connection answers within the timeout.
func TestBreakerClosesOnFarRedis(t *testing.T) {
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr)
	client := recommendedClient(p.Addr)
	t.Cleanup(func() { client.Close() })
	in := newInstance(t, client, localstore.New(), ratelimit.PerSecond(1_000_000))
	if err := in.redis.LoadScripts(context.Background(), tokenbucket.Algorithm()); err != nil {
		t.Fatal(err)
	}
	p.SetDelay(2500 * time.Microsecond)
	allow := func() {
		if d, err := in.limiter.Allow(context.Background(), "k"); err != nil || !d.Allowed {
			t.Fatalf("a decision: %+v, %v", d, err)
		}
	}
	srv.Pause()
	redistest.Eventually(t, "the breaker to open on a Redis that stopped", func() bool {
		allow()
		return in.store.BreakerState() != fallback.Closed
	})
	srv.Resume()
	redistest.Eventually(t, "the breaker to close on a Redis that answers again", func() bool {
		allow()
		return in.store.BreakerState() == fallback.Closed
	})
	before := in.bySource[fallback.Primary].Load()
	for range 200 {
		allow()
	}
	// a measure of time, held where the machine is quiet (see TestRedisFarAway): over 200
	// decisions one after the other, so that one slow moment of the machine (a few
	// decisions in a row past the timeout) does not decide it
	if by := in.bySource[fallback.Primary].Load() - before; redistest.ExactTiming() && by < 190 {
		t.Errorf("after the breaker closed, Redis decided %d of 200; want at least 95%%", by)
	}
}
