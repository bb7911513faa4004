package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is one redis-server in sentinel mode, watching one master.
type Sentinel struct {
	Addr string
	// Master is the name the sentinel knows the master by.
	Master string
	cmd    *exec.Cmd
}

// StartReplica starts a redis-server replicating master, and waits until its link to
// the master is up.
func StartReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	_, port, _ := strings.Cut(master.Addr, ":")
	r := Start(t, "--replicaof", "127.0.0.1", port)
	c := r.Client()
	Eventually(t, "the replica's link to its master", func() bool {
		info, err := c.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	return r
}

// StartSentinel starts a sentinel, a redis-server process of this machine whatever the
// Launcher, on a free port monitoring master as "mymaster", with a
// quorum of 1 (it alone decides a failover), a master down after 1s of silence and a
// failover timeout of 5s, and waits until it answers and knows the master's replicas.
func StartSentinel(t testing.TB, master *Server, replicas int) *Sentinel {
	t.Helper()
	if testing.Short() {
		t.Skip("a test of a real Redis: run without -short")
	}
	binary(t, "redis-server")
	_, mport, _ := strings.Cut(master.Addr, ":")
	dir := t.TempDir()
	var err error
	for range 5 { // a free port can be taken between finding it and binding it
		var port int
		if port, err = freePort(); err != nil {
			continue
		}
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\ndaemonize no\n"+
			"sentinel monitor mymaster 127.0.0.1 %s 1\n"+
			"sentinel down-after-milliseconds mymaster 1000\n"+
			"sentinel failover-timeout mymaster 5000\n"+
			"sentinel parallel-syncs mymaster 1\n",
			port, dir, filepath.Join(dir, "sentinel.log"), mport)
		if err = os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("redis-server", conf, "--sentinel")
		if err = cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		s := &Sentinel{Addr: "127.0.0.1:" + strconv.Itoa(port), Master: "mymaster", cmd: cmd}
		if err = s.waitUp(exited, replicas); err == nil {
			t.Cleanup(func() { syscall.Kill(cmd.Process.Pid, syscall.SIGKILL) })
			return s
		}
		cmd.Process.Kill()
	}
	log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
	t.Fatalf("redis-server --sentinel did not start: %v: %s", err, LastLines(string(log), 5))
	return nil
}

// waitUp polls the sentinel until it answers and has found replicas of its master.
func (s *Sentinel) waitUp(exited chan error, replicas int) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(StartupTimeout)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("the sentinel exited: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		found, err := c.Replicas(ctx, s.Master).Result()
		cancel()
		if err == nil && len(found) >= replicas {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the sentinel knows %d replicas of %d, %v", len(found), replicas, err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval, not a wait for time to pass
	}
}

// MasterAddr is the address the sentinel gives for its master now.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	a, err := c.GetMasterAddrByName(ctx, s.Master).Result()
	if err != nil {
		return "", err
	}
	return a[0] + ":" + a[1], nil
}
