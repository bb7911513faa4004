package main

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ratelimit-go/ratelimit/redisstore/regions"
	"github.com/redis/go-redis/v9"
)

// regionsConfig turns on the split of every limit between regions (-region, -regions,
// -rebalance): each region's gateways decide on their own Redis, and enforce their
// region's weight of each rule, moved toward the traffic every -rebalance.
type regionsConfig struct {
	self, list string
	every      time.Duration
}

// parseRegions reads -regions: name=redis://host:port, comma-separated.
func parseRegions(list string) (map[string]string, error) {
	urls := map[string]string{}
	for _, part := range strings.Split(list, ",") {
		name, url, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" || url == "" {
			return nil, fmt.Errorf("-regions: %q is not name=redis://host:port", part)
		}
		if _, dup := urls[name]; dup {
			return nil, fmt.Errorf("-regions: region %q is there twice", name)
		}
		urls[name] = url
	}
	if len(urls) < 2 {
		return nil, fmt.Errorf("-regions: %d region(s); a split needs two or more", len(urls))
	}
	return urls, nil
}

// openRegions connects to every region's Redis for the weights and the demand (the
// decisions go through the store of the region's own), and returns the Regions and
// what closes them.
func openRegions(c regionsConfig, urls map[string]string) (*regions.Regions, func(), error) {
	clients := map[string]redis.Scripter{}
	var closers []func()
	closeAll := func() {
		for _, f := range closers {
			f()
		}
	}
	for name, url := range urls {
		opts, err := redis.ParseURL(url)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("-regions: %s: %w", name, err)
		}
		opts.MaxRetries, opts.DialTimeout = -1, 500*time.Millisecond
		client := redis.NewClient(opts)
		clients[name], closers = client, append(closers, func() { client.Close() })
	}
	r, err := regions.New(c.self, clients, regions.WithInterval(c.every))
	if err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("-region: %w", err)
	}
	return r, closeAll, nil
}

// watchWeight logs this region's weight of the gateway's limits whenever it moves, and
// serves it as a metric.
func watchWeight(ctx context.Context, r *regions.Regions, self string, reg prometheus.Registerer, log *slog.Logger) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_region_weight", Help: "This region's share of every rule, 0 to 1.",
		ConstLabels: prometheus.Labels{"region": self},
	}, func() float64 { return float64(r.Weight(namespace)) / 1000 }))
	last := r.Weight(namespace)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w := r.Weight(namespace); w != last {
			log.Info("this region's share of every rule moved", "region", self, "from", float64(last)/1000, "to", float64(w)/1000)
			last = w
		}
	}
}

// regionNames lists the regions, sorted, for logs.
func regionNames(urls map[string]string) string {
	names := make([]string, 0, len(urls))
	for n := range urls {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}
