// Package regions splits every limit between regions that each decide on a Redis of
// their own, in proportion to where the traffic is (see Regions).
package regions

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
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
// Each region enforces its weight of every rule, in thousandths, per family of limits:
// a request's namespace, unless WithFamily says otherwise. The regions together never
// admit more than the rule: the shares are rounded down. A rule too small to split is an
// error wrapping ratelimit.ErrInvalidRule, but for an in-flight limit, where each region
// holds one lease at least. Weights start equal.
//
// # Demand and rebalancing
//
// Every take is counted as demand, admitted or denied, in memory, in the interval it is
// made in. Each instance adds its counts to its own region's Redis every second, one
// HINCRBY per family into a hash per interval, and marks the interval as reported. An
// instance cut off from its Redis adds them to their intervals when it reconnects.
//
// Every interval (WithInterval, 5 minutes by default), one instance of the leader region
// rebalances: the first region in order, one instance by a lock in its Redis. Once every
// region has reported the interval just ended, or after half an interval, it reads each
// region's demand of that interval. It moves each family's weights toward the regions'
// shares of it: by a step at most (WithStep, 100 thousandths), and never below a floor
// per region (WithFloor, 100 thousandths). It writes each
// region's new weight into that region's own Redis, lowered weights first, and stops at
// the first region it cannot reach: so the weights in force never add up to more than
// the whole. A raised weight takes effect only after a grace (WithGrace, three
// seconds), by which time every instance of the lowered regions has read its lowered
// weight (instances read theirs every second). A leader that cannot read every region's
// demand leaves every weight as it is: a region cut off keeps its last weights.
//
// The bound: at any instant the weights in force add up to at most the whole, as long as
// every instance reads its weights within the grace. In a window of a rule in which no
// weight moves, the regions admit at most the rule, as one limiter on one Redis would.
// In a window in which they move, they admit at most the rule plus the step of it: 1.1
// times the rule with the default step. A region may have spent its old, larger share
// before its weight went down, and another spend its new one after its went up. An
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
	family  func(core.Request) string

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
func WithFamily(f func(core.Request) string) Option {
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
		family:   func(req core.Request) string { return req.Spec.Namespace },
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

func (s *regionStore) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	fam := s.r.family(req)
	share, err := s.share(req, fam)
	if err != nil {
		return core.Outcome{}, err
	}
	if req.Spec.Op == core.OpTake && req.N > 0 {
		s.r.count(fam, req.N)
	}
	req.Spec = core.WithRule(req.Spec, share)
	return s.next.Apply(ctx, req)
}

// share is this region's weight of req's rule: exact (core.Portion), or for an in-flight
// limit at least one lease, as the fallback's shares.
func (s *regionStore) share(req core.Request, family string) (core.Rule, error) {
	w := s.r.Weight(family)
	if core.OfLeases(req.Spec.Algorithm) {
		return core.PortionLeases(req.Spec.Rule, w, 1000), nil
	}
	share, err := core.Portion(req.Spec.Rule, w, 1000)
	if err != nil {
		return core.Rule{}, fmt.Errorf("regions: region %s: %w", s.r.self, err)
	}
	return share, nil
}

// ApplyAll decides reqs all or none, each under this region's weight of its rule, when
// the region's store can (a core.BatchStore); otherwise it returns an error matching
// errors.ErrUnsupported, having counted nothing, and core.ApplyAll takes them one
// by one.
func (s *regionStore) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	bs, ok := s.next.(core.BatchStore)
	if !ok {
		return nil, fmt.Errorf("regions: region %s: its store decides no batches: %w", s.r.self, errors.ErrUnsupported)
	}
	scaled := make([]core.Request, len(reqs))
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
			if req.Spec.Op == core.OpTake && req.N > 0 {
				s.r.count(s.r.family(req), req.N)
			}
		}
	}
	return ds, err
}

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
