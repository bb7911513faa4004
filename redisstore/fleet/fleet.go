// Package fleet builds the store that the instances of a fleet share, such as the
// gateways behind one load balancer. The store is Redis, behind a fallback.Store that
// divides every rule among the instances while Redis is down. Busy keys are decided
// from hotkey.Leases.
//
//	f, err := fleet.New(ctx, client, fleet.Config{Instances: 20})
//	if err != nil { ... }
//	defer f.Close(context.Background())
//	limiter, err := tokenbucket.New(f.Store(), rule, ratelimit.WithNamespace("api"))
//
// Together the instances admit a key what its rule allows. Beyond it, each instance
// admits on trust at most one event per key at a time, unless hotkey.WithTrust says
// otherwise. Nothing they admit is lost (see hotkey.Leases). While Redis is down or
// slower than the fallback's timeout, each instance decides on its share of every rule
// (see fallback.Store).
package fleet

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/redisstore/members"
)

// Config says how one instance takes part in its fleet.
type Config struct {
	// Instances is how many instances share the limits. It is required. With Learn, it
	// is the count assumed until Redis first answers a beat.
	Instances int
	// Learn counts the live instances through Redis instead (see redisstore/members).
	// Each instance beats under Group every 2s. One that stops leaves the count within 6s.
	Learn bool
	// Group names the fleet whose instances Learn counts. It is "ratelimit" when empty.
	Group string
	// Exact decides every request on Redis, without leases. Each decision then waits for
	// a round trip. The rule holds with nothing admitted on trust.
	Exact bool

	// Redis, Fallback and Leases are options of the stores, applied after the fleet's
	// own. Use them for a prefix, the fallback's timeout or hooks, or WithTrust.
	Redis    []redisstore.Option
	Fallback []fallback.Option
	Leases   []hotkey.LeasesOption
	// Local is the store of the instance's shares. It is localstore.New() when nil.
	Local *localstore.Store
	// Algorithms are those whose scripts New loads into Redis. When empty, New loads
	// every algorithm of this module (see redisstore.Store.LoadScripts).
	Algorithms []*ratelimit.Algorithm
}

// beat is how often an instance announces itself when it learns the count.
const beat = 2 * time.Second

// Fleet is one instance's part of a fleet. It holds the store the instance's limiters
// decide on, and the count of instances it divides the rules by. Close it on shutdown.
type Fleet struct {
	store    ratelimit.Store
	fallback *fallback.Store
	leases   *hotkey.Leases // nil when Exact
	assumed  int
	members  *members.Members // nil unless Learn
	learned  atomic.Bool      // a beat was answered
	stop     context.CancelFunc
	done     chan struct{}
	once     sync.Once
	closeErr error
}

// New opens this instance's part of the fleet on client. Within ctx, it loads the
// scripts, and with Learn it beats once. The first requests then do not wait for them.
// A Redis that does not answer is not an error. Until it answers, the instance decides
// on its share, and counts Instances. New returns an error for a nil client or option,
// or an Instances below 1.
func New(ctx context.Context, client redis.Scripter, cfg Config) (*Fleet, error) {
	if core.IsNil(client) {
		return nil, errors.New("fleet: New with a nil client")
	}
	if cfg.Instances < 1 {
		return nil, errors.New("fleet: Config.Instances must be at least 1: the instances sharing the limits, or with Learn those assumed until Redis answers")
	}
	if slices.Contains(cfg.Redis, nil) || slices.Contains(cfg.Fallback, nil) || slices.Contains(cfg.Leases, nil) {
		return nil, errors.New("fleet: a nil option in Config.Redis, Fallback or Leases")
	}
	f := &Fleet{assumed: cfg.Instances}
	if cfg.Learn {
		group := cfg.Group
		if group == "" {
			group = "ratelimit"
		}
		f.members = members.New(client, group, members.WithBeat(beat))
		first, cancel := context.WithTimeout(ctx, beat)
		if _, err := f.members.Beat(first); err == nil {
			f.learned.Store(true)
		}
		cancel()
		run, stop := context.WithCancel(context.WithoutCancel(ctx))
		f.stop, f.done = stop, make(chan struct{})
		go f.run(run)
	}
	local := cfg.Local
	if local == nil {
		local = localstore.New()
	}
	rs := redisstore.New(client, cfg.Redis...)
	if err := rs.LoadScripts(ctx, cfg.Algorithms...); err != nil && !errors.Is(err, ratelimit.ErrUnavailable) {
		f.Close(ctx)
		return nil, err
	}
	fopts := append([]fallback.Option{fallback.WithInstanceCount(f.Count)}, cfg.Fallback...)
	f.fallback = fallback.New(rs, local, fopts...)
	f.store = f.fallback
	if !cfg.Exact {
		lopts := append([]hotkey.LeasesOption{hotkey.WithInstanceCount(f.Count)}, cfg.Leases...)
		leases, err := hotkey.NewLeases(f.fallback, lopts...)
		if err != nil {
			f.Close(ctx)
			return nil, err
		}
		f.leases, f.store = leases, leases
	}
	return f, nil
}

// run beats every interval until ctx ends.
func (f *Fleet) run(ctx context.Context) {
	defer close(f.done)
	t := time.NewTicker(beat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b, cancel := context.WithTimeout(ctx, beat)
		if _, err := f.members.Beat(b); err == nil {
			f.learned.Store(true)
		}
		cancel()
	}
}

// Store is what this instance's limiters decide on.
func (f *Fleet) Store() ratelimit.Store { return f.store }

// Fallback is the fallback store under the leases. Its Source and breaker say whether
// Redis is deciding.
func (f *Fleet) Fallback() *fallback.Store { return f.fallback }

// Leases is the leases the store decides busy keys from. It is nil with Exact.
func (f *Fleet) Leases() *hotkey.Leases { return f.leases }

// Count is how many instances share the limits. Without Learn, it is Instances. With
// Learn, it is the count last learned, or Instances until Redis first answers.
func (f *Fleet) Count() int {
	if f.members != nil && f.learned.Load() {
		return f.members.Count()
	}
	return f.assumed
}

// Close gives back what the leases hold, and charges what they admitted on trust.
// It waits for what the fallback still sends Redis (see fallback.Store.Flush). It then
// stops beating and takes this instance out of the count, all within ctx. Close is
// safe to call more than once. After Close, the store decides every request without
// leases, as with Exact.
func (f *Fleet) Close(ctx context.Context) error {
	if f == nil {
		return nil
	}
	f.once.Do(func() {
		var errs []error
		if f.leases != nil {
			errs = append(errs, f.leases.Close(ctx))
		}
		if f.fallback != nil { // what the leases gave back, and what Redis answered late
			errs = append(errs, f.fallback.Flush(ctx))
		}
		if f.members != nil {
			f.stop()
			<-f.done
			errs = append(errs, f.members.Leave(ctx))
		}
		f.closeErr = errors.Join(errs...)
	})
	return f.closeErr
}
