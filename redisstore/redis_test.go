package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/script"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

func apply(t *testing.T, s ratelimit.Store, alg *core.Algorithm, key string, rule ratelimit.Rule, n int64) (core.Outcome, error) {
	t.Helper()
	return s.Apply(context.Background(), core.Request{Key: key, N: n, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(rule)}})
}

// TestClusterWide: 20 instances, each with its own client, drive 100 tenants at twice
// their limit for 3 seconds on the server's clock; summed over all instances, each
// tenant is admitted what its token bucket allows over the time it was driven (or all
// it asked for, where a busy machine asked for less).
func TestClusterWide(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 3 seconds")
	}
	const (
		instances = 20
		tenants   = 100
		duration  = 3 * time.Second
	)
	srv := redistest.Start(t)
	rule := ratelimit.PerSecond(10) // 20 instances x 1 per second each: 20 per second per tenant
	var admitted atomic.Int64
	var first, last, offered sync.Map // tenant -> time of its first and last request, and their count
	start := time.Now()
	var wg sync.WaitGroup
	for i := range instances {
		l, err := tokenbucket.New(redisstore.New(srv.Client(), redisstore.WithPrefix("wide")), rule)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			// instance i sends every tenant one request a second, 50ms after instance i-1
			for at := time.Duration(i) * duration / instances / 3; at < duration; at += time.Second {
				time.Sleep(time.Until(start.Add(at))) // pacing a real-time load, not a wait in a check
				for tenant := range tenants {
					key := fmt.Sprint("tenant-", tenant)
					now := time.Now()
					first.LoadOrStore(key, now)
					last.Store(key, now)
					n, _ := offered.LoadOrStore(key, new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
					d, err := l.Allow(context.Background(), key)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	allowed := 0.0
	first.Range(func(key, f any) bool {
		l, _ := last.Load(key)
		n, _ := offered.Load(key)
		span := l.(time.Time).Sub(f.(time.Time)).Seconds()
		// capacity (Burst 0: Limit) plus the refill, or what was asked when less: on a
		// machine busy enough, the instances ask for less than twice the rule
		allowed += min(float64(n.(*atomic.Int64).Load()), float64(rule.Limit)+float64(rule.Limit)*span)
		return true
	})
	got := float64(admitted.Load())
	t.Logf("admitted %d, the rule allows %.0f (%.2f%%)", admitted.Load(), allowed, 100*(got-allowed)/allowed)
	if got > allowed*1.03 {
		t.Errorf("admitted %.0f; the rule allows %.0f: more than 3%% over", got, allowed)
	}
	// under is a measure of time (a machine that stalls for a moment lets a bucket's
	// refill go by), held where the machine is quiet (.ci/run runs this test so)
	if redistest.ExactTiming() && got < allowed*0.97 {
		t.Errorf("admitted %.0f; the rule allows %.0f: more than 3%% under", got, allowed)
	}
}

// TestClockSkew: instances whose clocks are 5 seconds apart (WithClock), within the
// rule's minute, see one bucket: the one behind decides as at the latest instant the key
// has seen, and its RetryAfter is in its own clock. (Without WithClock, decisions take
// Redis's clock and skew cannot arise at all; clocks further apart than a period count as
// a clock stepped back: see the conformance suite's "clock goes back".)
func TestClockSkew(t *testing.T) {
	client := redistest.Start(t).Client()
	ahead := clock.NewFake(limitertest.Start.Add(5 * time.Second))
	behind := clock.NewFake(limitertest.Start)
	rule := ratelimit.PerMinute(10) // a token every 6s
	la, _ := tokenbucket.New(redisstore.New(client, redisstore.WithClock(ahead), redisstore.WithPrefix("skew")), rule)
	lb, _ := tokenbucket.New(redisstore.New(client, redisstore.WithClock(behind), redisstore.WithPrefix("skew")), rule)
	ctx := context.Background()
	if d, err := la.AllowN(ctx, "k", 6); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("ahead: AllowN(6) = %+v, %v", d, err)
	}
	if d, err := lb.AllowN(ctx, "k", 4); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("behind: AllowN(4) = %+v, %v; want allowed, 0 left (no refill from its older clock)", d, err)
	}
	if d, err := lb.Allow(ctx, "k"); err != nil || d.Allowed || d.RetryAfter != 11*time.Second {
		t.Fatalf("behind: Allow = %+v, %v; want denied, retry after 11s on its own clock", d, err)
	}
	if d, err := la.Allow(ctx, "k"); err != nil || d.Allowed || d.RetryAfter != 6*time.Second {
		t.Fatalf("ahead: Allow = %+v, %v; want denied, retry after 6s", d, err)
	}
	behind.Advance(11 * time.Second)
	if d, err := lb.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("behind, after its RetryAfter: %+v, %v; want allowed", d, err)
	}
}

// TestScriptFlush: the first decision loads the script, and after SCRIPT FLUSH the next
// decision loads it again, once, and counts once; the source never goes with a decision.
func TestScriptFlush(t *testing.T) {
	client := redistest.Start(t).Client()
	s := redisstore.New(client)
	rule := ratelimit.PerHour(10)
	ctx := context.Background()
	for i := range 10 {
		if i == 5 {
			if err := client.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		d, err := apply(t, s, fixedwindow.Algorithm(), "k", rule, 1)
		if err != nil || !d.Allowed() || d.Remaining != int64(9-i) {
			t.Fatalf("decision %d: %+v, %v; want allowed with %d left", i, d, err, 9-i)
		}
	}
	if loads, evals := redistest.CommandCalls(t, client, "script|load"), redistest.CommandCalls(t, client, "eval"); loads != 2 || evals != 0 {
		t.Errorf("SCRIPT LOAD ran %d times and EVAL %d; want 2 loads (the first decision, and the one after the flush), no EVAL", loads, evals)
	}
}

// TestNoScriptHerd: a thousand concurrent first decisions, and as many after SCRIPT
// FLUSH, load the script once each time instead of each sending its source. (One call per
// decision here: coalesced, they would be a few dozen calls.)
func TestNoScriptHerd(t *testing.T) {
	client := redistest.Start(t).Client(func(o *redis.Options) { o.PoolSize = 64 })
	s := redisstore.New(client, redisstore.WithMaxBatch(1))
	rule := ratelimit.PerHour(1_000_000)
	herd := func() {
		var wg sync.WaitGroup
		for i := range 1000 {
			wg.Go(func() {
				if d, err := apply(t, s, tokenbucket.Algorithm(), fmt.Sprint("k", i%50), rule, 1); err != nil || !d.Allowed() {
					t.Errorf("decision %d: %+v, %v", i, d, err)
				}
			})
		}
		wg.Wait()
	}
	herd()
	if loads, evals, shas := redistest.CommandCalls(t, client, "script|load"), redistest.CommandCalls(t, client, "eval"), redistest.CommandCalls(t, client, "evalsha"); loads != 1 || evals != 0 || shas != 1000 {
		t.Errorf("1000 first decisions: %d SCRIPT LOAD, %d EVAL, %d EVALSHA; want 1, 0, 1000", loads, evals, shas)
	}
	if err := client.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	herd()
	// the decisions sent before the first NOSCRIPT came back meet it, and each is sent again
	// once the script is loaded: at most 2 EVALSHA per decision, and a load per such wave
	loads, evals, shas := redistest.CommandCalls(t, client, "script|load"), redistest.CommandCalls(t, client, "eval"), redistest.CommandCalls(t, client, "evalsha")
	if loads < 2 || loads > 2+64 || evals != 0 || shas > 1000+2*1000 {
		t.Errorf("1000 decisions after SCRIPT FLUSH: %d SCRIPT LOAD, %d EVAL, %d EVALSHA in all; want 2 to 66 loads, no EVAL, at most 3000 EVALSHA", loads, evals, shas)
	}
}

// TestRestart: while Redis is down every decision is an error (never a false "allowed");
// once it is back on the same port decisions resume, on fresh state.
func TestRestart(t *testing.T) {
	srv := redistest.Start(t)
	s := redisstore.New(srv.Client(func(o *redis.Options) { o.MaxRetries = -1 }))
	rule := ratelimit.PerHour(5)
	if d, err := apply(t, s, tokenbucket.Algorithm(), "k", rule, 5); err != nil || !d.Allowed() {
		t.Fatalf("before: %+v, %v", d, err)
	}
	srv.Kill()
	if d, err := apply(t, s, tokenbucket.Algorithm(), "k", rule, 1); !errors.Is(err, ratelimit.ErrUnavailable) || d.Allowed() {
		t.Fatalf("with Redis down: %+v, %v; want ErrUnavailable and no admission", d, err)
	}
	srv.Restart()
	deadline := time.Now().Add(redistest.StartupTimeout)
	for {
		d, err := apply(t, s, tokenbucket.Algorithm(), "k", rule, 1)
		if err == nil {
			if !d.Allowed() || d.Remaining != 4 {
				t.Errorf("after the restart: %+v; want a fresh bucket", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision after the restart: %v", err)
		}
	}
}

// TestKeyWithoutTTL: a state written without a TTL gets one on its next decision.
// TestMinTTL: with WithMinTTL, every key a decision writes lives at least that long,
// whatever its reset; without, a key lives until it is full again. Both on a fake clock
// that stands still: the state a key keeps is the same.
func TestMinTTL(t *testing.T) {
	client := redistest.Start(t).Client()
	clk := clock.NewFake(limitertest.Start)
	ctx := context.Background()
	for _, c := range []struct {
		prefix string
		opts   []redisstore.Option
		least  time.Duration // the least PTTL of every key
		most   time.Duration // the most
	}{
		{"floor", []redisstore.Option{redisstore.WithMinTTL(time.Hour)}, 59 * time.Minute, time.Hour},
		{"none", nil, time.Millisecond, 2 * time.Second},
	} {
		s := redisstore.New(client, append(c.opts, redisstore.WithClock(clk), redisstore.WithPrefix(c.prefix))...)
		for _, alg := range []*core.Algorithm{tokenbucket.Algorithm(), slidinglog.Algorithm(), concurrency.Algorithm()} {
			if _, err := apply(t, s, alg, "k", ratelimit.PerSecond(10), 1); err != nil {
				t.Fatal(err)
			}
		}
		keys, err := client.Keys(ctx, c.prefix+":*").Result()
		if err != nil || len(keys) < 4 { // the buckets' and the log's states, the log, the leases
			t.Fatalf("%s: keys %v, %v", c.prefix, keys, err)
		}
		for _, k := range keys {
			if ttl := client.PTTL(ctx, k).Val(); ttl < c.least || ttl > c.most {
				t.Errorf("%s: PTTL(%s) = %v; want %v to %v", c.prefix, k, ttl, c.least, c.most)
			}
		}
	}
}

func TestKeyWithoutTTL(t *testing.T) {
	client := redistest.Start(t).Client()
	s := redisstore.New(client, redisstore.WithPrefix("nottl"))
	ctx := context.Background()
	key := "nottl:fixedwindow:state::{k}"
	window := time.Now().Add(time.Hour).UnixMicro() // a state far in the future: still full of events
	if err := client.Set(ctx, key, fmt.Sprintf("%d:3:0", window), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if ttl := client.PTTL(ctx, key).Val(); ttl != -1 {
		t.Fatalf("setup: PTTL = %v; want none", ttl)
	}
	d, err := apply(t, s, fixedwindow.Algorithm(), "k", ratelimit.PerHour(10), 1)
	if err != nil || !d.Allowed() || d.Remaining != 6 {
		t.Fatalf("decision on the state without TTL: %+v, %v; want 6 left", d, err)
	}
	if ttl := client.PTTL(ctx, key).Val(); ttl <= 0 || ttl > d.Reset+time.Millisecond {
		t.Errorf("PTTL after a decision = %v; want a TTL up to ResetAfter %v", ttl, d.Reset)
	}
}

// TestTTLs: every key of every algorithm has a TTL after a decision, whole milliseconds,
// never 0, up to ResetAfter, whatever the rule: a 5ms period, a day, a rate far above the
// capacity, a fractional rate.
func TestTTLs(t *testing.T) {
	client := redistest.Start(t).Client()
	s := redisstore.New(client, redisstore.WithPrefix("ttl"))
	ctx := context.Background()
	rules := []ratelimit.Rule{
		{Limit: 3, Period: 5 * time.Millisecond},
		ratelimit.PerDay(1000),
		{Limit: 1000, Period: time.Second, Burst: 1},
		ratelimit.PerSecond(3),
	}
	for _, k := range limitertest.Kinds {
		for i, rule := range rules {
			key := fmt.Sprint("k", i)
			start := time.Now()
			d, err := apply(t, s, k.Algorithm, key, rule, 1)
			if err != nil {
				t.Fatal(err)
			}
			for _, part := range k.Algorithm.ScriptKeys {
				name := fmt.Sprintf("ttl:%s:%s::{%s}", k.Name, part, key)
				ttl, err := client.PTTL(ctx, name).Result()
				if err != nil {
					t.Fatal(err)
				}
				// The TTL is ResetAfter rounded up to a millisecond, set by the script, which
				// ran within elapsed of now. While elapsed leaves more than a millisecond of
				// it, the key must be there with a TTL left; after that (a short rule on a
				// busy machine) it may show 0 (under a millisecond left) or be gone (-2).
				// Never -1: a key without a TTL.
				elapsed := time.Since(start)
				mustLive := elapsed+time.Millisecond < d.Reset
				switch {
				case ttl == -1 || ttl > d.Reset+time.Millisecond:
					t.Errorf("%s %v: PTTL(%s) = %v; ResetAfter %v", k.Name, rule, name, ttl, d.Reset)
				case mustLive && ttl <= 0:
					t.Errorf("%s %v: PTTL(%s) = %v %v after the decision; ResetAfter %v", k.Name, rule, name, ttl, elapsed, d.Reset)
				case !mustLive && ttl < 0 && ttl != -2:
					t.Errorf("%s %v: PTTL(%s) = %v; want a TTL or gone", k.Name, rule, name, ttl)
				}
			}
		}
	}
}

// TestIdleKeysVanish: a key's state expires when it is back to full, and the key comes
// back full.
func TestIdleKeysVanish(t *testing.T) {
	client := redistest.Start(t).Client()
	s := redisstore.New(client, redisstore.WithPrefix("idle"))
	rule := ratelimit.Rule{Limit: 2, Period: 50 * time.Millisecond}
	if d, err := apply(t, s, fixedwindow.Algorithm(), "k", rule, 2); err != nil || !d.Allowed() {
		t.Fatal(d, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for client.Exists(context.Background(), "idle:fixedwindow:state::{k}").Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the key did not expire")
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	if d, err := apply(t, s, fixedwindow.Algorithm(), "k", rule, 2); err != nil || !d.Allowed() {
		t.Errorf("after it vanished: %+v, %v; want a full key", d, err)
	}
}

// TestMaxMemory: with Redis out of memory, a decision is an error, not an admission.
func TestMaxMemory(t *testing.T) {
	client := redistest.Start(t).Client()
	ctx := context.Background()
	if err := client.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	d, err := apply(t, redisstore.New(client), tokenbucket.Algorithm(), "k", ratelimit.PerSecond(5), 1)
	if !redis.IsOOMError(err) || !errors.Is(err, ratelimit.ErrUnavailable) || d.Allowed() {
		t.Errorf("out of memory: %+v, %v; want an OOM error", d, err)
	}
}

// TestBusy: while a script runs past busy-reply-threshold, Redis answers BUSY, and a
// decision is ErrUnavailable.
func TestBusy(t *testing.T) {
	srv := redistest.Start(t, "--busy-reply-threshold", "10")
	client := srv.Client()
	ctx := context.Background()
	blocker := srv.Client(func(o *redis.Options) { o.ReadTimeout = -1 })
	go blocker.Eval(ctx, "while true do end", nil) // a read-only script: SCRIPT KILL can stop it
	s := redisstore.New(client)
	deadline := time.Now().Add(redistest.StartupTimeout)
	for {
		_, err := apply(t, s, tokenbucket.Algorithm(), "k", ratelimit.PerSecond(5), 1)
		if err != nil && strings.Contains(err.Error(), "BUSY") {
			if !errors.Is(err, ratelimit.ErrUnavailable) {
				t.Errorf("BUSY: %v; want ErrUnavailable", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no BUSY while a script spins: %v", err)
		}
	}
	if err := client.ScriptKill(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestReplyLostIsCountedOnce: a reply delayed past the client's read timeout is an error,
// and the decision counted once, though the client allows 3 retries. The control shows
// that a plain redis.Script.Run through the same proxy counts twice or more.
func TestReplyLostIsCountedOnce(t *testing.T) {
	srv := redistest.Start(t)
	direct := srv.Client()
	p := redistest.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{
		Addr: p.Addr, ReadTimeout: 100 * time.Millisecond, MaxRetries: 3,
		MinRetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond,
		PoolSize: redisstore.MaxFlights + 2, // MaxFlights at most, warmed by LoadScripts below
	})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	rule := ratelimit.PerHour(100)
	count := func(key string) string { // the L of the state "T:L:A"
		state := strings.Split(direct.Get(ctx, "lost:fixedwindow:state::{"+key+"}").Val(), ":")
		if len(state) != 3 {
			return ""
		}
		return state[1]
	}

	s := redisstore.New(client, redisstore.WithPrefix("lost"))
	if err := s.LoadScripts(ctx, fixedwindow.Algorithm()); err != nil {
		t.Fatal(err) // no PING of a warming will meet the held reply
	}
	if _, err := apply(t, s, fixedwindow.Algorithm(), "warm", rule, 1); err != nil {
		t.Fatal(err) // loads the script and opens a connection at full speed
	}
	p.HoldNext(1, 300*time.Millisecond)
	if d, err := apply(t, s, fixedwindow.Algorithm(), "k", rule, 1); !errors.Is(err, ratelimit.ErrUnavailable) || d.Allowed() {
		t.Fatalf("a reply delayed past the read timeout: %+v, %v; want ErrUnavailable", d, err)
	}
	if got := count("k"); got != "1" {
		t.Errorf("counted %s times; want exactly once", got)
	}

	// the control: the same script run as go-redis's Script.Run, which it retries
	control := redis.NewScript(script.Single(fixedwindow.Algorithm()))
	keys := []string{"lost:fixedwindow:state::{control}"}
	args := []any{1, 100, time.Hour.Microseconds(), 0, 0, "", script.Take, 0, 0, "", "", ""}
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatal(err) // a pooled connection again, so that the delayed reply is the script's
	}
	p.HoldNext(1, 300*time.Millisecond)
	if err := control.Run(ctx, client, keys, args...).Err(); err != nil {
		t.Fatalf("the control's retry failed too: %v", err)
	}
	if got := count("control"); got != "2" {
		t.Errorf("the control counted %q times; want 2, or the test cannot see a retry", got)
	}
}

// silentServer accepts connections and never answers: a Redis that hangs. Calling hangUp
// closes them (clients drain their calls in flight on Close: hang up first).
func silentServer(t *testing.T) (addr string, hangUp func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go io.Copy(io.Discard, c)
		}
	}()
	hangUp = func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
	t.Cleanup(hangUp)
	return ln.Addr().String(), hangUp
}

// TestContextDeadline: a call returns by its context's deadline even though the client's
// own timeouts are an hour, on a plain client and on an AutoPipeliner, with and without
// ContextTimeoutEnabled.
func TestContextDeadline(t *testing.T) {
	addr, hangUp := silentServer(t)
	newClient := func(ctxTimeouts bool) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true,
			ReadTimeout: time.Hour, WriteTimeout: time.Hour, ContextTimeoutEnabled: ctxTimeouts})
		t.Cleanup(func() { c.Close() })
		return c
	}
	ap, err := newClient(false).AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ap.Close() })
	async, err := newClient(false).AsyncAutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { async.Close() })
	t.Cleanup(hangUp) // before the clients close
	for name, client := range map[string]redis.Scripter{
		"client":                        newClient(false),
		"client, ContextTimeoutEnabled": newClient(true),
		"AutoPipeliner":                 ap,
		"AsyncAutoPipeliner":            async,
	} {
		t.Run(name, func(t *testing.T) {
			s := redisstore.New(client)
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				defer cancel()
				_, err := s.Apply(ctx, core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10))}})
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ratelimit.ErrUnavailable) {
					t.Errorf("Allow against a silent server: %v; want the deadline, as unavailable", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Allow with a 50ms deadline against a silent server had not returned after 30s")
			}
		})
	}
}

// TestGaveUpNotSent: a decision whose caller gives up while it waits for a connection is
// never sent: the script does not run, and the key counts only the decisions that did.
func TestGaveUpNotSent(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	for _, ctxTimeouts := range []bool{false, true} {
		client := srv.Client(func(o *redis.Options) { o.PoolSize = 1; o.ContextTimeoutEnabled = ctxTimeouts })
		s := redisstore.New(client, freshPrefix())
		ctx := context.Background()
		rule := ratelimit.PerHour(100)
		if d, err := apply(t, s, tokenbucket.Algorithm(), "k", rule, 1); err != nil || !d.Allowed() { // the script loaded
			t.Fatal(d, err)
		}
		before := redistest.CommandCalls(t, admin, "evalsha")
		held := make(chan error, 1)
		go func() { held <- client.BLPop(ctx, 0, "gate").Err() }() // takes the only connection
		redistest.Eventually(t, "the BLPOP holding the only connection", func() bool {
			return redistest.BlockedClients(t, admin) > 0
		})
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		_, err := s.Apply(short, core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(rule)}})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, redis.ErrPoolTimeout) {
			t.Fatalf("ContextTimeoutEnabled %v: a decision waiting for the only connection: %v; want the deadline", ctxTimeouts, err)
		}
		if err := admin.LPush(ctx, "gate", "go").Err(); err != nil {
			t.Fatal(err)
		}
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		d, err := apply(t, s, tokenbucket.Algorithm(), "k", rule, 1) // after the abandoned one, on the same connection
		if err != nil || d.Remaining != 98 {
			t.Errorf("ContextTimeoutEnabled %v: the next decision: %+v, %v; want 98 left (the abandoned one not counted)", ctxTimeouts, d, err)
		}
		if n := redistest.CommandCalls(t, admin, "evalsha") - before; n != 1 {
			t.Errorf("ContextTimeoutEnabled %v: %d EVALSHA after the first; want 1 (the abandoned one never sent)", ctxTimeouts, n)
		}
	}
}

// TestLateReplyKeepsItsConnection: with Redis 20ms away, decisions whose callers give up
// after 5ms fail with their deadline, but the replies of those already sent are read
// when they come: the connections stay open and serve the next decisions, whatever the
// client's ContextTimeoutEnabled, so that a slow Redis costs no new dial and handshake
// per decision. No decision counts twice.
func TestLateReplyKeepsItsConnection(t *testing.T) {
	srv := redistest.Start(t)
	const pool = 4
	for _, ctxTimeouts := range []bool{false, true} {
		for _, batch := range []int{redisstore.DefaultMaxBatch, 1} {
			p := redistest.StartProxy(t, srv.Addr)
			client := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: ctxTimeouts, MaxRetries: -1, PoolSize: pool})
			t.Cleanup(func() { client.Close() })
			s := redisstore.New(client, freshPrefix(), redisstore.WithMaxBatch(batch))
			rule := ratelimit.PerHour(1000)
			if _, err := apply(t, s, tokenbucket.Algorithm(), "warm", rule, 1); err != nil {
				t.Fatal(err)
			}
			p.SetDelay(20 * time.Millisecond)
			for i := range 40 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				start := time.Now()
				_, err := s.Apply(ctx, core.Request{Key: fmt.Sprint("k", i), N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(rule)}})
				cancel()
				if err == nil && time.Since(start) >= 20*time.Millisecond {
					continue // a machine that stalled past the reply: the reply had come, as good as the deadline
				}
				if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ratelimit.ErrUnavailable) {
					t.Fatalf("ContextTimeoutEnabled %v, batch %d: a decision 20ms away with 5ms to wait: %v; want the deadline, as unavailable", ctxTimeouts, batch, err)
				}
			}
			p.SetDelay(0)
			counted := 0
			for i := range 40 {
				d, err := apply(t, s, tokenbucket.Algorithm(), fmt.Sprint("k", i), rule, 1)
				if err != nil || d.Remaining < 998 {
					t.Fatalf("ContextTimeoutEnabled %v, batch %d: key %d after its late reply: %+v, %v; want 998 or 999 left (counted at most once)", ctxTimeouts, batch, i, d, err)
				}
				if d.Remaining == 998 {
					counted++
				}
			}
			if counted == 0 {
				t.Errorf("ContextTimeoutEnabled %v, batch %d: no late decision counted; the test saw none sent", ctxTimeouts, batch)
			}
			if n := p.Accepted(); n > pool {
				t.Errorf("ContextTimeoutEnabled %v, batch %d: %d connections over the run; want at most the pool's %d (late replies read, connections kept)", ctxTimeouts, batch, n, pool)
			}
			t.Logf("ContextTimeoutEnabled %v, batch %d: %d of 40 late decisions sent and counted, %d connections", ctxTimeouts, batch, counted, p.Accepted())
		}
	}
}

// TestLoadScripts: scripts loaded before the first decision are not loaded again by it,
// and an unreachable Redis is an error wrapping ErrUnavailable.
func TestLoadScripts(t *testing.T) {
	client := redistest.Start(t).Client()
	s := redisstore.New(client)
	ctx := context.Background()
	if err := s.LoadScripts(ctx, tokenbucket.Algorithm(), fixedwindow.Algorithm()); err != nil {
		t.Fatal(err)
	}
	if d, err := apply(t, s, tokenbucket.Algorithm(), "k", ratelimit.PerHour(10), 1); err != nil || !d.Allowed() {
		t.Fatal(d, err)
	}
	if loads, evals := redistest.CommandCalls(t, client, "script|load"), redistest.CommandCalls(t, client, "eval"); loads != 2 || evals != 0 {
		t.Errorf("%d loads and %d EVAL; want the 2 of LoadScripts and none after", loads, evals)
	}
	addr, hangUp := silentServer(t)
	hangUp() // nothing listens there now
	down := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer down.Close()
	if err := redisstore.New(down).LoadScripts(ctx, tokenbucket.Algorithm()); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("LoadScripts with Redis down: %v; want ErrUnavailable", err)
	}
}

// TestLoadScriptsOfEveryAlgorithm: LoadScripts without a list loads the scripts of every
// algorithm of the module, so that no first decision of any of them loads one: seven
// scripts, the calendar quotas' one for every calendar and zone.
func TestLoadScriptsOfEveryAlgorithm(t *testing.T) {
	client := redistest.Start(t).Client()
	s := redisstore.New(client)
	ctx := context.Background()
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	week, err := fixedwindow.Quota{Limit: 5, Per: fixedwindow.Week, In: time.FixedZone("", 3600)}.Algorithm()
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []*core.Algorithm{tokenbucket.Algorithm(), leakybucket.Algorithm(), fixedwindow.Algorithm(),
		slidingwindow.Algorithm(), slidinglog.Algorithm(), week, concurrency.Algorithm()} {
		if d, err := apply(t, s, alg, "k", ratelimit.PerHour(10), 1); err != nil || !d.Allowed() {
			t.Fatalf("%s: %+v, %v", alg.Name, d, err)
		}
	}
	if loads, evals := redistest.CommandCalls(t, client, "script|load"), redistest.CommandCalls(t, client, "eval"); loads != 7 || evals != 0 {
		t.Errorf("%d loads and %d EVAL; want the 7 of LoadScripts and none after", loads, evals)
	}
}

// TestRecommended: the recommended options keep what the caller set, and set what a
// rate limiter's client needs.
func TestRecommended(t *testing.T) {
	o := redisstore.Recommended(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 7})
	if o.Addr != "127.0.0.1:1" || o.PoolSize != 7 || !o.ContextTimeoutEnabled || o.MaxRetries != -1 || o.DialerRetries != 1 ||
		o.DialTimeout != 100*time.Millisecond || o.PoolTimeout != 10*time.Millisecond || o.ReadTimeout != time.Second {
		t.Errorf("%+v", o)
	}
	c := redisstore.RecommendedCluster(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	if len(c.Addrs) != 1 || !c.ContextTimeoutEnabled || c.MaxRetries != -1 || c.ClusterStateReloadInterval != 5*time.Second {
		t.Errorf("%+v", c)
	}
	if redisstore.Recommended(nil) == nil || redisstore.RecommendedCluster(nil) == nil {
		t.Error("nil options: nil")
	}
}
