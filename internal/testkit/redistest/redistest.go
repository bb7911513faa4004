// Package redistest starts real Redis servers for tests: single servers on free ports,
// and Redis Clusters, killed when their test ends. They run as redis-server processes of
// this machine, or wherever the Launcher set with UseLauncher runs them (the containers of
// internal/integration). Tests that only send commands may use a server of the caller's
// instead, named by REDIS_ADDR (see Addr). When Redis cannot be started (no redis-server
// installed, say) the test is skipped, or fails if RATELIMIT_REQUIRE_REDIS=1 (as in CI).
// Waiting is always polling for the event with a deadline, never a fixed sleep.
package redistest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartupTimeout bounds how long a server or cluster may take to come up.
const StartupTimeout = 20 * time.Second

// Server is one redis-server, run by the current Launcher.
type Server struct {
	t    testing.TB
	Addr string
	node Node
}

// settings are what every server of the harness runs with, before a test's own args:
// nothing kept on disk, in the foreground.
var settings = []string{"--save", "", "--appendonly", "no", "--daemonize", "no"}

// Start starts a redis-server on a free port with args added to its command line, and
// waits until it answers PING. It is killed when the test ends.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return launch(t, 1, args)[0]
}

// launch starts n servers with args through the current Launcher and waits until each
// answers PING, trying fresh ports when one was taken between finding it and binding it.
// With -short, it skips the test: the quick loop runs what needs no server.
func launch(t testing.TB, n int, args []string) []*Server {
	t.Helper()
	if testing.Short() {
		t.Skip("a test of a real Redis: run without -short")
	}
	l := CurrentLauncher()
	var err error
	for range 10 {
		var ports []int
		for len(ports) < n && err == nil {
			var port int
			port, err = freePort()
			ports = append(ports, port)
		}
		if err != nil {
			continue
		}
		var nodes []Node
		if nodes, err = l.Launch(t, ports, append(slices.Clone(settings), args...)); err != nil {
			continue
		}
		servers := make([]*Server, n)
		for i, node := range nodes {
			servers[i] = &Server{t: t, Addr: node.Addr(), node: node}
			t.Cleanup(servers[i].Kill)
		}
		for _, s := range servers {
			if err = s.waitUp(); err != nil {
				break
			}
		}
		if err == nil {
			return servers
		}
		for _, s := range servers {
			s.Kill()
		}
	}
	t.Fatalf("redis-server (%s) did not start: %v", l.Name(), err)
	return nil
}

// freePort is a port on 127.0.0.1 that no one listens on now, nor on the port 10000
// above it (a cluster node's bus). It is drawn from below the kernel's ephemeral range
// (32768 and up on Linux), where the port a listener on ":0" would get may be taken by
// any outgoing connection the moment that listener closes: on a busy machine, with
// other test runs beside this one, that happened between finding a port and binding it.
func freePort() (int, error) {
	var err error
	for range 100 {
		port := minPort + rand.IntN(maxPort-minPort)
		var a, b net.Listener
		if a, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err != nil {
			continue
		}
		b, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		a.Close()
		if err != nil {
			continue
		}
		b.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port found: %w", err)
}

// The ports servers are started on, and their cluster buses 10000 above: all below the
// ephemeral range, and the buses apart from the servers, so that no server of another
// test run takes the bus port of a node this one found free.
const minPort, maxPort = 10000, 20000

// waitUp polls the server with PING until it answers, or it exits, or StartupTimeout.
func (s *Server) waitUp() error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(StartupTimeout)
	for {
		select {
		case <-s.node.Exited():
			return fmt.Errorf("redis-server on %s exited: %s", s.Addr, s.node.Log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.node.Signal(syscall.SIGKILL)
			return fmt.Errorf("redis-server on %s does not answer: %v: %s", s.Addr, err, s.node.Log())
		}
		time.Sleep(10 * time.Millisecond) // poll interval, not a wait for time to pass
	}
}

// LastLines is the last n lines of s on one line, " | " between them: a log's end, for a
// failure's message.
func LastLines(s string, n int) string {
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
	s.node.Signal(syscall.SIGCONT) // a stopped process must run to die
	s.node.Signal(syscall.SIGKILL)
	deadline := time.Now().Add(StartupTimeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	s.t.Errorf("redis-server on %s still answers after SIGKILL", s.Addr)
}

// Restart starts the server again on the same port, empty (it keeps nothing on disk).
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	deadline := time.Now().Add(StartupTimeout)
	for time.Now().Before(deadline) { // the port may linger a moment after the kill
		if err = s.node.Restart(); err == nil {
			if err = s.waitUp(); err == nil {
				return
			}
		}
	}
	s.t.Fatalf("redis-server did not restart on %s: %v", s.Addr, err)
}

// Pause stops the server (SIGSTOP): connections stay open, nothing answers.
func (s *Server) Pause() { s.node.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.node.Signal(syscall.SIGCONT) }

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
	servers := launch(t, n*(1+replicas), []string{"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"})
	c := &Cluster{Masters: servers[:n], Replicas: servers[n:]}
	if err := c.create(); err != nil {
		t.Fatalf("creating a cluster of %d masters and %d replicas (%s): %v", n, len(c.Replicas), CurrentLauncher().Name(), err)
	}
	return c
}

// create makes the servers one cluster, as redis-cli --cluster create would: the slots
// split evenly over the masters, every node introduced to the first, each replica
// following its master (replica i of master i), and every node seeing all slots served.
func (c *Cluster) create() error {
	ctx := context.Background()
	all := append(slices.Clone(c.Masters), c.Replicas...)
	clients := make([]*redis.Client, len(all))
	for i, s := range all {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		defer clients[i].Close()
	}
	const slots = 16384
	for i := range c.Masters {
		lo, hi := i*slots/len(c.Masters), (i+1)*slots/len(c.Masters)-1
		if err := clients[i].Do(ctx, "cluster", "addslotsrange", lo, hi).Err(); err != nil {
			return fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d on %s: %w", lo, hi, all[i].Addr, err)
		}
		// Distinct epochs at once, rather than collisions resolved by gossip.
		if err := clients[i].Do(ctx, "cluster", "set-config-epoch", i+1).Err(); err != nil {
			return fmt.Errorf("CLUSTER SET-CONFIG-EPOCH on %s: %w", all[i].Addr, err)
		}
	}
	for _, s := range all[1:] { // nodes of one launch reach each other at 127.0.0.1
		_, port, err := net.SplitHostPort(s.Addr)
		if err != nil {
			return err
		}
		if err := clients[0].Do(ctx, "cluster", "meet", "127.0.0.1", port).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET 127.0.0.1 %s: %w", port, err)
		}
	}
	known := "cluster_known_nodes:" + strconv.Itoa(len(all)) + "\r\n"
	if err := c.await(clients, "knows every node", func(info string) bool { return strings.Contains(info, known) }); err != nil {
		return err
	}
	for i := range c.Replicas {
		id, err := clients[i].Do(ctx, "cluster", "myid").Text()
		if err != nil {
			return fmt.Errorf("CLUSTER MYID on %s: %w", c.Masters[i].Addr, err)
		}
		if err := clients[len(c.Masters)+i].Do(ctx, "cluster", "replicate", id).Err(); err != nil {
			return fmt.Errorf("CLUSTER REPLICATE on %s: %w", c.Replicas[i].Addr, err)
		}
	}
	return c.await(clients, "sees all slots served", func(info string) bool {
		return strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") &&
			strings.Contains(info, known)
	})
}

// await polls every node's CLUSTER INFO until ready holds on each, within StartupTimeout.
func (c *Cluster) await(clients []*redis.Client, what string, ready func(info string) bool) error {
	deadline := time.Now().Add(StartupTimeout)
	for _, client := range clients {
		for {
			info, err := client.ClusterInfo(context.Background()).Result()
			if err == nil && ready(info) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("node %s never %s: %v %q", client.Options().Addr, what, err, info)
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
	}
	return nil
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

// Info is the field of c's server's INFO in section (its header's name: "Clients",
// "Stats", "Commandstats"), "" when it has none.
func Info(t testing.TB, c *redis.Client, section, field string) string {
	t.Helper()
	info := c.InfoMap(context.Background(), strings.ToLower(section))
	if err := info.Err(); err != nil {
		t.Fatal(err)
	}
	return info.Item(section, field)
}

// CommandCalls reads INFO commandstats of c's server: how often it ran cmd ("evalsha").
func CommandCalls(t testing.TB, c *redis.Client, cmd string) int {
	t.Helper()
	var n int
	if rest, ok := strings.CutPrefix(Info(t, c, "Commandstats", "cmdstat_"+cmd), "calls="); ok {
		fmt.Sscan(strings.SplitN(rest, ",", 2)[0], &n)
	}
	return n
}

// BlockedClients is how many clients c's server holds in a blocking command (BLPOP),
// from INFO clients: a client counts from the moment it blocks, on Redis and on Valkey
// alike (whose commandstats count a blocking command only once it returns).
func BlockedClients(t testing.TB, c *redis.Client) int {
	t.Helper()
	var n int
	fmt.Sscan(Info(t, c, "Clients", "blocked_clients"), &n)
	return n
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
