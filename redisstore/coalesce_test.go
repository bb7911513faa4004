package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// step is one decision of a key's sequence in TestCoalescedParity: a refund gives back
// the take of step of; a take with a receipt writes one.
type step struct {
	req     core.Request
	receipt bool
	of      int
	d       core.Outcome
	at      int64 // the take's receipt, in localstore
}

// run applies the steps of one key's sequence to s, each take with a receipt on a Spec of
// its own, each refund with the receipt its take got in this run; it returns the
// decisions and the receipts' instants.
func run(s ratelimit.Store, seq []step) ([]core.Outcome, []int64, error) {
	ds, ats := make([]core.Outcome, len(seq)), make([]int64, len(seq))
	receipts := make([]*core.Receipt, len(seq))
	for i, st := range seq {
		req := st.req
		switch {
		case st.receipt:
			receipts[i] = &core.Receipt{}
			req.Receipt = receipts[i]
		case req.Spec.Op == core.OpRefund && receipts[st.of].At == 0: // its take was denied: nothing to refund
			spec := *req.Spec
			spec.Op, req.N = core.OpPeek, 1
			req.Spec = &spec
		case req.Spec.Op == core.OpRefund:
			req.Receipt = receipts[st.of]
		}
		d, err := s.Apply(context.Background(), req)
		if err != nil {
			return nil, nil, fmt.Errorf("step %d (%s %v n %d op %q): %w", i, req.Spec.Algorithm.Name, req.Spec.Rule, req.N, req.Spec.Op, err)
		}
		ds[i] = d
		if receipts[i] != nil {
			ats[i] = receipts[i].At
		}
	}
	return ds, ats, nil
}

// TestCoalescedParity: many keys, each driven by its own goroutine through a random
// sequence (the five algorithms, rules, n, takes, peeks, refunds and resets), ride
// together in batches, and every decision is the one localstore gives for the same
// sequence, and the one a store deciding one call at a time gives.
func TestCoalescedParity(t *testing.T) {
	client := redistest.Start(t).Client(func(o *redis.Options) { o.PoolSize = 8 })
	clk := clock.NewFake(limitertest.Start.Add(1234567 * time.Microsecond))
	stores := map[string]ratelimit.Store{
		"coalesced": redisstore.New(client, redisstore.WithClock(clk), redisstore.WithPrefix("co")),
		"one-by-one": redisstore.New(client, redisstore.WithClock(clk), redisstore.WithPrefix("one"),
			redisstore.WithMaxBatch(1)),
	}
	// rules of a minute or more: a key's TTL runs in Redis's real time while the fake
	// clock stands still, and a key of a second's rule could expire, and come back full,
	// in the middle of a run on a busy machine
	rules := []ratelimit.Rule{ratelimit.PerMinute(3), ratelimit.PerMinute(10), {Limit: 5, Period: time.Hour, Burst: 9}}
	const keys, steps = 64, 40
	seqs := make([][]step, keys)
	rng := rand.New(rand.NewPCG(7, 7))
	for k := range seqs {
		kind := limitertest.Kinds[k%len(limitertest.Kinds)]
		var takes []int // the steps of takes with a receipt, to refund
		for i := range steps {
			rule := rules[rng.IntN(len(rules))]
			a, err := kind.Algorithm.Prepare(core.Rule(rule), 1)
			if err != nil {
				t.Fatal(err)
			}
			req := core.Request{Key: fmt.Sprint("key-", k), N: 1 + rng.Int64N(a.Limit), Spec: &core.Spec{Algorithm: kind.Algorithm, Namespace: "parity", Rule: core.Rule(rule), Op: []core.Op{core.OpTake, core.OpPeek, core.OpRefund, core.OpReset}[rng.IntN(8)/5*(1+rng.IntN(3))]}}
			if req.Spec.Op != core.OpTake {
				req.N = 1
			}
			req.Spec.Reserve = []int64{0, 0, 20, 50}[rng.IntN(4)] // calls of several reserves share batches
			st := step{req: req}
			switch {
			case req.Spec.Op == core.OpTake && rng.IntN(2) == 0:
				st.receipt = true
				takes = append(takes, i)
			case req.Spec.Op == core.OpRefund && len(takes) == 0:
				st.req.Spec.Op = core.OpPeek
			case req.Spec.Op == core.OpRefund:
				st.of = takes[rng.IntN(len(takes))]
				st.req.N, st.req.Spec.Reserve = 1+rng.Int64N(seqs[k][st.of].req.N), 0
				st.req.Spec.Rule = seqs[k][st.of].req.Spec.Rule
			}
			seqs[k] = append(seqs[k], st)
		}
	}
	local := localstore.New(localstore.WithClock(clk))
	for k := range seqs {
		ds, ats, err := run(local, seqs[k])
		if err != nil {
			t.Fatal(err)
		}
		for i := range seqs[k] {
			seqs[k][i].d, seqs[k][i].at = ds[i], ats[i]
		}
	}
	calls := map[string]int{}
	for name, s := range stores {
		before := redistest.CommandCalls(t, client, "evalsha")
		t.Run(name, func(t *testing.T) {
			var wg sync.WaitGroup
			for k := range seqs {
				wg.Go(func() {
					ds, ats, err := run(s, seqs[k])
					if err != nil {
						t.Errorf("key %d: %v", k, err)
						return
					}
					for i, st := range seqs[k] {
						if ds[i] != st.d || ats[i] != st.at {
							t.Errorf("key %d, step %d (%s %v n %d op %q): %+v at %d; localstore %+v at %d",
								k, i, st.req.Spec.Algorithm.Name, st.req.Spec.Rule, st.req.N, st.req.Spec.Op, ds[i], ats[i], st.d, st.at)
							return
						}
					}
				})
			}
			wg.Wait()
		})
		calls[name] = redistest.CommandCalls(t, client, "evalsha") - before
	}
	if calls["one-by-one"] != keys*steps || calls["coalesced"] >= calls["one-by-one"] {
		t.Errorf("%d decisions: %d script calls one by one, %d coalesced; want as many as decisions, and fewer",
			keys*steps, calls["one-by-one"], calls["coalesced"])
	}
	t.Logf("%d decisions: %d script calls one by one, %d coalesced", keys*steps, calls["one-by-one"], calls["coalesced"])
}

// TestCoalescedOneProfile: the usual batch, where every call is the same request on its
// own key (the batch script's shortest path): for each algorithm and for in-flight leases
// (a lease of each call's own), 64 keys each driven by its own goroutine give the
// decisions localstore gives, on the store's clock (a time of each call's own), in fewer
// script calls than decisions; on Redis's clock every key admits exactly its limit, with
// the remaining counts in order.
func TestCoalescedOneProfile(t *testing.T) {
	client := redistest.Start(t).Client(func(o *redis.Options) { o.PoolSize = 8 })
	const keys, steps = 64, 12
	type kind struct {
		name string
		alg  *core.Algorithm
		rule ratelimit.Rule
		n    int64
	}
	kinds := []kind{{"inflight", concurrency.Algorithm(), ratelimit.Rule{Limit: 5, Period: time.Minute}, 1}}
	for _, k := range limitertest.Kinds {
		kinds = append(kinds, kind{k.Name, k.Algorithm, ratelimit.Rule{Limit: 20, Period: time.Minute, Burst: 20}, 3})
	}
	clk := clock.NewFake(limitertest.Start.Add(7654321 * time.Microsecond))
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			s := redisstore.New(client, redisstore.WithClock(clk), redisstore.WithPrefix("one-"+k.name))
			local := localstore.New(localstore.WithClock(clk))
			req := func(key, i int) core.Request {
				r := core.Request{Key: fmt.Sprint("key-", key), N: k.n, Spec: &core.Spec{Algorithm: k.alg, Rule: core.Rule(k.rule)}}
				if k.alg.Extend != nil {
					r.Spec.Lease = int64(i + 1)
				}
				return r
			}
			want := make([][]core.Outcome, keys)
			for key := range keys {
				for i := range steps {
					d, err := local.Apply(context.Background(), req(key, i))
					if err != nil {
						t.Fatal(err)
					}
					want[key] = append(want[key], d)
				}
			}
			before := redistest.CommandCalls(t, client, "evalsha")
			var wg sync.WaitGroup
			for key := range keys {
				wg.Go(func() {
					for i := range steps {
						d, err := s.Apply(context.Background(), req(key, i))
						if err != nil || d != want[key][i] {
							t.Errorf("key %d, step %d: %+v, %v; localstore %+v", key, i, d, err, want[key][i])
							return
						}
					}
				})
			}
			wg.Wait()
			if calls := redistest.CommandCalls(t, client, "evalsha") - before; calls >= keys*steps {
				t.Errorf("%d decisions took %d script calls; want them coalesced", keys*steps, calls)
			}
		})
	}
	t.Run("redis clock", func(t *testing.T) {
		s := redisstore.New(client, redisstore.WithPrefix("one-clock"))
		const limit = 10
		l, err := tokenbucket.New(s, ratelimit.Rule{Limit: limit, Period: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for key := range keys {
			wg.Go(func() {
				for i := range limit + 4 {
					d, err := l.Allow(context.Background(), fmt.Sprint("key-", key))
					if err != nil || d.Allowed != (i < limit) || d.Allowed && d.Remaining != limit-1-int64(i) {
						t.Errorf("key %d, take %d: %+v, %v; want allowed %v with %d left", key, i, d, err,
							i < limit, max(0, limit-1-i))
						return
					}
				}
			})
		}
		wg.Wait()
	})
}

// TestCoalescedLargeBatch: a store that allows batches of MaxBatch decides 12000 callers,
// each on a key of its own, in batches of hundreds (whose keys and reply a batch script
// unpacks onto Lua's stack), each exactly; a larger WithMaxBatch is held to MaxBatch.
func TestCoalescedLargeBatch(t *testing.T) {
	client := redistest.Start(t).Client()
	s := redisstore.New(client, redisstore.WithMaxBatch(10*redisstore.MaxBatch))
	l, err := tokenbucket.New(s, ratelimit.PerHour(7))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "warm"); err != nil { // the scripts loaded
		t.Fatal(err)
	}
	const callers = 12 * redisstore.MaxBatch
	before := redistest.CommandCalls(t, client, "evalsha")
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			d, err := l.Allow(context.Background(), fmt.Sprint("caller-", i))
			if err != nil || !d.Allowed || d.Remaining != 6 {
				t.Errorf("caller %d: %+v, %v; want allowed, 6 left", i, d, err)
			}
		})
	}
	close(start)
	wg.Wait()
	calls := redistest.CommandCalls(t, client, "evalsha") - before
	if calls < callers/redisstore.MaxBatch || calls > callers/20 {
		t.Errorf("%d decisions in %d script calls; want batches of hundreds, %d at most each", callers, calls, redisstore.MaxBatch)
	}
	t.Logf("%d decisions in %d script calls", callers, calls)
}

// TestCoalescedContention: 1000 callers on one key admit exactly its limit, in fewer
// script calls than decisions.
func TestCoalescedContention(t *testing.T) {
	client := redistest.Start(t).Client(func(o *redis.Options) { o.PoolSize = 16 })
	s := redisstore.New(client)
	l, err := tokenbucket.New(s, ratelimit.PerHour(100))
	if err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 1000 {
		wg.Go(func() {
			<-start
			d, err := l.Allow(context.Background(), "hot")
			if err != nil {
				t.Error(err)
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	calls := redistest.CommandCalls(t, client, "evalsha")
	if admitted.Load() != 100 {
		t.Errorf("1000 callers on a limit of 100: %d admitted", admitted.Load())
	}
	if calls >= 1000 {
		t.Errorf("1000 decisions took %d script calls; want them coalesced", calls)
	}
	t.Logf("1000 decisions in %d script calls", calls)
}

// TestCoalescedCancel: a caller that gives up while its decision waits for a batch gets
// its context's error; the others of the batch get their decisions; a caller cancelled
// before its batch goes out is not counted.
func TestCoalescedCancel(t *testing.T) {
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: p.Addr, PoolSize: redisstore.MaxFlights + 2})
	t.Cleanup(func() { client.Close() })
	s := redisstore.New(client, redisstore.WithPrefix("cancel")) // a pool of 4: MaxFlights at most
	rule := ratelimit.PerHour(1000)
	take := func(ctx context.Context, key string) (core.Outcome, error) {
		return s.Apply(ctx, core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(rule)}})
	}
	if err := s.LoadScripts(context.Background(), tokenbucket.Algorithm()); err != nil {
		t.Fatal(err) // and its connections warmed: no PING of a warming takes a held reply
	}
	if _, err := take(context.Background(), "warm"); err != nil {
		t.Fatal(err)
	}
	p.HoldNext(redisstore.MaxFlights, 300*time.Millisecond) // the next replies take 300ms: every flight of the node is busy
	var wg sync.WaitGroup
	for i := range redisstore.MaxFlights { // one after the other, each a flight of its own
		wg.Go(func() { take(context.Background(), fmt.Sprint("slow-", i)) })
		redistest.Eventually(t, "the flight's reply held", func() bool {
			return p.Held() <= int64(redisstore.MaxFlights-1-i)
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { _, err := take(ctx, "gives-up"); gaveUp <- err }()
	kept := make(chan core.Outcome, 1)
	go func() { d, _ := take(context.Background(), "keeps"); kept <- d }()
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Errorf("a caller cancelled while waiting: %v; want context.Canceled", err)
	}
	if d := <-kept; !d.Allowed() || d.Remaining != 999 {
		t.Errorf("the caller beside it: %+v; want its decision", d)
	}
	wg.Wait()
	if d, err := take(context.Background(), "gives-up"); err != nil || d.Remaining != 999 {
		t.Errorf("the key of the cancelled caller: %+v, %v; want 999 left (never counted)", d, err)
	}
}

// TestCoalescedLoneCaller: a decision that finds its server idle, whose caller has no
// deadline, goes out on the caller's own goroutine: a cancellation while its reply is
// held does not end its wait, and it gets the decision that Redis made (a caller with a
// deadline would get its context's error, and a decision counted). The callers that
// arrive meanwhile ride batches of the store's, and each gets its own decision.
func TestCoalescedLoneCaller(t *testing.T) {
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: p.Addr, PoolSize: redisstore.MaxFlights + 2})
	t.Cleanup(func() { client.Close() })
	s := redisstore.New(client, redisstore.WithPrefix("lone"))
	take := func(ctx context.Context, key string) (core.Outcome, error) {
		return s.Apply(ctx, core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerHour(1000))}})
	}
	if err := s.LoadScripts(context.Background(), tokenbucket.Algorithm()); err != nil {
		t.Fatal(err)
	}
	if _, err := take(context.Background(), "warm"); err != nil {
		t.Fatal(err)
	}
	p.HoldNext(1, 200*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	type answer struct {
		d   core.Outcome
		err error
	}
	lone := make(chan answer, 1)
	go func() { d, err := take(ctx, "lone"); lone <- answer{d, err} }()
	redistest.Eventually(t, "the lone call's reply held", func() bool { return p.Held() == 0 })
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if d, err := take(context.Background(), fmt.Sprint("beside-", i)); err != nil || d.Remaining != 999 {
				t.Errorf("a caller beside the lone one: %+v, %v; want its own decision", d, err)
			}
		})
	}
	cancel()
	got := <-lone
	if got.err != nil || !got.d.Allowed() || got.d.Remaining != 999 {
		t.Errorf("the lone caller, cancelled while its reply was held: %+v, %v; want the decision Redis made", got.d, got.err)
	}
	wg.Wait()
	if d, err := take(context.Background(), "lone"); err != nil || d.Remaining != 998 {
		t.Errorf("the lone key next: %+v, %v; want 998 left (counted once)", d, err)
	}
}

// TestCoalescedDeadlines: with the server stopped, callers whose deadlines pass while
// their decisions wait or ride a batch get a deadline error, as a decision sent alone
// does, and their context has ended when they get it: a fallback store tells a caller
// that gave up from a Redis that failed by its context, and a batch's own timer can
// fire before the caller's.
func TestCoalescedDeadlines(t *testing.T) {
	srv := redistest.Start(t)
	s := redisstore.New(srv.Client(), redisstore.WithPrefix("deadlines"))
	take := func(ctx context.Context, key string) error {
		_, err := s.Apply(ctx, core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerHour(100))}})
		return err
	}
	if err := take(context.Background(), "warm"); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	var wg sync.WaitGroup
	for g := range 8 { // more callers than flights: most ride batches
		wg.Go(func() {
			for i := range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				err := take(ctx, fmt.Sprint("key-", g, "-", i))
				ended := ctx.Err()
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) || ended == nil {
					t.Errorf("caller %d, call %d: %v, its context ended: %v; want a deadline error, once it ended", g, i, err, ended)
					return
				}
			}
		})
	}
	wg.Wait()
}

// masterCalls is how many EVALSHA the masters of cluster have run in all.
func masterCalls(t *testing.T, cluster *redistest.Cluster) int {
	n := 0
	for _, m := range cluster.Masters {
		c := redis.NewClient(&redis.Options{Addr: m.Addr})
		n += redistest.CommandCalls(t, c, "evalsha")
		c.Close()
	}
	return n
}

// TestCoalescedCluster: on a 3-master cluster, concurrent decisions over keys of every
// master ride together per master, and each key admits exactly its limit.
func TestCoalescedCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	s := redisstore.New(cluster.Client(t), redisstore.WithPrefix("cc"))
	l, err := tokenbucket.New(s, ratelimit.PerHour(5))
	if err != nil {
		t.Fatal(err)
	}
	before := masterCalls(t, cluster)
	const keys, each = 60, 8
	admitted := make([]atomic.Int64, keys)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range keys * each {
		wg.Go(func() {
			<-start
			d, err := l.Allow(context.Background(), fmt.Sprint("tenant-", i%keys))
			if err != nil {
				t.Error(err)
			}
			if d.Allowed {
				admitted[i%keys].Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	for k := range admitted {
		if admitted[k].Load() != 5 {
			t.Errorf("tenant-%d: %d of %d admitted; want 5", k, admitted[k].Load(), each)
		}
	}
	calls := masterCalls(t, cluster) - before
	if calls >= keys*each {
		t.Errorf("%d decisions took %d script calls; want them coalesced per master", keys*each, calls)
	}
	t.Logf("%d decisions in %d script calls on 3 masters", keys*each, calls)
}

// TestCoalescedMigration: a slot moves from one master to another (CLUSTER SETSLOT
// MIGRATING/IMPORTING, MIGRATE of its keys, SETSLOT NODE) while 32 callers decide on its
// keys: no decision is lost (no key admits more than its limit) and none is counted
// twice (every key admits its limit, less the decisions that failed).
func TestCoalescedMigration(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := cluster.Client(t)
	s := redisstore.New(client, redisstore.WithPrefix("mig"))
	const limit, keys, callers = 150, 8, 32
	l, err := tokenbucket.New(s, ratelimit.PerHour(limit))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := func(i int) string { return fmt.Sprintf("{mig}:%d", i) } // one slot for all
	slot, err := client.ClusterKeySlot(ctx, "mig").Result()
	if err != nil {
		t.Fatal(err)
	}
	src, err := client.MasterForKey(ctx, "{mig}")
	if err != nil {
		t.Fatal(err)
	}
	var dst *redis.Client
	for _, m := range cluster.Masters {
		if m.Addr != src.Options().Addr {
			dst = redis.NewClient(&redis.Options{Addr: m.Addr})
			defer dst.Close()
			break
		}
	}
	srcID, dstID := src.ClusterMyID(ctx).Val(), dst.ClusterMyID(ctx).Val()

	var admitted, failed [keys]atomic.Int64
	var wg sync.WaitGroup
	var sent atomic.Int64
	stop := make(chan struct{})
	for w := range callers {
		wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if sent.Add(1) > 2*limit*keys {
					return
				}
				k := i % keys
				d, err := l.Allow(ctx, name(k))
				switch {
				case err != nil:
					failed[k].Add(1)
				case d.Allowed:
					admitted[k].Add(1)
				}
			}
		})
	}
	redistest.Eventually(t, "the traffic under way", func() bool { return sent.Load() >= limit*keys/4 })
	host, port := dst.Options().Addr[:strings.LastIndexByte(dst.Options().Addr, ':')], dst.Options().Addr[strings.LastIndexByte(dst.Options().Addr, ':')+1:]
	must := func(err error) {
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatal(err)
		}
	}
	must(dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err())
	must(src.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err())
	for {
		ks, err := src.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		must(err)
		if len(ks) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range ks {
			args = append(args, k)
		}
		must(src.Do(ctx, args...).Err())
	}
	for _, m := range cluster.Masters {
		c := redis.NewClient(&redis.Options{Addr: m.Addr})
		must(c.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err())
		c.Close()
	}
	moved := sent.Load()
	wg.Wait()
	if moved >= 2*limit*keys {
		t.Errorf("the slot moved after the traffic had ended")
	}
	var fails int64
	for k := range failed {
		fails += failed[k].Load()
	}
	t.Logf("the slot moved while %d of %d decisions had been sent; %d failed", moved, 2*limit*keys, fails)
	for k := range keys {
		a, f := admitted[k].Load(), failed[k].Load()
		if a > limit || a+f < limit {
			t.Errorf("key %d: %d admitted, %d failed, of %d sent; want at most %d admitted, and %d less the failures at least",
				k, a, f, 2*limit, limit, limit)
		}
	}
	if d, err := l.Allow(ctx, name(0)); err != nil || d.Allowed {
		t.Errorf("after the move: %+v, %v; want the key spent, on its new master", d, err)
	}
}

// TestCoalescedReplyLost: while every reply comes later than the client's read timeout,
// the calls alone and the batch behind them are errors for each of their decisions, and
// none is sent again, though the client allows 3 retries: each decision is counted at
// most once (once if its script ran, not at all if it never left).
func TestCoalescedReplyLost(t *testing.T) {
	srv := redistest.Start(t)
	direct := srv.Client()
	p := redistest.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: p.Addr, ReadTimeout: 100 * time.Millisecond, MaxRetries: 3,
		MinRetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond, PoolSize: redisstore.MaxFlights + 2})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	s := redisstore.New(client, redisstore.WithPrefix("lostb")) // a pool of 4: MaxFlights at most
	// the scripts loaded and the connections warmed, so that no PING of a warming meets a
	// held reply: on a busy machine a new connection's handshake may take longer than the
	// 100ms read timeout, and the warming is tried again
	redistest.Eventually(t, "the scripts loaded and the connections warmed", func() bool {
		return s.LoadScripts(ctx, tokenbucket.Algorithm()) == nil
	})
	rule := ratelimit.PerHour(100)
	take := func(key string) error {
		_, err := s.Apply(ctx, core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(rule)}})
		return err
	}
	var wg sync.WaitGroup
	for i := range 30 { // warm up: both scripts loaded, connections open
		wg.Go(func() { take(fmt.Sprint("warm-", i)) })
	}
	wg.Wait()
	if calls := redistest.CommandCalls(t, direct, "evalsha"); calls >= 30 {
		t.Fatalf("the warm-up took %d script calls; want a batch", calls)
	}
	for range redisstore.MaxFlights + 1 { // connections open at once: one is left for the batch when the flights' close
		wg.Go(func() { client.BLPop(ctx, 10*time.Millisecond, "nothing") })
	}
	wg.Wait()
	before := redistest.CommandCalls(t, direct, "evalsha")
	p.HoldNext(1<<20, 300*time.Millisecond) // every reply from now on
	errs := make(chan error, redisstore.MaxFlights+5)
	var keys []string
	for i := range redisstore.MaxFlights { // one after the other, each a flight of its own
		key := fmt.Sprint("flight-", i)
		keys = append(keys, key)
		go func() { errs <- take(key) }()
		redistest.Eventually(t, "the flight runs, its reply held", func() bool {
			return redistest.CommandCalls(t, direct, "evalsha") >= before+i+1
		})
	}
	for i := range 5 { // queued behind the flights: one batch
		key := fmt.Sprint("batched-", i)
		keys = append(keys, key)
		go func() { errs <- take(key) }()
	}
	for range keys {
		if err := <-errs; !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Errorf("a decision whose reply came too late: %v; want ErrUnavailable", err)
		}
	}
	if calls := redistest.CommandCalls(t, direct, "evalsha") - before; calls != redisstore.MaxFlights+1 {
		t.Errorf("%d script calls; want %d (the flights alone, one batch of 5), none sent again", calls, redisstore.MaxFlights+1)
	}
	peeker := redisstore.New(direct, redisstore.WithPrefix("lostb"))
	for _, key := range keys {
		d, err := peeker.Apply(ctx, core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(rule), Op: core.OpPeek}})
		if err != nil || d.Remaining != 98 { // a peek answers as a take would: 98 left after one take
			t.Errorf("%s: a peek gives %+v, %v; want 98 left: taken once", key, d, err)
		}
	}
}

// panicHook makes the client panic on every script call while on is set.
type panicHook struct{ on *atomic.Bool }

func (panicHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() && strings.HasPrefix(cmd.Name(), "eval") {
			panic("the client broke")
		}
		return next(ctx, cmd)
	}
}
func (panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCoalescedClientPanics: a client that panics fails the decisions of a batch with
// ErrUnavailable instead of ending the process from the store's goroutine, and a panic
// of a call alone leaves no flight counted: once the client is well, decisions go on.
func TestCoalescedClientPanics(t *testing.T) {
	client := redistest.Start(t).Client()
	var on atomic.Bool
	client.AddHook(panicHook{&on})
	s := redisstore.New(client)
	take := func() (err error) {
		defer func() {
			if p := recover(); p != nil { // a call alone panics on its caller's goroutine
				err = fmt.Errorf("panicked: %v", p)
			}
		}()
		_, err = s.Apply(context.Background(), core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerHour(1_000_000))}})
		return err
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	on.Store(true)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if err := take(); err == nil {
				t.Error("a decision through a panicking client succeeded")
			}
		})
	}
	wg.Wait()
	on.Store(false)
	for i := range 50 {
		if err := take(); err != nil {
			t.Fatalf("decision %d after the client is well: %v", i, err)
		}
	}
}
