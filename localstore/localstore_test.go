package localstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

func TestConformance(t *testing.T) {
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return localstore.New(localstore.WithClock(clk))
	})
}

var start = limitertest.Start

func allow(t *testing.T, s ratelimit.Store, key string, n int64) core.Outcome {
	t.Helper()
	d, err := s.Apply(context.Background(), core.Request{Key: key, N: n, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerMinute(10))}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestMemoryBound drives 1,000,000 distinct keys through a store capped at 100,000 and
// checks both the count and the retained heap against the documented cost per key.
func TestMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("drives a million keys")
	}
	const (
		keys        = 1_000_000
		maxKeys     = 100_000
		bytesPerKey = 144 // the package doc says 128 for a key of 16 bytes, as here; room for the GC's noise
	)
	clk := clock.NewFake(start)
	before := heapInUse()
	s := localstore.New(localstore.WithClock(clk), localstore.WithMaxKeys(maxKeys))
	buf := []byte("key-")
	for i := range keys {
		buf = strconv.AppendInt(buf[:4], int64(i)+1e11, 10) // 16 bytes
		allow(t, s, string(buf), 1)
	}
	if n := s.Len(); n > maxKeys || n < maxKeys*9/10 {
		t.Errorf("Len = %d after %d keys; want at most %d, and near it", n, keys, maxKeys)
	}
	retained := heapInUse() - before
	t.Logf("%d keys retain %d bytes, %d per key", s.Len(), retained, retained/int64(s.Len()))
	if retained > maxKeys*bytesPerKey {
		t.Errorf("%d keys retain %d bytes; want at most %d", s.Len(), retained, maxKeys*bytesPerKey)
	}
	runtime.KeepAlive(s)
}

// TestByteBound: long keys are held only up to WithMaxBytes, however many come.
func TestByteBound(t *testing.T) {
	const maxBytes = 1 << 20
	before := heapInUse()
	s := localstore.New(localstore.WithMaxBytes(maxBytes))
	key := make([]byte, 16<<10)
	for i := range 2000 { // 32 MiB of keys
		copy(key, strconv.Itoa(i)+":")
		allow(t, s, string(key), 1)
	}
	if held := int64(s.Len()) * (16<<10 + 128); held > maxBytes || s.Len() < 32 {
		t.Errorf("%d keys of 16 KiB held (%d bytes); want at most %d bytes, and near it", s.Len(), held, maxBytes)
	}
	if retained := heapInUse() - before; retained > 2*maxBytes {
		t.Errorf("2000 keys of 16 KiB retain %d bytes; want about %d at most", retained, maxBytes)
	}
	runtime.KeepAlive(s)
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func TestNoAllocationsOnExistingKey(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	clk := clock.NewFake(start)
	// one shard (its byte cap is too small for two), so that both keys below are in one
	// table
	s := localstore.New(localstore.WithClock(clk), localstore.WithMaxBytes(64<<10))
	for _, k := range limitertest.Kinds {
		// two keys of one table with rules of their own, decided in turn: neither rule
		// stays the table's last
		req := core.Request{Key: "existing", N: 1, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(ratelimit.PerSecond(1000))}}
		other := core.Request{Key: "other", N: 1, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(ratelimit.PerMinute(5000))}}
		ctx := context.Background()
		for _, r := range []core.Request{req, other} {
			if _, err := s.Apply(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		allocs := testing.AllocsPerRun(1000, func() {
			clk.Advance(time.Millisecond)
			for _, r := range []core.Request{req, other} {
				if _, err := s.Apply(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per decision on an existing key; want 0", k.Name, allocs)
		}
	}
}

func TestDefaultClockIsReal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := localstore.New(localstore.WithClock(nil))
		if d := allow(t, s, "k", 10); !d.Allowed() {
			t.Fatal(d)
		}
		if d := allow(t, s, "k", 1); d.Allowed() || d.Wait != 6*time.Second {
			t.Fatalf("used-up key: %+v; want retry after 6s", d)
		}
		time.Sleep(6 * time.Second)
		if d := allow(t, s, "k", 1); !d.Allowed() {
			t.Errorf("6s later: %+v; want allowed", d)
		}
	})
}

// TestForgetsAtReset: a key past its reset counts for nothing, even before a sweep and
// under a rule that would still see its events (as on Redis, where its TTL has run out).
func TestForgetsAtReset(t *testing.T) {
	clk := clock.NewFake(start.Add(500 * time.Millisecond))
	s := localstore.New(localstore.WithClock(clk), localstore.WithSweepInterval(time.Hour))
	apply := func(rule ratelimit.Rule) core.Outcome {
		d, err := s.Apply(context.Background(), core.Request{Key: "k", N: 5, Spec: &core.Spec{Algorithm: fixedwindow.Algorithm(), Rule: core.Rule(rule)}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := apply(ratelimit.PerSecond(5)); !d.Allowed() || d.Reset != 500*time.Millisecond {
		t.Fatalf("5 per second: %+v", d)
	}
	// in the same minute, but the key was full again at 1s under the rule that counted it
	clk.Set(start.Add(1500 * time.Millisecond))
	if d := apply(ratelimit.PerMinute(5)); !d.Allowed() {
		t.Errorf("a key past its reset still counts under a new rule: %+v", d)
	}
}

func TestNewRejectsNilOption(t *testing.T) {
	defer func() {
		if msg, _ := recover().(string); msg != "localstore: New with a nil option" {
			t.Errorf("recovered %q; want a panic that says what is wrong", msg)
		}
	}()
	localstore.New(nil)
}

// TestManyNamespaces: past the few (algorithm, namespace) pairs a decision finds by a
// scan, the others live in maps; a limiter's takes and Apply's still count together in
// each namespace, and apart from every other.
func TestManyNamespaces(t *testing.T) {
	clk := clock.NewFake(start)
	s := localstore.New(localstore.WithClock(clk))
	ctx := context.Background()
	rule := ratelimit.PerMinute(2)
	limiters := make([]*tokenbucket.Limiter, 50)
	for i := range limiters {
		l, err := tokenbucket.New(s, rule, ratelimit.WithNamespace("ns-"+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		limiters[i] = l
	}
	for i, l := range limiters {
		if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("namespace %d: first take = %+v, %v; want allowed, 1 left", i, d, err)
		}
		d, err := s.Apply(ctx, core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "ns-" + strconv.Itoa(i), Rule: core.Rule(rule)}})
		if err != nil || !d.Allowed() || d.Remaining != 0 {
			t.Fatalf("namespace %d: Apply after the limiter = %+v, %v; want allowed, 0 left", i, d, err)
		}
		if d, err := l.Allow(ctx, "k"); err != nil || d.Allowed {
			t.Fatalf("namespace %d: third take = %+v, %v; want denied", i, d, err)
		}
	}
	if n := s.Len(); n != len(limiters) {
		t.Errorf("Len = %d; want one key per namespace, %d", n, len(limiters))
	}
	clk.Advance(time.Minute) // every key back to full, and swept with its table
	if d, err := limiters[40].Allow(ctx, "k"); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Errorf("after a minute: %+v, %v; want allowed, 1 left", d, err)
	}
	if n := s.Len(); n != 1 {
		t.Errorf("Len after the sweep = %d; want 1", n)
	}
}

// TestIncompleteAlgorithm: an algorithm without a function the store runs is an error on
// every path, never a panic, and takes no room.
func TestIncompleteAlgorithm(t *testing.T) {
	s := localstore.New()
	ctx := context.Background()
	noRefund := *tokenbucket.Algorithm()
	noRefund.Refund = nil
	for _, alg := range []*core.Algorithm{nil, &noRefund} {
		for _, op := range []core.Op{core.OpTake, core.OpPeek, core.OpRefund, core.OpReset} {
			req := core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(ratelimit.PerSecond(1)), Op: op}}
			if _, err := s.Apply(ctx, req); err == nil {
				t.Errorf("Apply(%v, op %q): no error", alg, op)
			}
		}
		if _, err := s.ApplyAll(ctx, []core.Request{{Key: "k", N: 1, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(ratelimit.PerSecond(1))}}}); err == nil {
			t.Errorf("ApplyAll(%v): no error", alg)
		}
	}
	if n := s.Len(); n != 0 {
		t.Errorf("Len = %d; want 0", n)
	}
}

// TestExactUnderChurn: keys decided from many goroutines, by takes and by atomic batches,
// admit exactly their limit while, beside them, other keys come and go in every shard:
// evicted when their shards are full, swept when they are back to full, reset.
func TestExactUnderChurn(t *testing.T) {
	clk := clock.NewFake(start)
	s := localstore.New(localstore.WithClock(clk), localstore.WithMaxKeys(4096), localstore.WithSweepInterval(time.Second))
	tb := tokenbucket.Algorithm()
	const limit, keys = 1000, 2
	counted := ratelimit.Rule{Limit: limit, Period: 1000 * time.Hour} // no refill in the 100s the test runs
	req := func(key string) core.Request {
		return core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: tb, Namespace: "counted", Rule: core.Rule(counted)}}
	}
	ctx := context.Background()
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 { // takes: twice the limit of each key
		wg.Go(func() {
			for i := range limit {
				k := (g + i) % keys
				d, err := s.Apply(ctx, req(strconv.Itoa(k)))
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed() {
					admitted[k].Add(1)
				}
			}
		})
	}
	for range 2 { // batches of two keys, all or none
		wg.Go(func() {
			for i := range limit {
				a, b := i%keys, (i+1)%keys
				ds, err := s.ApplyAll(ctx, []core.Request{req(strconv.Itoa(a)), req(strconv.Itoa(b))})
				if err != nil {
					t.Error(err)
					return
				}
				if ds[0].Allowed() && ds[1].Allowed() { // else the batch took nothing
					admitted[a].Add(1)
					admitted[b].Add(1)
				}
			}
		})
	}
	churn := func(key string, op core.Op) {
		_, err := s.Apply(ctx, core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: tb, Namespace: "churn", Rule: core.Rule(ratelimit.PerSecond(10)), Op: op}})
		if err != nil {
			t.Error(err)
		}
	}
	wg.Go(func() { // far more keys than the store holds: evictions in every shard
		for i := range 20000 {
			churn("churn-"+strconv.Itoa(i), core.OpTake)
		}
	})
	wg.Go(func() { // resets, and time for the sweeps (the churned keys are full in 100ms)
		for i := range 2000 {
			churn("churn-"+strconv.Itoa(i*7), core.OpReset)
			if i%20 == 0 {
				clk.Advance(time.Second)
			}
		}
	})
	wg.Wait()
	for k := range keys {
		if got := admitted[k].Load(); got != limit {
			t.Errorf("key %d admitted %d; want exactly %d", k, got, limit)
		}
		if d, err := s.Apply(ctx, core.Request{Key: strconv.Itoa(k), N: 1, Spec: &core.Spec{Algorithm: tb, Namespace: "counted", Rule: core.Rule(counted), Op: core.OpPeek}}); err != nil || d.Allowed() {
			t.Errorf("key %d after the test: %+v, %v; want used up", k, d, err)
		}
	}
	if n := s.Len(); n > 4096 {
		t.Errorf("Len = %d; want at most 4096", n)
	}
}
