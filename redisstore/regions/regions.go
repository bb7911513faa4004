// Package regions splits every limit between regions that each decide on a Redis of
// their own, in proportion to where the traffic is (see Regions).
package regions

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
)

// Regions splits every limit between regions that each decide on a Redis of their own
// (a gateway in Europe and one in the US cannot reach one Redis within 2ms), in
// proportion to where the traffic is, and moves the proportions as the traffic moves:
//
//	split, err := regions.New("eu", map[string]redis.Scripter{"eu": euClient, "us": usClient})
//	go split.Run(ctx)
//	limiter, err := tokenbucket.New(split.Store(redisstore.New(euClient)), rule, ratelimit.WithNamespace("api"))
//
// # Weights
//
// Each region enforces its weight of every rule (core.Portion, in thousandths), per
// family of limits (a request's namespace unless WithFamily says otherwise), so
// that the regions together never admit more than the rule: the shares are rounded
// down, and a rule too small to split is an error (wrapping ratelimit.ErrInvalidRule),
// but for an in-flight limit (ratelimit.InFlightLimiter), where each region holds at
// least one lease. Weights start equal.
//
// # Demand and rebalancing
//
// Every take is counted as demand (admitted or denied) in memory, in the interval it is
// made in, and each instance adds its counts to its own region's Redis every second (one
// HINCRBY per family, into a hash per interval; an instance cut off from its Redis adds
// them to the intervals they were made in when it reconnects), and marks the interval
// as reported. Every interval (WithInterval, 5 minutes by default), one instance of
// the leader region (the first name in order; one instance, by a lock in its Redis),
// once every region has reported since the interval just ended (or after half an
// interval, for a region with no instance), reads each region's demand of the interval
// just ended and moves each family's weights
// toward the regions' shares of it: by at most a step (WithStep, 100 thousandths),
// never below a floor per region (WithFloor, 100 thousandths). It writes each
// region's new weight into that region's own Redis, lowered weights first, and stops at
// the first region it cannot reach: so the weights in force never add up to more than
// the whole. A raised weight takes effect only after a grace (WithGrace, three
// seconds), by which time every instance of the lowered regions has read its lowered
// weight (instances read theirs every second). A leader that cannot read every region's
// demand leaves every weight as it is: a region cut off keeps its last weights.
//
// The bound: at any instant the weights in force add up to at most the whole, as long as
// every instance reads its weights within the grace. A window of a rule in which no
// weight moves sees the regions admit at most the rule, as one limiter on one Redis
// would; a window in which they move, at most the rule plus the moves' step of it (a
// region may have spent its old, larger share before its weight went down, and another
// spend its new one after its went up): with the default step, 1.1 times the rule. An
// instance that cannot reach its own Redis keeps the weights it last read, and decides
// as its store does (the fallback store's shares, say).
//
// Nothing of it is on a request's path but a clock read (the take's interval), a map
// lookup and an atomic add. Run does the reading, the counting and the rebalancing in the
// background; Flush, Refresh and Rebalance do one round each, for tests and for
// applications that schedule their own.
type Regions struct {
	self    string
	names   []string // sorted; names[0] leads
	clients map[string]redis.Scripter
	prefix  string
	family  func(ratelimit.Request) string

	interval, grace, refresh, flush time.Duration
	floor, step                     int64
	clock                           clock.Clock

	weights atomic.Pointer[map[string]weight] // this region's, by family
	demand  sync.Map                          // demandOf -> *atomic.Int64: takes since the last flush
	onError func(error)                       // Run's errors (WithOnError); nil: none
}

// demandOf is what one counter of demand counts: the takes of a family in one interval.
type demandOf struct {
	family string
	bucket int64
}

// weight is one family's weight in this region: old until effective, then new (a raised
// weight waits for its grace; a lowered one is in force at once).
type weight struct {
	bucket    int64 // the interval it was decided for
	old, new  int64 // thousandths
	effective int64 // UnixNano
}

// Option configures Regions.
type Option interface{ apply(*Regions) }

type optionFunc func(*Regions)

func (f optionFunc) apply(r *Regions) { f(r) }

// WithInterval sets how often the weights move (5 minutes by default), and the
// interval whose demand each move reads.
func WithInterval(d time.Duration) Option {
	return optionFunc(func(r *Regions) {
		if d > 0 {
			r.interval = d
		}
	})
}

// WithStep bounds how far a weight moves in one interval, in thousandths (100 by
// default).
func WithStep(thousandths int64) Option {
	return optionFunc(func(r *Regions) {
		if thousandths > 0 {
			r.step = thousandths
		}
	})
}

// WithFloor is the least weight of a region, in thousandths (100 by default), so
// that a region whose traffic stopped can still serve when it comes back. It is lowered
// to an equal share when the regions are too many for it.
func WithFloor(thousandths int64) Option {
	return optionFunc(func(r *Regions) {
		if thousandths >= 0 {
			r.floor = thousandths
		}
	})
}

// WithGrace sets how long a raised weight waits before it is in force (3s by
// default): longer than it takes every instance to read its weights (every second).
func WithGrace(d time.Duration) Option {
	return optionFunc(func(r *Regions) {
		if d > 0 {
			r.grace = d
		}
	})
}

// WithFamily sets the family of a request, whose weights move together (its
// namespace by default: every key of a limiter moves with the others). Keep the families
// few: each is a field of a hash in every region's Redis.
func WithFamily(f func(ratelimit.Request) string) Option {
	return optionFunc(func(r *Regions) {
		if f != nil {
			r.family = f
		}
	})
}

// WithOnError has f called with each error of a round of Run (a region's Redis that
// cannot be read, say), for logs and metrics; Run goes on whatever f does. Nil means none.
func WithOnError(f func(error)) Option {
	return optionFunc(func(r *Regions) { r.onError = f })
}

// WithClock sets the clock of intervals and graces (the system's by default).
func WithClock(c clock.Clock) Option {
	return optionFunc(func(r *Regions) {
		if c != nil {
			r.clock = c
		}
	})
}

// WithPrefix starts the keys of the demand, the weights and the lock with prefix
// (redisstore.DefaultPrefix by default).
func WithPrefix(prefix string) Option {
	return optionFunc(func(r *Regions) {
		if prefix != "" {
			r.prefix = redisx.Prefix(prefix)
		}
	})
}

// New returns the Regions of self among clients, one client per region's Redis
// (self's included). It makes no call to Redis. The error says what is wrong with the
// regions: fewer than two, self not among them, a nil client.
func New(self string, clients map[string]redis.Scripter, opts ...Option) (*Regions, error) {
	if len(clients) < 2 {
		return nil, fmt.Errorf("regions: %d region(s); a split needs two or more", len(clients))
	}
	if _, ok := clients[self]; !ok {
		return nil, fmt.Errorf("regions: %q is not one of the regions", self)
	}
	r := &Regions{self: self, clients: clients, prefix: redisx.DefaultPrefix,
		family:   func(req ratelimit.Request) string { return req.Spec.Namespace },
		interval: 5 * time.Minute, grace: 3 * time.Second, refresh: time.Second, flush: time.Second,
		floor: 100, step: 100, clock: clock.Real{}}
	for name, c := range clients {
		if core.IsNil(c) {
			return nil, fmt.Errorf("regions: region %q has a nil client", name)
		}
		r.names = append(r.names, name)
	}
	slices.Sort(r.names)
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("regions: a nil option")
		}
		o.apply(r)
	}
	r.floor = min(r.floor, 1000/int64(len(r.names)))
	empty := map[string]weight{}
	r.weights.Store(&empty)
	return r, nil
}

// Weight is this region's weight of family now, in thousandths.
func (r *Regions) Weight(family string) int64 {
	w, ok := (*r.weights.Load())[family]
	if !ok {
		return 1000 / int64(len(r.names))
	}
	if r.clock.Now().UnixNano() < w.effective {
		return min(w.old, w.new)
	}
	return w.new
}

// Store wraps next, this region's store, so that each request is decided under this
// region's weight of its rule, and each take counts as demand.
func (r *Regions) Store(next ratelimit.Store) ratelimit.Store { return &regionStore{r, next} }

type regionStore struct {
	r    *Regions
	next ratelimit.Store
}

func (s *regionStore) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	fam := s.r.family(req)
	share, err := s.share(req, fam)
	if err != nil {
		return ratelimit.Outcome{}, err
	}
	if req.Spec.Op == "" && req.N > 0 {
		s.r.count(fam, req.N)
	}
	req.Spec = core.WithRule(req.Spec, share)
	return s.next.Apply(ctx, req)
}

// share is this region's weight of req's rule: exact (core.Portion), or for an in-flight
// limit at least one lease, as the fallback's shares.
func (s *regionStore) share(req ratelimit.Request, family string) (ratelimit.Rule, error) {
	w := s.r.Weight(family)
	if core.OfLeases(req.Spec.Algorithm) {
		return core.PortionLeases(req.Spec.Rule, w, 1000), nil
	}
	share, err := core.Portion(req.Spec.Rule, w, 1000)
	if err != nil {
		return ratelimit.Rule{}, fmt.Errorf("regions: region %s: %w", s.r.self, err)
	}
	return share, nil
}

// ApplyAll decides reqs all or none, each under this region's weight of its rule, when
// the region's store can (a ratelimit.BatchStore); otherwise it returns an error matching
// errors.ErrUnsupported, having counted nothing, and ratelimit.ApplyAll takes them one
// by one.
func (s *regionStore) ApplyAll(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Outcome, error) {
	bs, ok := s.next.(ratelimit.BatchStore)
	if !ok {
		return nil, fmt.Errorf("regions: region %s: its store decides no batches: %w", s.r.self, errors.ErrUnsupported)
	}
	scaled := make([]ratelimit.Request, len(reqs))
	for i, req := range reqs {
		share, err := s.share(req, s.r.family(req))
		if err != nil {
			return nil, err
		}
		scaled[i] = req
		scaled[i].Spec = core.WithRule(req.Spec, share)
	}
	ds, err := bs.ApplyAll(ctx, scaled)
	if err == nil || !errors.Is(err, errors.ErrUnsupported) {
		for _, req := range reqs {
			if req.Spec.Op == "" && req.N > 0 {
				s.r.count(s.r.family(req), req.N)
			}
		}
	}
	return ds, err
}

// count adds n takes of family to the demand of the interval now in: no lock once the
// family has a counter for it.
func (r *Regions) count(family string, n int64) {
	r.countIn(demandOf{family, r.bucket(r.clock.Now())}, n)
}

func (r *Regions) countIn(of demandOf, n int64) {
	c, ok := r.demand.Load(of)
	if !ok {
		c, _ = r.demand.LoadOrStore(of, new(atomic.Int64))
	}
	c.(*atomic.Int64).Add(n)
}

// bucket is the index of the interval of now.
func (r *Regions) bucket(now time.Time) int64 { return now.UnixNano() / int64(r.interval) }

func (r *Regions) demandKey(bucket int64) string { return redisx.RegionsDemand(r.prefix, bucket) }

func (r *Regions) weightsKey() string { return redisx.RegionsWeights(r.prefix) }

func (r *Regions) reportedKey(bucket int64) string { return redisx.RegionsReported(r.prefix, bucket) }

// The scripts of regions (their clients run scripts only: redis.Scripter).
var (
	//go:embed flush.lua
	flushSource string
	flushScript = redis.NewScript(flushSource)
	//go:embed setweight.lua
	setWeightSource string
	setWeightScript = redis.NewScript(setWeightSource)
	//go:embed read.lua
	readSource string
	readScript = redis.NewScript(readSource)
	//go:embed reported.lua
	reportedSource string
	reportedScript = redis.NewScript(reportedSource)
	//go:embed lock.lua
	lockSource string
	lockScript = redis.NewScript(lockSource)
)

// Flush adds the demand counted since the last flush to this region's Redis, each take
// in the interval it was made in, however late the flush (a region cut off from its
// Redis keeps its demand until it can), and marks the interval now in as reported by
// this region: the leader moves no weight on an interval that a region has not reported
// (see Rebalance). What it cannot add is kept for the next flush.
func (r *Regions) Flush(ctx context.Context) error {
	now := r.clock.Now()
	current := r.bucket(now)
	taken := map[demandOf]int64{}
	byBucket := map[int64][]any{}
	r.demand.Range(func(k, c any) bool {
		of := k.(demandOf)
		if n := c.(*atomic.Int64).Swap(0); n > 0 {
			taken[of] = n
			byBucket[of.bucket] = append(byBucket[of.bucket], of.family, n)
		} else if of.bucket < current {
			r.demand.CompareAndDelete(k, c) // an interval gone by, all flushed
		}
		return true
	})
	keys := []string{r.reportedKey(current)}
	args := []any{(3 * r.interval).Milliseconds(), now.UnixNano()}
	buckets := make([]int64, 0, len(byBucket))
	for b := range byBucket {
		buckets = append(buckets, b)
	}
	slices.Sort(buckets)
	for _, b := range buckets {
		keys = append(keys, r.demandKey(b))
		args = append(args, len(byBucket[b])/2)
		args = append(args, byBucket[b]...)
	}
	if err := flushScript.Run(ctx, r.clients[r.self], keys, args...).Err(); err != nil {
		for of, n := range taken {
			r.countIn(of, n)
		}
		return fmt.Errorf("regions: region %s: flushing its demand: %w", r.self, err)
	}
	return nil
}

// Refresh reads this region's weights from its Redis; on an error the weights read
// before stay in force.
func (r *Regions) Refresh(ctx context.Context) error {
	m, err := r.readWeights(ctx, r.self)
	if err != nil {
		return fmt.Errorf("regions: region %s: reading its weights: %w", r.self, err)
	}
	r.weights.Store(&m)
	return nil
}

func (r *Regions) readWeights(ctx context.Context, region string) (map[string]weight, error) {
	v, err := readScript.Run(ctx, r.clients[region], []string{r.weightsKey()}).StringSlice()
	if err != nil {
		return nil, err
	}
	m := make(map[string]weight, len(v)/2)
	for i := 0; i+1 < len(v); i += 2 {
		var w weight
		if _, err := fmt.Sscanf(v[i+1], "%d:%d:%d:%d", &w.bucket, &w.old, &w.new, &w.effective); err == nil {
			m[v[i]] = w
		}
	}
	return m, nil
}

// Rebalance moves the weights for the interval now in (the one begun two seconds ago, or
// half an interval when that is shorter, so that the last flushes of the one before have
// landed), from the demand of the one before, if this region leads, every region has
// flushed since that one ended (or half an interval has passed), and no other instance
// has done it; see Regions. It returns the weights it wrote, by family and region, or nil
// when it had nothing to do (yet), and an error when a region could not be read or
// written (then nothing, or only lowered weights, were written).
func (r *Regions) Rebalance(ctx context.Context) (map[string]map[string]int64, error) {
	if r.self != r.names[0] {
		return nil, nil
	}
	now := r.clock.Now()
	k := r.bucket(now.Add(-r.settle())) // the interval begun a settle ago: the demand before it has landed
	if now.Sub(time.Unix(0, k*int64(r.interval))) < r.interval/2 {
		// every region must have flushed since interval k-1 ended, so that its demand of
		// k-1 is all in: a region cut off from its Redis across the end of k-1 writes it
		// when it reconnects, and until then its k-1 would read as empty. Waited for half
		// an interval: a region silent that long has no instance to report.
		missing := false
		for _, name := range r.names {
			n, err := reportedScript.Run(ctx, r.clients[name], []string{r.reportedKey(k)}).Int()
			if err != nil {
				return nil, fmt.Errorf("regions: reading %s's reports: %w", name, err)
			}
			missing = missing || n == 0
		}
		if missing {
			return nil, nil // not yet: asked again at the next round
		}
	}
	lock := redisx.RegionsLock(r.prefix, k)
	got, err := lockScript.Run(ctx, r.clients[r.self], []string{lock}, (2 * r.interval).Milliseconds()).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("regions: taking the lock: %w", err)
	}
	if got == nil {
		return nil, nil // another instance has it
	}
	demand := map[string]map[string]int64{} // family -> region -> takes
	current := map[string]map[string]weight{}
	for _, name := range r.names {
		v, err := readScript.Run(ctx, r.clients[name], []string{r.demandKey(k - 1)}).StringSlice()
		if err != nil {
			return nil, fmt.Errorf("regions: reading %s's demand: %w", name, err)
		}
		for i := 0; i+1 < len(v); i += 2 {
			n, _ := strconv.ParseInt(v[i+1], 10, 64)
			if demand[v[i]] == nil {
				demand[v[i]] = map[string]int64{}
			}
			demand[v[i]][name] = n
		}
		if current[name], err = r.readWeights(ctx, name); err != nil {
			return nil, fmt.Errorf("regions: reading %s's weights: %w", name, err)
		}
	}
	out := map[string]map[string]int64{}
	type write struct {
		region, family string
		w              weight
	}
	var lowered, raised []write
	for fam, d := range demand {
		cur := map[string]int64{}
		for _, name := range r.names {
			cur[name] = 1000 / int64(len(r.names))
			if w, ok := current[name][fam]; ok {
				cur[name] = w.new
			}
		}
		next := r.move(cur, d)
		out[fam] = next
		for _, name := range r.names {
			w := weight{bucket: k, old: cur[name], new: next[name], effective: now.UnixNano()}
			if next[name] > cur[name] {
				w.effective += int64(r.grace)
				raised = append(raised, write{name, fam, w})
			} else {
				lowered = append(lowered, write{name, fam, w})
			}
		}
	}
	for _, wr := range append(lowered, raised...) {
		val := fmt.Sprintf("%d:%d:%d:%d", wr.w.bucket, wr.w.old, wr.w.new, wr.w.effective)
		if err := setWeightScript.Run(ctx, r.clients[wr.region], []string{r.weightsKey()}, wr.family, k, val).Err(); err != nil {
			return out, fmt.Errorf("regions: writing %s's weight of %s (the weights raised after it are not written): %w",
				wr.region, wr.family, err)
		}
	}
	return out, nil
}

// move is the weights after one interval: each region's current weight moved toward its
// share of demand, by at most the step, at least the floor, adding up to at most 1000.
func (r *Regions) move(cur, demand map[string]int64) map[string]int64 {
	total := int64(0)
	for _, name := range r.names {
		total += demand[name]
	}
	next := map[string]int64{}
	sum := int64(0)
	for _, name := range r.names {
		target := cur[name]
		if total > 0 {
			target = demand[name] * 1000 / total
		}
		target = max(target, r.floor)
		w := cur[name] + max(-r.step, min(r.step, target-cur[name]))
		next[name] = max(w, r.floor)
		sum += next[name]
	}
	for _, name := range slices.Backward(r.names) { // more than the whole: take back from the raised ones
		if sum <= 1000 {
			break
		}
		if back := min(sum-1000, next[name]-max(cur[name], r.floor)); back > 0 {
			next[name] -= back
			sum -= back
		}
	}
	return next
}

// settle is how far into an interval its rebalancing waits, for the last flushes of the
// interval before to land: two flushes, or half an interval when that is shorter.
func (r *Regions) settle() time.Duration { return min(2*r.flush, r.interval/2) }

// Run keeps the region's weights and demand in step with Redis until ctx ends, and
// returns ctx's error: it reads the weights and adds the demand every second, and
// rebalances once an interval, two seconds into it, when this region leads. An error of
// a round leaves things as they were, goes to WithOnError's function, and is tried again
// on the next round.
func (r *Regions) Run(ctx context.Context) error {
	t := time.NewTicker(r.refresh)
	defer t.Stop()
	for {
		rc, cancel := context.WithTimeout(ctx, r.refresh)
		r.report(r.Refresh(rc))
		r.report(r.Flush(rc))
		_, err := r.Rebalance(rc) // once an interval: the lock refuses the rest
		r.report(err)
		cancel()
		select {
		case <-ctx.Done():
			r.report(r.Flush(context.WithoutCancel(ctx)))
			return ctx.Err()
		case <-t.C:
		}
	}
}

// report hands a round's error to WithOnError's function, if any.
func (r *Regions) report(err error) {
	if err != nil && r.onError != nil {
		r.onError(err)
	}
}

// String describes the regions and this one's weights, for logs.
func (r *Regions) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "region %s of %s", r.self, strings.Join(r.names, ","))
	for fam, w := range *r.weights.Load() {
		fmt.Fprintf(&b, "; %s %d/1000", fam, w.new)
	}
	return b.String()
}
