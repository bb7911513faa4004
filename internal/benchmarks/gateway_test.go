package benchmarks

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/internal/trace"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// The lease harness: gateway instances sharing one Redis behind a delaying proxy, every
// tenant on the seed's rule, each instance deciding with one of the ways compared.

// seedRule is the target use's rule: 100 a second, bursts of 200.
var seedRule = ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 200}

const (
	gatewayInstances = 4
	gatewayTenants   = 1000
)

// instanceSplit is how the load is spread over the instances, in percent.
var instanceSplit = []float64{50, 25, 15, 10}

// gatewayLoad is the total offered load, requests a second (LEASE_LOAD), and how long
// each run lasts (LEASE_SECONDS).
func gatewayLoad() (perSecond float64, d time.Duration) {
	perSecond, d = 8000, 15*time.Second
	if v, err := strconv.ParseFloat(os.Getenv("LEASE_LOAD"), 64); err == nil && v > 0 {
		perSecond = v
	}
	if v, err := strconv.Atoi(os.Getenv("LEASE_SECONDS")); err == nil && v > 2 {
		d = time.Duration(v) * time.Second
	}
	return perSecond, d
}

// gatewayInstance decides one instance's requests.
type gatewayInstance interface {
	allow(ctx context.Context, tenant string) (bool, error)
	close()
}

// way is one way of deciding, compared side by side: it opens one of instances on a
// client of its own. A way that is a Store (and its Leases, if any) says how it makes
// one, so that other limiters may be built on it.
type way struct {
	name  string
	open  func(b *testing.B, client *redis.Client, prefix string, instances int) gatewayInstance
	store func(b *testing.B, client *redis.Client, prefix string, instances int) (ratelimit.Store, *hotkey.Leases)
}

// storeWay is the way of the stores that store makes, each instance deciding the seed's
// rule with a token bucket on its own.
func storeWay(name string, store func(b *testing.B, c *redis.Client, prefix string, n int) (ratelimit.Store, *hotkey.Leases)) way {
	return way{name: name, store: store, open: func(b *testing.B, c *redis.Client, prefix string, n int) gatewayInstance {
		s, leases := store(b, c, prefix, n)
		return newLimiterInstance(b, s, leases)
	}}
}

var ways = []way{
	storeWay("exact", func(b *testing.B, c *redis.Client, prefix string, n int) (ratelimit.Store, *hotkey.Leases) {
		return exactStore(c, prefix, n), nil
	}),
	storeWay("leases", func(b *testing.B, c *redis.Client, prefix string, n int) (ratelimit.Store, *hotkey.Leases) {
		opts := []hotkey.LeasesOption{hotkey.WithInstanceCount(func() int { return n })}
		if d, err := time.ParseDuration(os.Getenv("LEASE_REFILL")); err == nil {
			opts = append(opts, hotkey.WithRefill(d))
		}
		if d, err := time.ParseDuration(os.Getenv("LEASE_TTL")); err == nil {
			opts = append(opts, hotkey.WithLeaseTTL(d))
		}
		p, err := hotkey.NewLeases(exactStore(c, prefix, n), opts...)
		if err != nil {
			b.Fatal(err)
		}
		return p, p
	}),
	storeWay("leases-no-trust", func(b *testing.B, c *redis.Client, prefix string, n int) (ratelimit.Store, *hotkey.Leases) {
		p, err := hotkey.NewLeases(exactStore(c, prefix, n), hotkey.WithInstanceCount(func() int { return n }), hotkey.WithTrust(0))
		if err != nil {
			b.Fatal(err)
		}
		return p, p
	}),
	{name: "async-sync", open: func(b *testing.B, c *redis.Client, prefix string, _ int) gatewayInstance {
		return newAsyncSync(c, prefix, 200*time.Millisecond)
	}},
}

// exactStore is the gateway's store of today: Redis behind the fallback store, each of
// n instances holding 1/n of every rule while Redis is away.
func exactStore(c *redis.Client, prefix string, n int) ratelimit.Store {
	return fallback.New(redisstore.New(c, redisstore.WithPrefix(prefix)), localstore.New(),
		fallback.WithInstances(n))
}

type limiterInstance struct {
	limiter *tokenbucket.Limiter
	leases  *hotkey.Leases                 // nil but for leases
	rule    atomic.Pointer[ratelimit.Rule] // the rule every decision is under from now, where it changed
}

func newLimiterInstance(b *testing.B, store ratelimit.Store, leases *hotkey.Leases) *limiterInstance {
	l, err := tokenbucket.New(store, seedRule, ratelimit.WithNamespace("gateway"))
	if err != nil {
		b.Fatal(err)
	}
	return &limiterInstance{limiter: l, leases: leases}
}

func (in *limiterInstance) allow(ctx context.Context, tenant string) (bool, error) {
	if rule := in.rule.Load(); rule != nil {
		d, err := in.limiter.AllowRule(ctx, tenant, *rule, 1)
		return d.Allowed, err
	}
	d, err := in.limiter.Allow(ctx, tenant)
	return d.Allowed, err
}

func (in *limiterInstance) close() {
	if in.leases != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		in.leases.Close(ctx)
	}
}

// asyncSync is the field's asynchronous counters (Kong's sync_rate, APISIX's delayed
// sync): each instance counts in memory in fixed windows of a second, admits while the
// last count it read from Redis plus its own unsynced count is under the limit, and
// every interval adds its counts to Redis and reads the totals back, in one pipeline.
type asyncSync struct {
	client   *redis.Client
	prefix   string
	mu       sync.Mutex
	counts   map[string]*asyncCount
	stop     chan struct{}
	done     chan struct{}
	interval time.Duration
}

type asyncCount struct {
	window        int64 // the second it counts
	local, global int64 // unsynced here; the total Redis had at the last sync
}

func newAsyncSync(c *redis.Client, prefix string, interval time.Duration) *asyncSync {
	a := &asyncSync{client: c, prefix: prefix, counts: map[string]*asyncCount{}, stop: make(chan struct{}),
		done: make(chan struct{}), interval: interval}
	go a.run()
	return a
}

func (a *asyncSync) allow(_ context.Context, tenant string) (bool, error) {
	w := time.Now().Unix()
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.counts[tenant]
	if c == nil {
		c = &asyncCount{}
		a.counts[tenant] = c
	}
	if c.window != w {
		*c = asyncCount{window: w}
	}
	if c.global+c.local >= seedRule.Limit {
		return false, nil
	}
	c.local++
	return true, nil
}

func (a *asyncSync) run() {
	defer close(a.done)
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
			a.sync()
		}
	}
}

// sync adds every tenant's unsynced count to Redis, and reads back the total.
func (a *asyncSync) sync() {
	type pending struct {
		c   *asyncCount
		n   int64
		cmd *redis.IntCmd
	}
	var ps []pending
	pipe := a.client.Pipeline()
	a.mu.Lock()
	for tenant, c := range a.counts {
		if c.local > 0 {
			key := a.prefix + ":" + tenant + ":" + strconv.FormatInt(c.window, 10)
			ps = append(ps, pending{c: c, n: c.local, cmd: pipe.IncrBy(context.Background(), key, c.local)})
			pipe.Expire(context.Background(), key, 2*time.Second)
			c.local = 0
		}
	}
	a.mu.Unlock()
	if len(ps) == 0 {
		return
	}
	pipe.Exec(context.Background())
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range ps {
		if v, err := p.cmd.Result(); err == nil {
			p.c.global = v
		}
	}
}

func (a *asyncSync) close() {
	close(a.stop)
	<-a.done
}

// zipf draws tenants: tenant k (from 0) with a weight of 1/(k+1).
type zipf struct{ cum []float64 }

func newZipf(n int) *zipf {
	z := &zipf{cum: make([]float64, n)}
	sum := 0.0
	for k := range n {
		sum += 1 / float64(k+1)
		z.cum[k] = sum
	}
	for k := range z.cum {
		z.cum[k] /= sum
	}
	return z
}

func (z *zipf) draw(rng *rand.Rand) int {
	i, _ := slices.BinarySearch(z.cum, rng.Float64())
	return min(i, len(z.cum)-1)
}

// share is tenant k's part of the load.
func (z *zipf) share(k int) float64 {
	if k == 0 {
		return z.cum[0]
	}
	return z.cum[k] - z.cum[k-1]
}

// run is one run's record: every decision's time, and what each tenant was admitted, by
// second, and the busiest tenants' by 100ms.
type run struct {
	start     time.Time
	seconds   int
	admitted  [][]atomic.Int64 // [tenant][second]
	watched   int              // the tenant whose admissions are also counted by 100ms
	fine      []atomic.Int64
	busiest   [][]atomic.Int64 // the first busy tenants' admissions, [tenant][100ms]
	shards    [64]sampleShard
	errors    atomic.Int64
	decisions atomic.Int64
	shares    atomic.Int64 // decisions of the fallback's shares (Redis too slow, or away)
}

// busyTenants is how many of the busiest tenants (the first, by Zipf) are counted by
// 100ms, for the fewest and the most admitted in a sliding second.
const busyTenants = 50

// sample is one decision: the time it added from the instant it was due (the load
// generator's lateness included), the time of the limiter's call alone, its tenant, and
// whether a lease made it.
type sample struct {
	took, call time.Duration
	tenant     int32
	leased     bool
}

type sampleShard struct {
	mu      sync.Mutex
	samples []sample
	late    []time.Duration // how late each request started after it was due
}

func newRun(tenants int, d time.Duration) *run {
	r := &run{start: time.Now(), seconds: int(d/time.Second) + 2, watched: -1}
	r.fine = make([]atomic.Int64, 10*r.seconds)
	r.admitted = make([][]atomic.Int64, tenants)
	for i := range r.admitted {
		r.admitted[i] = make([]atomic.Int64, r.seconds)
	}
	r.busiest = make([][]atomic.Int64, min(tenants, busyTenants))
	for i := range r.busiest {
		r.busiest[i] = make([]atomic.Int64, 10*r.seconds)
	}
	return r
}

// router chooses each request's tenant and instance, at at into the run.
type router func(rng *rand.Rand, at time.Duration) (tenant, instance int)

// spread is the harness's router: tenants by z, instances by split (percent).
func spread(z *zipf, split []float64) router {
	cum := make([]float64, len(split))
	total := 0.0
	for i, s := range split {
		total += s
		cum[i] = total
	}
	return func(rng *rand.Rand, _ time.Duration) (int, int) {
		i, _ := slices.BinarySearch(cum, rng.Float64()*total)
		return z.draw(rng), min(i, len(split)-1)
	}
}

// drive offers perSecond requests a second for d, routed by route, open-loop: each
// request starts on a goroutine of its own at the instant it is due, whatever the others
// are doing, and its time counts from that instant (how late it started is recorded
// apart): every decision into r.
func drive(ins []gatewayInstance, tenants []string, route router, perSecond float64, d time.Duration, r *run) {
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(1, 2))
	seq := 0
	for sent, total := 0, int(perSecond*d.Seconds()); sent < total; sent++ {
		due := r.start.Add(time.Duration(float64(sent) / perSecond * float64(time.Second)))
		if wait := time.Until(due); wait > 500*time.Microsecond { // the timer's own granularity: those due sooner start now
			time.Sleep(wait)
		}
		k, i := route(rng, due.Sub(r.start))
		seq++
		shard := &r.shards[seq%len(r.shards)]
		wg.Go(func() {
			started := time.Now()
			ctx, rec := trace.With(context.Background())
			ok, err := ins[i].allow(ctx, tenants[k])
			from := due
			if started.Before(due) {
				from = started // started early: from the start
			}
			took, call := time.Since(from), time.Since(started)
			shard.mu.Lock()
			shard.samples = append(shard.samples, sample{took: took, call: call, tenant: int32(k), leased: rec.Source() == hotkey.Source})
			shard.late = append(shard.late, max(0, started.Sub(due)))
			shard.mu.Unlock()
			if rec.Source() == fallback.Secondary.String() {
				r.shares.Add(1)
			}
			r.decisions.Add(1)
			if err != nil {
				r.errors.Add(1)
				return
			}
			if ok {
				if s := int(due.Sub(r.start) / time.Second); s < r.seconds {
					r.admitted[k][s].Add(1)
				}
				f := int(due.Sub(r.start) / (100 * time.Millisecond))
				if k == r.watched && f < len(r.fine) {
					r.fine[f].Add(1)
				}
				if k < len(r.busiest) && f < len(r.busiest[k]) {
					r.busiest[k][f].Add(1)
				}
			}
		})
	}
	wg.Wait()
}

// percentile is the p-th percentile (0 to 1) of ds, sorted.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(math.Ceil(p*float64(len(ds))))-1)]
}

// redisStats is what INFO says of a server: its script calls, and its CPU, in
// microseconds.
func redisStats(b *testing.B, c *redis.Client) (calls, cpu float64) {
	info, err := c.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		for _, cmd := range []string{"evalsha", "eval", "incrby"} {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				n, _ := strconv.ParseFloat(strings.SplitN(rest, ",", 2)[0], 64)
				calls += n
			}
		}
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if rest, ok := strings.CutPrefix(line, k); ok {
				s, _ := strconv.ParseFloat(rest, 64)
				cpu += s * 1e6
			}
		}
	}
	return calls, cpu
}

// BenchmarkLeaseGateway: four gateway instances (50/25/15/10% of the load) deciding 1,000
// tenants on the seed's rule, Zipf-distributed (tenant k asked 1/k as often as the
// first), on one Redis behind a proxy that adds a round trip, each way of deciding side
// by side at each round trip, the requests arriving open-loop (see drive). Run it once:
// -benchtime 1x. Each run reports, over every decision, the latency a decision adds (p50,
// p99, p99.9; the ten busiest tenants' p99 apart), how late the generator started
// requests, the share decided from memory, Redis's script calls and CPU per decision,
// errors, and the accuracy of the tenants asked twice their rule or more: their admitted
// over each 10 seconds after the first two (the bucket's burst) against the rule's 1,000,
// lowest and highest, the fewest in a sliding second against its rate and the most
// against its burst and a second's rate, and the most any tenant was admitted in one
// second.
func BenchmarkLeaseGateway(b *testing.B) {
	srv := redistest.Start(b)
	for _, rtt := range []struct {
		name          string
		delay, jitter time.Duration
	}{
		{"rtt-0.2ms", 200 * time.Microsecond, 0},
		{"rtt-1ms", time.Millisecond, 0},
		{"rtt-2.5ms", 2500 * time.Microsecond, 0},
		{"rtt-2.5ms-jitter-50pct", 2500 * time.Microsecond, 1250 * time.Microsecond},
		{"rtt-8ms", 8 * time.Millisecond, 0},
	} {
		for _, w := range ways {
			b.Run(rtt.name+"/"+w.name, func(b *testing.B) {
				gatewayRun(b, srv, w, gatewayInstances, gatewayTenants, instanceSplit, rtt.delay, rtt.jitter)
			})
		}
	}
}

// BenchmarkLeaseSeed: the seed's shape as far as this 2-core machine carries it: 20
// instances (a client each, 5% of the load each, as a load balancer spreads it), 100,000
// tenants on the seed's rule, Zipf, on Redis 1ms away, LEASE_LOAD requests a second
// (8,000 by default) for LEASE_SECONDS, open-loop, with the figures of
// BenchmarkLeaseGateway. Redis's CPU per decision says what 50,000 requests a second
// would cost it. Run it once: -benchtime 1x.
func BenchmarkLeaseSeed(b *testing.B) {
	const instances, tenants = 20, 100_000
	srv := redistest.Start(b)
	split := make([]float64, instances)
	for i := range split {
		split[i] = 1
	}
	for _, w := range ways[:3] { // exact, leases, leases-no-trust
		b.Run(w.name, func(b *testing.B) {
			gatewayRun(b, srv, w, instances, tenants, split, time.Millisecond, 0)
		})
	}
}

// gatewayRun drives n instances of way w, on srv behind a proxy that adds delay (give or
// take jitter), with the harness's load over tenants (Zipf), split over the instances
// (percent), and reports the run's figures.
func gatewayRun(b *testing.B, srv *redistest.Server, w way, n, tenants int, split []float64, delay, jitter time.Duration) {
	perSecond, d := gatewayLoad()
	direct := srv.Client()
	ins, _ := openGateway(b, srv, w, n, delay, jitter)
	names := tenantNames(tenants)
	z := newZipf(tenants)
	calls0, cpu0 := redisStats(b, direct)
	r := newRun(tenants, d)
	for range b.N {
		drive(ins, names, spread(z, split), perSecond, d, r)
	}
	calls1, cpu1 := redisStats(b, direct)
	var st hotkey.LeasesStats
	for _, in := range ins {
		if li, ok := in.(*limiterInstance); ok && li.leases != nil {
			st = addStats(st, li.leases.Stats())
		}
		in.close()
	}
	report(b, r, z, perSecond, calls1-calls0, cpu1-cpu0, st)
}

// addStats is a and b together, the counts of several instances.
func addStats(a, b hotkey.LeasesStats) hotkey.LeasesStats {
	a.Local += b.Local
	a.Exact += b.Exact
	a.Trusted += b.Trusted
	a.Short += b.Short
	a.Refills += b.Refills
	a.Loans += b.Loans
	return a
}

// openGateway opens n instances of way w, each on a client of its own through a proxy
// that adds delay (give or take jitter) to Redis's replies; the instances close with b.
func openGateway(b *testing.B, srv *redistest.Server, w way, n int, delay, jitter time.Duration) ([]gatewayInstance, []*redis.Client) {
	ins, clients, _ := openBehind(b, srv, w, n, delay, jitter)
	return ins, clients
}

// openBehind is openGateway, and the proxy the instances reach Redis through.
func openBehind(b *testing.B, srv *redistest.Server, w way, n int, delay, jitter time.Duration) ([]gatewayInstance, []*redis.Client, *redistest.Proxy) {
	proxy := redistest.StartProxy(b, srv.Addr)
	proxy.SetDelay(delay)
	proxy.SetJitter(jitter)
	prefix := fmt.Sprintf("gw%d", rand.Int64())
	ins := make([]gatewayInstance, n)
	clients := make([]*redis.Client, n)
	for i := range ins {
		c := redis.NewClient(&redis.Options{Addr: proxy.Addr, PoolSize: 32, MaxRetries: -1,
			ReadTimeout: time.Second, WriteTimeout: time.Second})
		b.Cleanup(func() { c.Close() })
		ins[i], clients[i] = w.open(b, c, prefix, n), c
	}
	return ins, clients, proxy
}

func tenantNames(n int) []string {
	tenants := make([]string, n)
	for k := range tenants {
		tenants[k] = "tenant-" + strconv.Itoa(k)
	}
	return tenants
}

// report reports one run's figures: over every decision, and the ten busiest tenants'
// apart (reportTimes), and the accuracy of the tenants asked twice their rule or more.
func report(b *testing.B, r *run, z *zipf, perSecond, calls, cpu float64, st hotkey.LeasesStats) {
	reportTimes(b, r, calls, cpu, st)
	over := func(k int) bool { return z.share(k)*perSecond >= 2*float64(seedRule.Limit) }
	lo, hi := accuracy(r, over, 2, r.seconds-2)
	b.ReportMetric(lo, "over-rule-10s-min")
	b.ReportMetric(hi, "over-rule-10s-max")
	least, most := slidingSecond(r, over)
	b.ReportMetric(least, "over-rule-1s-least/rate")
	b.ReportMetric(most, "over-rule-1s-most/(burst+rate)")
	b.ReportMetric(float64(mostInASecond(r)), "most-in-1s")
}

// reportTimes reports, over every decision of r (the ten busiest tenants' apart), the time
// each added, how late the generator ran, the time of the limiter's calls, the share
// decided from memory, Redis's calls and CPU per decision, errors and the fallback's
// share; and where leases decide, the share of decisions that took the exact path, that
// were admitted on trust (WithTrust), and of the calls to Lend; and how many events on
// trust found their key spent when charged.
func reportTimes(b *testing.B, r *run, calls, cpu float64, st hotkey.LeasesStats) {
	var all, inCall, busiest, late []time.Duration
	leased := 0
	for i := range r.shards {
		for _, s := range r.shards[i].samples {
			all, inCall = append(all, s.took), append(inCall, s.call)
			if s.tenant < 10 {
				busiest = append(busiest, s.took)
			}
			if s.leased {
				leased++
			}
		}
		late = append(late, r.shards[i].late...)
	}
	slices.Sort(all)
	slices.Sort(inCall)
	slices.Sort(busiest)
	slices.Sort(late)
	n := float64(r.decisions.Load())
	b.ReportMetric(float64(percentile(all, 0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(all, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(percentile(all, 0.999).Microseconds()), "p99.9-µs")
	b.ReportMetric(float64(percentile(busiest, 0.99).Microseconds()), "busiest10-p99-µs")
	b.ReportMetric(float64(percentile(late, 0.99).Microseconds()), "late-p99-µs")
	b.ReportMetric(float64(percentile(inCall, 0.99).Microseconds()), "call-p99-µs")
	b.ReportMetric(n/float64(r.seconds-2), "decisions/s")
	b.ReportMetric(calls/n, "redis-calls/decision")
	b.ReportMetric(cpu/n, "redis-cpu-µs/decision")
	b.ReportMetric(float64(leased)/n, "from-memory")
	if st.Local+st.Exact > 0 {
		b.ReportMetric(float64(st.Exact)/n, "exact-path/decision")
		b.ReportMetric(float64(st.Trusted)/n, "trusted/decision")
		b.ReportMetric(float64(st.Refills)/n, "lend-calls/decision")
		b.ReportMetric(float64(st.Loans)/n, "loans/decision")
		b.ReportMetric(float64(st.Short), "short-events")
	}
	b.ReportMetric(float64(r.errors.Load()), "errors")
	b.ReportMetric(float64(r.shares.Load())/n, "from-shares")
}

// slidingSecond is, over the busiest tenants asked selects, the fewest admitted in any
// sliding second after the first two, against the rule's rate, and the most in any, against
// its burst and a second's rate.
func slidingSecond(r *run, asked func(k int) bool) (least, most float64) {
	least = math.Inf(1)
	for k := range r.busiest {
		if !asked(k) {
			continue
		}
		slots := r.busiest[k][:10*(r.seconds-2)]
		for f := 0; f+10 <= len(slots); f++ {
			sum := int64(0)
			for i := f; i < f+10; i++ {
				sum += slots[i].Load()
			}
			if f >= 20 {
				least = min(least, float64(sum)/float64(seedRule.Limit))
			}
			most = max(most, float64(sum)/float64(seedRule.Burst+seedRule.Limit))
		}
	}
	if math.IsInf(least, 1) {
		least = 0
	}
	return least, most
}

// accuracy is the lowest and the highest, over the tenants asked selects and every 10
// whole seconds from the from-th up to the to-th, of what a tenant was admitted against
// the rule's 1,000.
func accuracy(r *run, asked func(k int) bool, from, to int) (lo, hi float64) {
	lo = math.Inf(1)
	for k := range r.admitted {
		if !asked(k) {
			continue
		}
		for s0 := from; s0+10 <= to; s0++ {
			sum := int64(0)
			for s := s0; s < s0+10; s++ {
				sum += r.admitted[k][s].Load()
			}
			ratio := float64(sum) / (10 * float64(seedRule.Limit))
			lo, hi = min(lo, ratio), max(hi, ratio)
		}
	}
	return lo, hi
}

// mostInASecond is the most any tenant was admitted in one second.
func mostInASecond(r *run) int64 {
	most := int64(0)
	for k := range r.admitted {
		for s := range r.seconds {
			most = max(most, r.admitted[k][s].Load())
		}
	}
	return most
}
