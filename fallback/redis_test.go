package fallback_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// instance is one application instance: a fail-open limiter on a shared Redis, counting
// its decisions by source.
type instance struct {
	limiter  ratelimit.Limiter
	store    *fallback.Store
	redis    *redisstore.Store
	bySource [2]atomic.Int64
	opened   atomic.Int64 // times the breaker opened
}

func newInstance(t *testing.T, client redis.Scripter, local ratelimit.Store, rule ratelimit.Rule, opts ...fallback.Option) *instance {
	in := &instance{}
	opts = append(opts, fallback.WithHooks(fallback.Hooks{
		OnDecision: func(src fallback.Source, _ time.Duration) { in.bySource[src].Add(1) },
		OnStateChange: func(_, to fallback.BreakerState) {
			if to == fallback.Open {
				in.opened.Add(1)
			}
		},
	}))
	in.redis = redisstore.New(client, redisstore.WithPrefix("fb"))
	in.store = fallback.New(in.redis, local, opts...)
	l, err := tokenbucket.New(in.store, rule)
	if err != nil {
		t.Fatal(err)
	}
	in.limiter = l
	return in
}

// slowest is a generous bound for "returns within the timeout": far under the client's
// own 3s read timeout, and far over any scheduling hiccup under the race detector.
const slowest = 500 * time.Millisecond

// TestRedisKilled: Redis dies mid-traffic; no call errors or hangs, and 4 instances each
// admit locally their quarter of the rule less what Redis admitted for them: 100 in all.
func TestRedisKilled(t *testing.T) {
	srv := redistest.Start(t)
	rule := ratelimit.PerHour(100)
	var instances []*instance
	for range 4 { // a timeout the healthy phase never reaches, even loading the script under
		// load; with Redis dead, a refused dial fails at once, so it is never waited
		client := srv.Client(func(o *redis.Options) { o.DialerRetries = 1 }) // as the package doc advises
		instances = append(instances, newInstance(t, client, localstore.New(), rule,
			fallback.WithInstances(4), fallback.WithTimeout(time.Second)))
	}
	ctx := context.Background()
	for _, in := range instances {
		for range 5 {
			if d, err := in.limiter.Allow(ctx, "k"); err != nil || !d.Allowed {
				t.Fatalf("Redis up: %+v, %v", d, err)
			}
		}
	}
	srv.Kill()
	for i, in := range instances {
		admitted := 0
		for range 50 {
			start := time.Now()
			d, err := in.limiter.Allow(ctx, "k")
			if took := time.Since(start); err != nil || took > slowest {
				t.Fatalf("instance %d, Redis down: %+v, %v after %v", i, d, err, took)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 20 || in.bySource[fallback.Primary].Load() != 5 || in.store.BreakerState() != fallback.Open {
			t.Errorf("instance %d admitted %d locally (want 25 - 5), %d from Redis (want 5), breaker %v",
				i, admitted, in.bySource[fallback.Primary].Load(), in.store.BreakerState())
		}
	}
}

// TestRedisHung: Redis stops answering (SIGSTOP) with connections open, and the client is
// left at go-redis's defaults (3s read timeout, context deadlines ignored): every call
// still returns within the timeout budget; after SIGCONT decisions go back to Redis.
func TestRedisHung(t *testing.T) {
	srv := redistest.Start(t)
	in := newInstance(t, srv.Client(), localstore.New(), ratelimit.PerHour(1000),
		fallback.WithTimeout(20*time.Millisecond), fallback.WithBreaker(fallback.Breaker{OpenFor: 100 * time.Millisecond}))
	ctx := context.Background()
	if _, err := in.limiter.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	for i := range 30 {
		start := time.Now()
		d, err := in.limiter.Allow(ctx, "k")
		if took := time.Since(start); err != nil || !d.Allowed || took > slowest {
			t.Fatalf("decision %d with Redis hung: %+v, %v after %v", i, d, err, took)
		}
	}
	if in.store.BreakerState() == fallback.Closed {
		t.Errorf("the breaker is closed with Redis hung")
	}
	srv.Resume()
	waitForPrimary(t, in)
}

// waitForPrimary polls until a decision comes from the primary again.
func waitForPrimary(t *testing.T, in *instance) {
	t.Helper()
	deadline := time.Now().Add(redistest.StartupTimeout)
	for before := in.bySource[fallback.Primary].Load(); in.bySource[fallback.Primary].Load() == before; {
		if _, err := in.limiter.Allow(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision from Redis again; breaker %v", in.store.BreakerState())
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// TestRedisRestarted: decisions return to Redis once it is back on the same port, and
// nothing decided locally meanwhile is replayed into it.
func TestRedisRestarted(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(func(o *redis.Options) { o.DialerRetries = 1 }) // as the package doc advises
	in := newInstance(t, client, localstore.New(), ratelimit.PerHour(1000),
		fallback.WithBreaker(fallback.Breaker{OpenFor: 100 * time.Millisecond}))
	ctx := context.Background()
	if _, err := in.limiter.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for range 20 {
		if d, err := in.limiter.Allow(ctx, "outage-only"); err != nil || !d.Allowed {
			t.Fatalf("Redis down: %+v, %v", d, err)
		}
	}
	srv.Restart()
	waitForPrimary(t, in)
	if keys := client.Keys(ctx, "fb:*outage-only*").Val(); len(keys) != 0 {
		t.Errorf("a key used only during the outage is in Redis: local decisions were replayed")
	}
}

// TestOutageClusterWide: while Redis is down, 4 instances at twice their share for 2
// seconds admit, summed, what the whole rule allows in that time.
func TestOutageClusterWide(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	clk := clock.NewFake(limitertest.Start) // the instances' local clocks
	rule := ratelimit.PerSecond(40)         // a share of 10 per second each
	var instances []*instance
	for range 4 {
		instances = append(instances, newInstance(t, srv.Client(), localstore.New(localstore.WithClock(clk)), rule,
			fallback.WithInstances(4)))
	}
	admitted := 0
	for step := 0; step <= 40; step++ { // every 50ms for 2s, each instance sends one: 20/s
		for _, in := range instances {
			d, err := in.limiter.Allow(context.Background(), "k")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		clk.Advance(50 * time.Millisecond)
	}
	allowed := 40 + 40*2 // the burst, and 2 seconds at 40 per second
	if admitted < allowed*97/100 || admitted > allowed*103/100 {
		t.Errorf("4 instances admitted %d; the rule allows %d", admitted, allowed)
	}
}

// TestCancelledCallersNeverTrip: callers that give up before the timeout, with Redis hung,
// leave the breaker closed.
func TestCancelledCallersNeverTrip(t *testing.T) {
	srv := redistest.Start(t)
	in := newInstance(t, srv.Client(), localstore.New(), ratelimit.PerHour(1000),
		fallback.WithTimeout(200*time.Millisecond))
	if _, err := in.limiter.Allow(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		_, err := in.limiter.Allow(ctx, "k")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a caller that gave up: %v", err)
		}
	}
	if in.store.BreakerState() != fallback.Closed {
		t.Errorf("callers giving up opened the breaker: %v", in.store.BreakerState())
	}
}

// TestInFlightAfterStall: an in-flight limit of 1 through a fallback on Redis, taken and
// released as a route's requests do while Redis stops for 2 seconds (SIGSTOP): the
// acquires sent before the breaker opened run when Redis resumes, and nobody will
// release their leases (the callers decided on their shares long ago). They are
// released as soon as Redis answers again, so the limit admits on Redis again once the
// breaker's next probe finds it back (within its OpenFor, a second), not once the
// leases expire 30 seconds later.
func TestInFlightAfterStall(t *testing.T) {
	srv := redistest.Start(t)
	client := recommendedClient(srv.Addr)
	t.Cleanup(func() { client.Close() })
	in := newInstance(t, client, localstore.New(), ratelimit.PerSecond(1_000_000))
	limit, err := ratelimit.NewInFlight(in.store, 1, 30*time.Second, ratelimit.WithNamespace("stall"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	request := func() (admitted, byRedis bool) {
		before := in.bySource[fallback.Primary].Load()
		lease, d, err := limit.Acquire(ctx, "route")
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			lease.Release(ctx)
		}
		return d.Allowed, in.bySource[fallback.Primary].Load() > before
	}
	if err := in.redis.LoadScripts(ctx, concurrency.Algorithm()); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, "an acquire admitted by Redis", func() bool {
		ok, byRedis := request()
		return ok && byRedis
	})
	srv.Pause()
	for stop := time.Now().Add(2 * time.Second); time.Now().Before(stop); {
		request() // the route's traffic while Redis is stopped: a request every 25ms
		time.Sleep(25 * time.Millisecond)
	}
	srv.Resume()
	resumed := time.Now()
	redistest.Eventually(t, "an acquire admitted by Redis", func() bool {
		ok, byRedis := request()
		return ok && byRedis
	})
	took := time.Since(resumed)
	t.Logf("Redis admitted again %v after it resumed", took)
	want := 10 * time.Second // the leases left behind would hold the slot 28s
	if redistest.ExactTiming() {
		want = fallback.DefaultOpenFor + 500*time.Millisecond // the next probe, and the releases
	}
	if took > want {
		t.Errorf("Redis admitted again %v after it resumed; want within %v", took, want)
	}
}

// TestRedisAsksForPassword: Redis starts asking for a password the client does not have
// (restarted with one, an ACL changed): its refusal (NOAUTH, or a protocol error for an
// unauthenticated script call, and the connection closed) counts as Redis unavailable,
// so the breaker opens and decisions go on on the shares; the log says why, in words (not
// only Redis's "ERR Protocol error: unauthenticated multibulk length"), again while
// probes fail; and over 3 seconds at 200 decisions a second the store dials Redis about
// once a probe, not once a decision.
func TestRedisAsksForPassword(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	client := recommendedClient(srv.Addr)
	t.Cleanup(func() { client.Close() })
	var logs bytes.Buffer
	var mu sync.Mutex
	in := newInstance(t, client, localstore.New(), ratelimit.PerSecond(1_000_000),
		fallback.WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))))
	ctx := context.Background()
	if err := in.redis.LoadScripts(ctx, tokenbucket.Algorithm()); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, "a decision by Redis", func() bool {
		in.limiter.Allow(ctx, "k")
		return in.bySource[fallback.Primary].Load() > 0
	})
	if err := admin.ConfigSet(ctx, "requirepass", "secret").Err(); err != nil {
		t.Fatal(err)
	}
	// the connections open so far were authenticated: close them, as a restart would
	if err := admin.Do(ctx, "client", "kill", "type", "normal", "skipme", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	before := connectionsReceived(t, admin)
	for range 600 { // 3s at 200/s
		if d, err := in.limiter.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("Redis asking for a password: %+v, %v", d, err)
		}
		time.Sleep(5 * time.Millisecond) // the load's pace, not a wait for an event
	}
	dials := connectionsReceived(t, admin) - before
	mu.Lock()
	log := logs.String()
	mu.Unlock()
	if !strings.Contains(log, "Redis refuses this client: it asks for a password") {
		t.Errorf("the log does not say Redis asks for a password:\n%s", log)
	}
	if in.store.BreakerState() == fallback.Closed {
		t.Errorf("the breaker is closed on a Redis that refuses every call")
	}
	// the 20 calls that open the breaker (its MinCalls), then a probe a second and the
	// warmings, backing off; each decision dialled anew would be 600
	if dials > 40 {
		t.Errorf("%d connections to Redis in 3s of refused calls; want about 30 (warmings back off, a probe a second)", dials)
	}
	t.Logf("%d connections in 3s; %d decisions on the shares", dials, in.bySource[fallback.Secondary].Load())
}

func connectionsReceived(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	n, err := strconv.ParseInt(redistest.Info(t, c, "Stats", "total_connections_received"), 10, 64)
	if err != nil {
		t.Fatalf("INFO stats, total_connections_received: %v", err)
	}
	return n
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
