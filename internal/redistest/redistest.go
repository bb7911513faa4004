// Package redistest starts real redis-server processes for tests: single servers on free
// ports, and Redis Clusters. Each is stopped when its test ends. Tests that only send
// commands may use a server of the caller's instead, named by REDIS_ADDR (see Addr). When redis-server is not
// installed the test is skipped, or fails if RATELIMIT_REQUIRE_REDIS=1 (as in CI).
// Waiting is always polling for the event with a deadline, never a fixed sleep.
package redistest

import (
	"context"
	"fmt"
	"net"
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

// StartupTimeout bounds how long a server or cluster may take to come up.
const StartupTimeout = 20 * time.Second

// Server is one redis-server process.
type Server struct {
	t    testing.TB
	Addr string
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

// binary returns the path of name, or ends the test: skipped, or failed when Redis is
// required.
func binary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("RATELIMIT_REQUIRE_REDIS") == "1" {
		t.Fatalf("%s is not installed, and RATELIMIT_REQUIRE_REDIS=1", name)
	}
	t.Skipf("%s is not installed: skipping a test that needs a real Redis (apt-get install redis-server)", name)
	return ""
}

// Start starts a redis-server on a free port with args added to its command line, and
// waits until it answers PING.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	binary(t, "redis-server")
	s := &Server{t: t, dir: t.TempDir(), args: args}
	var err error
	for range 5 { // a free port can be taken between finding it and binding it
		if s.port, err = freePort(); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("redis-server did not start: %v", err)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start() error {
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}, s.args...)
	cmd := exec.Command("redis-server", args...)
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(StartupTimeout)
	for {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server on port %d exited: %v: %s", s.port, err, lastLines(string(log), 5))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil // the goroutine above reaps the process when it exits
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return fmt.Errorf("redis-server on port %d does not answer: %v", s.port, err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval, not a wait for time to pass
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// Client returns a client of s, closed when the test ends.
func (s *Server) Client(opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.Addr}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Kill kills the server (SIGKILL) and waits until its port is closed.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT) // a stopped process must run to die
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	deadline := time.Now().Add(StartupTimeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
	s.t.Errorf("redis-server on %s still answers after SIGKILL", s.Addr)
}

// Restart starts the server again on the same port, empty (it keeps nothing on disk).
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	deadline := time.Now().Add(StartupTimeout)
	for time.Now().Before(deadline) { // the port may linger a moment after the kill
		if err = s.start(); err == nil {
			return
		}
	}
	s.t.Fatalf("redis-server did not restart on %s: %v", s.Addr, err)
}

// Pause stops the process (SIGSTOP): connections stay open, nothing answers.
func (s *Server) Pause() { syscall.Kill(s.cmd.Process.Pid, syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (s *Server) Resume() { syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT) }

// Addr is the address of a Redis for tests that only send it commands: REDIS_ADDR if it is
// set (a server of the caller's; tests keep to their own key prefixes there), else a
// server started for the test.
func Addr(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return addr
	}
	return Start(t).Addr
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Masters  []*Server
	Replicas []*Server // one per master with StartClusterWithReplicas, in no particular order
}

// StartCluster starts a cluster of n masters and waits until every node sees all 16384
// slots served.
func StartCluster(t testing.TB, n int) *Cluster { return startCluster(t, n, 0) }

// StartClusterWithReplicas starts a cluster of n masters, each with one replica, and waits
// until every node sees all 16384 slots served and knows all 2n nodes.
func StartClusterWithReplicas(t testing.TB, n int) *Cluster { return startCluster(t, n, 1) }

func startCluster(t testing.TB, n, replicas int) *Cluster {
	t.Helper()
	binary(t, "redis-cli")
	c := &Cluster{}
	var addrs []string
	for i := range n * (1 + replicas) {
		s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
		if i < n { // redis-cli makes the first n masters
			c.Masters = append(c.Masters, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
		addrs = append(addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v: %s", err, out)
	}
	deadline := time.Now().Add(StartupTimeout)
	known := "cluster_known_nodes:" + strconv.Itoa(len(addrs)) + "\r\n"
	for _, s := range append(c.Masters, c.Replicas...) {
		client := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		for {
			info, err := client.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") &&
				strings.Contains(info, known) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not ready: %v %q", s.Addr, err, info)
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
		client.Close()
	}
	return c
}

// Addrs are the masters' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Masters))
	for i, s := range c.Masters {
		addrs[i] = s.Addr
	}
	return addrs
}

// Client returns a cluster client, closed when the test ends. It waits until the client
// knows every slot's master, so that the first commands are not redirected.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { client.Close() })
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("cluster ping: %v", err)
	}
	return client
}

// Eventually polls cond until it holds, and fails the test if it does not within
// StartupTimeout: a wait for a real event (a command arrived, a connection taken), never
// a wait for time to pass.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(StartupTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // poll interval
	}
}

// CommandCalls reads INFO commandstats of c's server: how often it ran cmd ("evalsha").
func CommandCalls(t testing.TB, c *redis.Client, cmd string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			var n int
			fmt.Sscan(strings.SplitN(rest, ",", 2)[0], &n)
			return n
		}
	}
	return 0
}

// ScriptCalls is how many scripts c's server has run (EVALSHA and EVAL).
func ScriptCalls(t testing.TB, c *redis.Client) int {
	return CommandCalls(t, c, "evalsha") + CommandCalls(t, c, "eval")
}

// ExactTiming says that the tests which measure time against a budget (the share of
// decisions a Redis a few milliseconds away makes within a timeout, say) should hold their
// exact figures: RATELIMIT_EXACT_TIMING=1 says the machine is quiet (.ci/run runs those
// tests so, alone), and the race detector is off. Elsewhere other work on the machine
// takes from every budget, and such tests hold looser figures.
func ExactTiming() bool { return os.Getenv("RATELIMIT_EXACT_TIMING") == "1" && !RaceEnabled }
