package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// A Launcher runs the redis-server nodes the harness starts. The default runs them as
// processes of this machine (ProcessLauncher); internal/integration's tests can run them
// in containers instead, through UseLauncher.
type Launcher interface {
	// Name says where the nodes run ("process", "container"), for messages.
	Name() string
	// Launch starts one redis-server for each port, each with args after its own
	// settings, and returns them in the order of ports. Each node listens on its port;
	// the nodes of one call reach each other at 127.0.0.1 and that port (a cluster's
	// gossip). It returns once they are started, not once they answer.
	Launch(t testing.TB, ports []int, args []string) ([]Node, error)
}

// Node is one redis-server a Launcher started.
type Node interface {
	// Addr is the address clients dial.
	Addr() string
	// Signal sends sig (SIGKILL, SIGSTOP, SIGCONT) to the server.
	Signal(sig syscall.Signal) error
	// Restart starts the server again, empty, on the same address, after a SIGKILL.
	Restart() error
	// Exited is closed when the server has exited.
	Exited() <-chan struct{}
	// Log is the end of what the server logged, for a failure's message.
	Log() string
}

var (
	launcherMu sync.Mutex
	launcher   Launcher = ProcessLauncher{}
)

// UseLauncher makes every server and cluster started from now on run with l. A test
// binary sets it once, in TestMain, before any test runs.
func UseLauncher(l Launcher) {
	launcherMu.Lock()
	defer launcherMu.Unlock()
	launcher = l
}

// CurrentLauncher is the Launcher servers are started with.
func CurrentLauncher() Launcher {
	launcherMu.Lock()
	defer launcherMu.Unlock()
	return launcher
}

// Required says that tests needing Redis must fail rather than skip when it cannot be
// started (RATELIMIT_REQUIRE_REDIS=1, as in CI).
func Required() bool { return os.Getenv("RATELIMIT_REQUIRE_REDIS") == "1" }

// Unavailable ends the test because Redis cannot be started as asked: it fails when Redis
// is required, and is skipped otherwise.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("%s, and RATELIMIT_REQUIRE_REDIS=1", why)
	}
	t.Skipf("%s: skipping a test that needs a real Redis", why)
}

// binary returns the path of name, or ends the test as Unavailable says.
func binary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, "%s is not installed (apt-get install redis-server)", name)
	}
	return path
}

// ProcessLauncher runs each node as a redis-server process of this machine, bound to
// 127.0.0.1, with its directory and log file in the test's temporary directory.
type ProcessLauncher struct{}

// Name is "process".
func (ProcessLauncher) Name() string { return "process" }

// Launch starts the processes; a test whose machine has no redis-server ends as
// Unavailable says.
func (ProcessLauncher) Launch(t testing.TB, ports []int, args []string) ([]Node, error) {
	t.Helper()
	path := binary(t, "redis-server")
	var nodes []Node
	for _, port := range ports {
		p := &process{path: path, port: port, dir: t.TempDir(), args: args}
		if err := p.start(); err != nil {
			for _, n := range nodes {
				n.Signal(syscall.SIGKILL)
			}
			return nil, err
		}
		nodes = append(nodes, p)
	}
	return nodes, nil
}

type process struct {
	path string
	port int
	dir  string
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

func (p *process) start() error {
	args := append([]string{
		"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1", "--dir", p.dir,
		"--logfile", filepath.Join(p.dir, "redis.log"),
	}, p.args...)
	cmd := exec.Command(p.path, args...)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() // reaps the process whenever it exits
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	return nil
}

func (p *process) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

func (p *process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return syscall.Kill(p.cmd.Process.Pid, sig)
}

func (p *process) Restart() error { return p.start() }

func (p *process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

func (p *process) Log() string {
	log, _ := os.ReadFile(filepath.Join(p.dir, "redis.log"))
	return LastLines(string(log), 5)
}
