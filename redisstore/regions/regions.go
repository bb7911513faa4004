// Package regions splits every limit between regions that each decide on a Redis of
// their own. Each region gets a weight of every rule, in proportion to where the traffic
// is. In each window of a rule, the regions together admit at most the rule, or 1.1
// times it while weights move (the default WithStep). See Regions.
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

// Regions splits every limit between regions that each decide on a Redis of their own.
// Use it when one Redis is too far for some regions. A gateway in Europe and one in the
// US cannot reach one Redis within 2ms. Each region enforces a weight of every rule, in
// proportion to where the traffic is. The weights move as the traffic moves.
//
//	split, err := regions.New("eu", map[string]redis.Scripter{"eu": euClient, "us": usClient})
//	go split.Run(ctx)
//	limiter, err := tokenbucket.New(split.Store(redisstore.New(euClient)), rule, ratelimit.WithNamespace("api"))
//
// In each window of a rule, the regions together admit at most the rule, or 1.1 times it
// while weights move. The 0.1 is the default step (WithStep). That holds while every
// instance reads its weights within the grace (WithGrace).
//
// Run reads the weights, counts the demand and rebalances in the background. Flush,
// Refresh and Rebalance each do one round, for tests and for applications that schedule
// their own. A request's path holds only a clock read, a map lookup and an atomic add.
//
// # Weights
//
// Each region enforces its weight of every rule, in thousandths. Weights are kept per
// family of limits: a request's namespace, unless WithFamily says otherwise. Weights
// start equal. The shares are rounded down, so the regions together never admit more
// than the rule. A rule too small to split is an error wrapping ratelimit.ErrInvalidRule.
// An in-flight limit is the exception: each region holds at least one lease of it.
//
// # Demand
//
// Every take counts as demand, admitted or denied, in the interval it is made in. Each
// instance counts it in memory, and adds its counts to its own region's Redis every
// second. It then marks the interval as reported. An instance cut off from its Redis
// adds its counts to their intervals when it reconnects.
//
// # Rebalancing
//
// Every interval (WithInterval, 5 minutes by default), one instance of the leader region
// rebalances. The leader region is the first region in order. A lock in its Redis picks
// the instance. The instance waits until every region has reported the interval just
// ended, or for half an interval. Then it reads each region's demand of that interval.
//
// It moves each family's weights toward the regions' shares of the demand. A weight moves
// by a step at most (WithStep, 100 thousandths). It never goes below a floor per region
// (WithFloor, 100 thousandths).
//
// The leader writes each region's new weight into that region's own Redis, lowered
// weights first. It stops at the first region it cannot reach. So the weights in force
// never add up to more than the whole. A raised weight takes effect only after a grace
// (WithGrace, 3 seconds). By then, every instance of the lowered regions has read its
// lowered weight, since instances read theirs every second. A leader that cannot read
// every region's demand leaves every weight as it is. So a region cut off keeps its last
// weights.
//
// # The bound
//
// At any instant, the weights in force add up to at most the whole. That holds as long
// as every instance reads its weights within the grace. In a window of a rule in which no
// weight moves, the regions admit at most the rule, as one limiter on one Redis would. In
// a window in which weights move, they admit at most the rule plus the step of it. That
// is 1.1 times the rule with the default step. A region may have spent its old, larger
// share before its weight went down. Another may spend its new, larger share after its
// weight went up.
//
// An instance that cannot reach its own Redis keeps the weights it last read. It decides
// as its store does, such as on the fallback store's shares.
type Regions struct {
	self    string
	names   []string // sorted; names[0] leads
	clients map[string]redis.Scripter
	prefix  string
	family  func(namespace, key string) string

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

// WithInterval sets how often the weights move, and the interval whose demand each move
// reads. The default is 5 minutes.
func WithInterval(d time.Duration) Option {
	return optionFunc(func(r *Regions) {
		if d > 0 {
			r.interval = d
		}
	})
}

// WithStep bounds how far a weight moves in one interval, in thousandths. The default is
// 100. While weights move, the regions may admit the rule plus this step of it.
func WithStep(thousandths int64) Option {
	return optionFunc(func(r *Regions) {
		if thousandths > 0 {
			r.step = thousandths
		}
	})
}

// WithFloor sets the least weight of a region, in thousandths. The default is 100. So a
// region whose traffic stopped can still serve when the traffic comes back. The floor is
// lowered to an equal share when the regions are too many for it.
func WithFloor(thousandths int64) Option {
	return optionFunc(func(r *Regions) {
		if thousandths >= 0 {
			r.floor = thousandths
		}
	})
}

// WithGrace sets how long a raised weight waits before it is in force. The default is 3s.
// Keep it longer than it takes every instance to read its weights, which they do every
// second.
func WithGrace(d time.Duration) Option {
	return optionFunc(func(r *Regions) {
		if d > 0 {
			r.grace = d
		}
	})
}

// WithFamily sets the family of a request, from its limiter's namespace and its key. The
// weights of a family move together. The default is the namespace, so every key of a
// limiter moves with the others.
// Keep the families few: each is a field of a hash in every region's Redis.
func WithFamily(f func(namespace, key string) string) Option {
	return optionFunc(func(r *Regions) {
		if f != nil {
			r.family = f
		}
	})
}

// WithOnError has f called with each error of a round of Run, for logs and metrics. Such
// an error is, say, a region's Redis that cannot be read. Run goes on whatever f does.
// Nil means none.
func WithOnError(f func(error)) Option {
	return optionFunc(func(r *Regions) { r.onError = f })
}

// WithClock sets the clock of intervals and graces. The default is the system's.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(r *Regions) {
		if c != nil {
			r.clock = c
		}
	})
}

// WithPrefix starts the keys of the demand, the weights and the lock with prefix. The
// default is redisstore.DefaultPrefix.
func WithPrefix(prefix string) Option {
	return optionFunc(func(r *Regions) {
		if prefix != "" {
			r.prefix = redisx.Prefix(prefix)
		}
	})
}

// New returns the Regions of self among clients, one client per region's Redis, self's
// included. It makes no call to Redis. It returns an error when the regions are fewer
// than two, self is not among them, or a client or an option is nil.
func New(self string, clients map[string]redis.Scripter, opts ...Option) (*Regions, error) {
	if len(clients) < 2 {
		return nil, fmt.Errorf("regions: %d region(s); a split needs two or more", len(clients))
	}
	if _, ok := clients[self]; !ok {
		return nil, fmt.Errorf("regions: %q is not one of the regions", self)
	}
	r := &Regions{self: self, clients: clients, prefix: redisx.DefaultPrefix,
		family:   func(namespace, _ string) string { return namespace },
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

// Store wraps next, this region's store. Each request is then decided under this
// region's weight of its rule, and each take counts as demand.
func (r *Regions) Store(next ratelimit.Store) ratelimit.Store { return &regionStore{r, next} }

type regionStore struct {
	r    *Regions
	next ratelimit.Store
}

func (s *regionStore) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	fam := s.r.family(req.Spec.Namespace, req.Key)
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
		share, err := s.share(req, s.r.family(req.Spec.Namespace, req.Key))
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
				s.r.count(s.r.family(req.Spec.Namespace, req.Key), req.N)
			}
		}
	}
	return ds, err
}

// Run keeps the region's weights and demand in step with Redis until ctx ends. Every
// second, it reads the weights and adds the demand. Once an interval, two seconds into
// it, it rebalances when this region leads. An error of a round leaves things as they
// were, and goes to WithOnError's function. The next round tries again. When ctx ends,
// Run adds the demand one last time, and returns ctx's error.
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
