package redissuite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// ClusterSpread: the keys of many tenants spread over all masters.
func ClusterSpread(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	s := redisstore.New(cluster.Client(t), redisstore.WithPrefix("spread"))
	for i := range 300 {
		if _, err := apply(t, s, tokenbucket.Algorithm(), fmt.Sprint("tenant-", i), ratelimit.PerHour(10), 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range cluster.Masters {
		n := redis.NewClient(&redis.Options{Addr: m.Addr}).DBSize(context.Background()).Val()
		if n < 50 || n > 150 {
			t.Errorf("master %s holds %d of 300 keys; want about a third", m.Addr, n)
		}
	}
}

// AllowAllAcrossSlots: parts whose keys may sit on different cluster nodes are taken
// one by one and refunded on a denial, never a CROSSSLOT error, and a denial counts
// nothing.
func AllowAllAcrossSlots(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	store := redisstore.New(cluster.Client(t), redisstore.WithPrefix("cross"))
	plan, _ := tokenbucket.New(store, ratelimit.PerHour(100))
	rate, _ := fixedwindow.New(store, ratelimit.PerHour(3))
	ctx := context.Background()
	parts := []ratelimit.Part{{Limiter: plan, Key: "plan:shop-a"}, {Limiter: rate, Key: "rate:shop-a:search"}}
	admitted := 0
	for range 10 {
		d, err := ratelimit.AllowAll(ctx, 1, parts...)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	d, err := plan.PeekN(ctx, "plan:shop-a", 1)
	if err != nil {
		t.Fatal(err)
	}
	if admitted != 3 || d.Remaining != 100-3-1 {
		t.Errorf("admitted %d (want 3); the plan counted %d (want 3: denials refunded)", admitted, 100-d.Remaining-1)
	}
}

// ClusterFailover: after a master dies and its replica takes over, decisions on its
// slots resume as soon as the replica serves them, without waiting for go-redis's periodic
// reload of the slot map (an hour here): the store asks for a reload when a node fails.
func ClusterFailover(t *testing.T) {
	cluster := redistest.StartClusterWithReplicas(t, 3)
	ctx := context.Background()
	var addrs []string
	for _, s := range append(cluster.Masters, cluster.Replicas...) {
		addrs = append(addrs, s.Addr)
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: time.Hour,
		DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { client.Close() })
	s := redisstore.New(client)
	rule := ratelimit.PerHour(100)
	if d, err := apply(t, s, tokenbucket.Algorithm(), "k", rule, 1); err != nil || !d.Allowed() {
		t.Fatalf("before the failover: %+v, %v", d, err)
	}
	owner, err := client.MasterForKey(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var master, replica *redistest.Server
	for _, m := range cluster.Masters {
		if m.Addr == owner.Options().Addr {
			master = m
		}
	}
	for _, r := range cluster.Replicas {
		rc := redis.NewClient(&redis.Options{Addr: r.Addr})
		info, err := rc.Info(ctx, "replication").Result()
		rc.Close()
		if err == nil && master != nil && strings.Contains(info, "master_port:"+master.Addr[strings.LastIndexByte(master.Addr, ':')+1:]+"\r\n") {
			replica = r
		}
	}
	if master == nil || replica == nil {
		t.Fatalf("no master and replica found for the slot of k (owner %s)", owner.Options().Addr)
	}
	master.Kill()
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer rc.Close()
	if err := rc.Do(ctx, "cluster", "failover", "takeover").Err(); err != nil { // the master is gone: no handshake
		t.Fatalf("CLUSTER FAILOVER TAKEOVER on %s: %v", replica.Addr, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	failures := 0
	for {
		short, cancel := context.WithTimeout(ctx, time.Second)
		d, err := s.Apply(short, core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(rule)}})
		cancel()
		if err == nil {
			if !d.Allowed() || d.Remaining < 98 { // 98 left, or 99 if the replica had not the first decision yet
				t.Errorf("after the failover: %+v; want allowed, 98 or 99 left", d)
			}
			break
		}
		if !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Fatalf("during the failover: %v; want an error wrapping ErrUnavailable", err)
		}
		failures++
		if time.Now().After(deadline) {
			t.Fatalf("decisions on the failed master's slots still fail 30s after its replica took over (%d failures): %v", failures, err)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}
