package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startupError runs the gateway with c, and returns its error at start: a gateway that
// starts serving instead is stopped, and reported.
func startupError(t *testing.T, c config) error {
	t.Helper()
	c.addr = "127.0.0.1:0"
	c.store.Timeout, c.store.BreakerOpen, c.store.LocalMaxKeys, c.store.LocalMaxBytes = 5*time.Millisecond, time.Second, 1000, 1<<20
	c.reload = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := run(ctx, c, quiet())
	if err == nil {
		t.Errorf("%+v started, and served until its context ended; want an error at start", c)
	}
	return err
}

// TestMisconfigurationStops: flags that cannot work stop the gateway at start, saying why.
func TestMisconfigurationStops(t *testing.T) {
	plain := redistest.Start(t)
	for _, tc := range []struct {
		name string
		c    config
		want string
	}{
		{"both Redis flags", config{store: backend.Config{RedisURL: "redis://" + plain.Addr, Cluster: plain.Addr}}, "both set"},
		{"-redis-cluster at a plain server", config{store: backend.Config{Cluster: plain.Addr}}, "not a Redis Cluster node"},
		{"-rules-dsn of another scheme", config{rulesDSN: "mysql://root@127.0.0.1/rules"}, "want a postgres:// URL"},
		{"-rules-dsn unreachable", config{rulesDSN: "postgres://nobody@127.0.0.1:1/rules?connect_timeout=2"}, "cannot read the rate_limit_rule table"},
		{"-region alone", config{regions: regionsConfig{self: "eu"}}, "go together"},
		{"-region not among -regions", config{regions: regionsConfig{self: "ap", list: "eu=redis://" + plain.Addr + ",us=redis://" + plain.Addr}}, "not one of -regions"},
		{"-regions of one", config{regions: regionsConfig{self: "eu", list: "eu=redis://" + plain.Addr}}, "two or more"},
		{"-regions malformed", config{regions: regionsConfig{self: "eu", list: "eu:" + plain.Addr}}, "is not name=redis://host:port"},
		{"-region with -redis", config{regions: regionsConfig{self: "eu", list: "eu=redis://" + plain.Addr + ",us=redis://" + plain.Addr},
			store: backend.Config{RedisURL: "redis://" + plain.Addr}}, "leave -redis"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := startupError(t, tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v; want an error saying %q", err, tc.want)
			}
		})
	}
	t.Run("-redis at a cluster node", func(t *testing.T) {
		cluster := redistest.StartCluster(t, 3)
		err := startupError(t, config{store: backend.Config{RedisURL: "redis://" + cluster.Masters[0].Addr}})
		if err == nil || !strings.Contains(err.Error(), "use -redis-cluster") {
			t.Errorf("%v; want an error saying to use -redis-cluster", err)
		}
	})
	t.Run("-rules-dsn without the table", func(t *testing.T) {
		dsn, conn := postgres(t)
		if _, err := conn.Exec(context.Background(), "DROP TABLE rate_limit_rule CASCADE"); err != nil {
			t.Fatal(err)
		}
		if err := startupError(t, config{rulesDSN: dsn}); err == nil || !strings.Contains(err.Error(), "rate_limit_rule") {
			t.Errorf("%v; want an error naming the table", err)
		}
	})
}

// TestStoreReadyBeforeServing: the scripts are loaded before the first request, and a
// Redis that does not answer at start is not an error (the gateway starts on the shares).
func TestStoreReadyBeforeServing(t *testing.T) {
	srv := redistest.Start(t)
	cfg := backend.Config{RedisURL: "redis://" + srv.Addr, Instances: 1, Timeout: 5 * time.Millisecond,
		BreakerOpen: time.Second, LocalMaxKeys: 1000, LocalMaxBytes: 1 << 20}
	_, closeStore, err := openStore(context.Background(), cfg, newMetrics(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	info, err := srv.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("cmdstat_script|load:calls=%d,", len(algorithmList())); !strings.Contains(info, want) {
		t.Errorf("before any request, commandstats hold no %q:\n%s", want, info)
	}
	srv.Kill()
	var logs syncBuffer
	_, closeDown, err := openStore(context.Background(), cfg, newMetrics(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("Redis down at start: %v; want a start on the shares", err)
	}
	defer closeDown()
	if !strings.Contains(logs.String(), "Redis does not answer") {
		t.Errorf("Redis down at start, and the log does not say so:\n%s", logs.String())
	}
}

// TestRedisLogGoesToTheLog: go-redis's own lines go to the gateway's log. (The fallback
// store logs its switches to and from the shares itself: fallback.WithLogger.)
func TestRedisLogGoesToTheLog(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	redisLog{log}.Printf(context.Background(), "pool.go:770: %s\n", "connection pool: failed to dial")
	if !strings.Contains(logs.String(), `"msg":"pool.go:770: connection pool: failed to dial","source":"go-redis"`) {
		t.Errorf("a go-redis line: %s", logs.String())
	}
}
