package integration_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelimit-go/ratelimit/internal/integration/containers"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redissuite"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	l, closeLauncher := chooseLauncher()
	redistest.UseLauncher(l)
	code := m.Run()
	closeLauncher()
	os.Exit(code)
}

// chooseLauncher picks where the servers run, as the package doc says.
func chooseLauncher() (redistest.Launcher, func()) {
	nothing := func() {}
	mode := os.Getenv("RATELIMIT_REDIS")
	switch mode {
	case "process":
		return redistest.ProcessLauncher{}, nothing
	case "container", "":
		if _, err := exec.LookPath("redis-server"); err == nil && mode == "" {
			return redistest.ProcessLauncher{}, nothing
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, err := containers.New(ctx)
		if err != nil {
			why := "RATELIMIT_REDIS=container, but " + err.Error()
			if mode == "" {
				why = "redis-server is not installed, and " + err.Error()
			}
			return unavailable(why), nothing
		}
		return l, func() { l.Close() }
	}
	return unavailable(fmt.Sprintf("RATELIMIT_REDIS=%q; want process or container", mode)), nothing
}

// unavailable is a Launcher that starts nothing: every test that needs Redis ends as
// redistest.Unavailable says, with the reason.
type unavailable string

func (u unavailable) Name() string { return "none: " + string(u) }

func (u unavailable) Launch(t testing.TB, _ []int, _ []string) ([]redistest.Node, error) {
	t.Helper()
	redistest.Unavailable(t, "%s", string(u))
	return nil, nil
}

// TestSuite runs the tests every Redis must pass, the conformance suite, the parity, the
// case study's 1,000 parallel requests and the cluster's among them, on the servers
// chosen.
func TestSuite(t *testing.T) {
	t.Logf("Redis runs as: %s", redistest.CurrentLauncher().Name())
	redissuite.Run(t)
}

// TestServerLifecycle: what the harness does to a server, a failover test's tools, works
// on the servers chosen: paused, it keeps its connections and answers nothing; resumed, it
// answers; killed, its port closes; restarted, it answers on the same address, empty.
func TestServerLifecycle(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())

	srv.Pause()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := c.Ping(short).Err()
	cancel()
	assert.Error(t, err, "a paused server answered PING")

	srv.Resume()
	redistest.Eventually(t, "the resumed server to answer", func() bool { return c.Ping(ctx).Err() == nil })
	v, err := c.Get(ctx, "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "v", v, "the resumed server lost what it held")

	srv.Kill() // returns once the port is closed
	srv.Restart()
	redistest.Eventually(t, "the restarted server to answer", func() bool { return c.Ping(ctx).Err() == nil })
	n, err := c.Exists(ctx, "k").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a restarted server kept a key; it must start empty")
}
