package main

import (
	"context"
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
)

// storeConfig is where decisions are made.
type storeConfig struct {
	redisURL      string        // redis://host:port/db; empty: see cluster
	cluster       string        // host:port,host:port; empty with redisURL: an embedded miniredis
	instances     int           // gateway instances sharing the limits
	timeout       time.Duration // the budget of one Redis call
	breakerOpen   time.Duration
	localMaxKeys  int
	localMaxBytes int64
}

// openStore opens Redis (or starts an embedded miniredis) behind the fallback store, and
// returns a function that closes what it opened.
func openStore(ctx context.Context, cfg storeConfig, m *metrics, log *slog.Logger) (ratelimit.Store, func(), error) {
	var client redis.Scripter
	var closeAll []func()
	switch {
	case cfg.cluster != "":
		c := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: strings.Split(cfg.cluster, ","), ContextTimeoutEnabled: true,
			DialTimeout: 100 * time.Millisecond, DialerRetries: 1, ReadTimeout: 50 * time.Millisecond,
			WriteTimeout: 50 * time.Millisecond, PoolTimeout: 10 * time.Millisecond, MaxRetries: -1,
			// slot moves no error announces; a failed master's slots are reloaded at once by
			// the store (see redisstore's "Redis Cluster")
			ClusterStateReloadInterval: 5 * time.Second,
		})
		client, closeAll = c, append(closeAll, func() { c.Close() })
		log.Info("deciding on Redis Cluster", "addrs", cfg.cluster)
	case cfg.redisURL != "":
		opts, err := redis.ParseURL(cfg.redisURL)
		if err != nil {
			return nil, nil, fmt.Errorf("-redis: %w", err)
		}
		opts.ContextTimeoutEnabled, opts.MaxRetries, opts.DialerRetries = true, -1, 1
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = 100*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
		opts.PoolTimeout = 10 * time.Millisecond
		c := redis.NewClient(opts)
		client, closeAll = c, append(closeAll, func() { c.Close() })
		log.Info("deciding on Redis", "addr", opts.Addr)
	default:
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, nil, fmt.Errorf("embedded miniredis: %w", err)
		}
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		stop := expireKeys(ctx, mr)
		client, closeAll = c, append(closeAll, stop, func() { c.Close() }, mr.Close)
		log.Info("deciding on an embedded miniredis (use -redis or -redis-cluster for a real one)", "addr", mr.Addr())
	}
	store := fallback.New(redisstore.New(client), localstore.New(localstore.WithMaxKeys(cfg.localMaxKeys), localstore.WithMaxBytes(cfg.localMaxBytes)),
		fallback.WithInstances(cfg.instances), fallback.WithTimeout(cfg.timeout),
		fallback.WithBreaker(fallback.Breaker{OpenFor: cfg.breakerOpen}), fallback.WithHooks(m.hooks()))
	return store, func() {
		for _, f := range closeAll {
			f()
		}
	}, nil
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
