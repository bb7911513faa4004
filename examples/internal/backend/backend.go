// Package backend opens where the examples' servers decide: Redis, a Redis Cluster or an
// embedded miniredis, behind the fallback store, checked and warmed before serving, with
// the fallback's Prometheus metrics and log lines.
package backend

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/fleet"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
)

// Flags registers the store's flags on fs, into c: -redis, -redis-cluster, -instances,
// -timeout and -breaker-open, the same for every server of the examples.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.RedisURL, "redis", "", "Redis URL, redis://host:port (default: an embedded miniredis)")
	fs.StringVar(&c.Cluster, "redis-cluster", "", "Redis Cluster nodes, host:port,host:port,...")
	fs.IntVar(&c.Instances, "instances", 0, "instances sharing the limits: each enforces 1/n while Redis is down (0: the number alive, learned through Redis)")
	fs.DurationVar(&c.Timeout, "timeout", 0, "the most a decision waits for Redis (0: 5ms on Redis, 50ms on the embedded miniredis)")
	fs.DurationVar(&c.BreakerOpen, "breaker-open", time.Second, "how long Redis is left alone after it fails")
	fs.BoolVar(&c.Leases, "leases", false, "decide busy keys from events leased from Redis and held in memory, refilled in the background (hotkey.Leases): no round trip for them")
	fs.IntVar(&c.Trust, "trust", 1, "with -leases, the events of a key each instance admits before Redis counted them, charged in the background: beyond the rule, at most this many per instance per key (hotkey.WithTrust; 0: none, a round trip each)")
}

// DefaultTimeout is the budget of one call to a real Redis (fallback.DefaultTimeout).
// EmbeddedTimeout is the budget of one call to the embedded miniredis, which runs the
// scripts in a Lua interpreter written in Go, in this process, under one lock: at a few
// thousand decisions a second its round trip's 99th percentile passes 5ms, and a demo
// should show the shared limit deciding, not its fallback (see the fallback package's
// "Choosing the timeout").
const (
	DefaultTimeout  = fallback.DefaultTimeout
	EmbeddedTimeout = 50 * time.Millisecond
)

// Config is where decisions are made.
type Config struct {
	RedisURL      string        // redis://host:port/db; empty: see Cluster
	Cluster       string        // host:port,host:port; empty with RedisURL: an embedded miniredis
	Instances     int           // instances sharing the limits; 0: learned through Redis
	Timeout       time.Duration // the budget of one Redis call; 0: DefaultTimeout, or EmbeddedTimeout
	BreakerOpen   time.Duration
	LocalMaxKeys  int
	LocalMaxBytes int64
	Leases        bool                   // busy keys decided from leases (hotkey.Leases)
	Trust         int                    // events of a key admitted before Redis counts them (hotkey.WithTrust); 0: none
	Members       string                 // the name the instances beat under in Redis ("gateway")
	Algorithms    []*ratelimit.Algorithm // loaded into Redis before serving
}

// Open opens Redis (or starts an embedded miniredis) behind the fallback store, and
// returns a function that closes what it opened. Before it returns, it checks that Redis
// is what the flags say (a cluster node for -redis-cluster, a plain server for -redis) and
// loads the scripts, so that the first requests do not pay the connection and the loads
// and fall back for it. A misconfiguration is an error; a Redis that does not answer is
// not (the server starts on the instances' shares, and logs it).
func Open(ctx context.Context, cfg Config, m *Metrics, log *slog.Logger) (_ ratelimit.Store, _ func(), err error) {
	if cfg.RedisURL != "" && cfg.Cluster != "" {
		return nil, nil, errors.New("-redis and -redis-cluster are both set: give one")
	}
	var client redis.Scripter
	var closeAll []func()
	timeout := cfg.Timeout
	closeStore := func() {
		for _, f := range closeAll {
			f()
		}
	}
	defer func() {
		if err != nil {
			closeStore()
		}
	}()
	switch {
	case cfg.Cluster != "":
		c := redis.NewClusterClient(redisstore.RecommendedCluster(&redis.ClusterOptions{Addrs: strings.Split(cfg.Cluster, ",")}))
		client, closeAll = c, append(closeAll, func() { c.Close() })
		log.Info("deciding on Redis Cluster", "addrs", cfg.Cluster)
	case cfg.RedisURL != "":
		opts, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return nil, nil, fmt.Errorf("-redis: %w", err)
		}
		c := redis.NewClient(redisstore.Recommended(opts))
		client, closeAll = c, append(closeAll, func() { c.Close() })
		log.Info("deciding on Redis", "addr", opts.Addr)
	default:
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, nil, fmt.Errorf("embedded miniredis: %w", err)
		}
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		if timeout == 0 {
			timeout = EmbeddedTimeout
		}
		stop := expireKeys(ctx, mr)
		client, closeAll = c, append(closeAll, stop, func() { c.Close() }, mr.Close)
		log.Info("deciding on an embedded miniredis (use -redis or -redis-cluster for a real one)", "addr", mr.Addr())
	}
	start, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	answered, err := checkRedis(start, client, cfg)
	if err != nil {
		return nil, nil, err
	}
	if answered != nil {
		log.Warn("Redis does not answer; starting on each instance's share of the rules until it does", "err", answered)
	}
	fc := fleet.Config{Instances: cfg.Instances, Group: cfg.Members, Exact: !cfg.Leases, Algorithms: cfg.Algorithms,
		Local: localstore.New(localstore.WithMaxKeys(cfg.LocalMaxKeys), localstore.WithMaxBytes(cfg.LocalMaxBytes)),
		Fallback: []fallback.Option{fallback.WithTimeout(cmp.Or(timeout, DefaultTimeout)),
			fallback.WithBreaker(fallback.Breaker{OpenFor: cfg.BreakerOpen}), fallback.WithHooks(m.Hooks()), fallback.WithLogger(log)},
		Leases: []hotkey.LeasesOption{hotkey.WithTrust(cfg.Trust)}}
	if cfg.Instances < 1 { // learned: each instance beats in Redis, and counts the live ones
		fc.Instances, fc.Learn = 1, true
	}
	f, err := fleet.New(start, client, fc)
	if err != nil {
		return nil, nil, err
	}
	closeAll = append([]func(){func() { // first: what the leases hold goes back while Redis is there
		leave, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		f.Close(leave)
	}}, closeAll...)
	if f.Leases() == nil {
		return f.Store(), closeStore, nil
	}
	m.Leases(f.Leases())
	log.Info("busy keys are decided from leases held in memory")
	return f.Store(), closeStore, nil
}

// checkRedis refuses a Redis that is not what the flags say: -redis-cluster at a server
// without cluster support (every decision would fail over to the shares, with nothing to
// say why), or -redis at a cluster node (every key of another node's slots would be
// refused with MOVED). A Redis that does not answer passes, its error returned as
// unanswered: the fallback covers it.
func checkRedis(ctx context.Context, client redis.Scripter, cfg Config) (unanswered, err error) {
	switch c := client.(type) {
	case *redis.ClusterClient:
		err := c.Ping(ctx).Err()
		if err != nil && strings.Contains(err.Error(), "cluster support disabled") {
			return nil, fmt.Errorf("-redis-cluster %s: not a Redis Cluster node (%w); use -redis", cfg.Cluster, err)
		}
		return err, nil
	case *redis.Client:
		info, err := c.Info(ctx, "cluster").Result()
		if err == nil && strings.Contains(info, "cluster_enabled:1") && cfg.RedisURL != "" {
			return nil, fmt.Errorf("-redis %s: a Redis Cluster node; use -redis-cluster with the cluster's nodes", cfg.RedisURL)
		}
		var reply redis.Error
		if errors.As(err, &reply) { // it answered, without the section (miniredis): not a cluster
			return nil, nil
		}
		return err, nil
	}
	return nil, nil
}

// expireKeys moves the embedded miniredis's TTLs with real time (miniredis moves them
// only when told), so that idle keys expire as on Redis.
func expireKeys(ctx context.Context, mr *miniredis.Miniredis) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				mr.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	return func() { cancel(); <-done }
}
