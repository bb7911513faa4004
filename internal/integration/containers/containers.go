// Package containers runs the test harness's Redis servers in containers, with
// testcontainers-go, as a redistest.Launcher: set it with redistest.UseLauncher and every
// server and cluster the tests start runs in a container instead of a process.
//
// The image is redis:7-alpine unless RATELIMIT_REDIS_IMAGE names another; it needs
// redis-server on its PATH (and a shell, for the bridge network below). A machine without
// a registry builds one from its own redis-server with redis-image.sh beside this package.
//
// Two ways to reach the servers, chosen by RATELIMIT_REDIS_NETWORK:
//   - "host": each server is a container on the host's network, bound to 127.0.0.1 on a
//     free port the test chose, as a process would be; a cluster's nodes are one container
//     each. No port goes through the Docker bridge. It needs a Docker engine on this
//     machine's own kernel (Linux, not Docker Desktop).
//   - "bridge": the servers of one launch (a server, or a whole cluster) run in one
//     container on Docker's bridge network, each on its own port published on the same
//     port of the host, a cluster's nodes announcing 127.0.0.1: they reach each other
//     inside the container, and the tests reach them through the published ports. This is
//     what Docker Desktop offers.
//
// Unset, it is "host" where that works (a local engine that is not Docker Desktop) and
// "bridge" elsewhere.
//
// testcontainers' reaper is turned off (TESTCONTAINERS_RYUK_DISABLED, unless set): its
// image comes from a registry that a machine like CI's cannot reach. The launcher removes
// its containers itself when their test ends, and at its start removes those that a test
// binary of this machine left behind when it was killed (a timeout, say): every container
// is labelled with the process that started it.
package containers

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
	tclog "github.com/testcontainers/testcontainers-go/log"

	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
)

// DefaultImage is the image servers run from unless RATELIMIT_REDIS_IMAGE names another.
const DefaultImage = "redis:7-alpine"

// Labels every container of the launcher carries: what it is, and which process of which
// machine started it.
const (
	labelKind = "org.ratelimit-go.test"
	labelPID  = "org.ratelimit-go.pid"
	labelHost = "org.ratelimit-go.host"
)

// Launcher starts redis-server nodes in containers. It implements redistest.Launcher.
type Launcher struct {
	image  string
	host   bool // host networking
	docker *testcontainers.DockerClient
}

var _ redistest.Launcher = (*Launcher)(nil)

// New connects to the Docker engine (DOCKER_HOST, or testcontainers' own discovery),
// chooses the network as the package doc says, and removes the containers that dead test
// processes of this machine left. It fails when no engine answers.
func New(ctx context.Context) (*Launcher, error) {
	setDefault("TESTCONTAINERS_RYUK_DISABLED", "true")
	docker, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return nil, fmt.Errorf("containers: no Docker engine found (testcontainers says: %w)", err)
	}
	info, err := docker.Info(ctx, client.InfoOptions{})
	if err != nil {
		docker.Close()
		return nil, fmt.Errorf("containers: the Docker engine does not answer: %w", err)
	}
	l := &Launcher{image: os.Getenv("RATELIMIT_REDIS_IMAGE"), docker: docker}
	if l.image == "" {
		l.image = DefaultImage
	}
	switch mode := os.Getenv("RATELIMIT_REDIS_NETWORK"); mode {
	case "host":
		l.host = true
	case "bridge":
	case "":
		l.host = info.Info.OSType == "linux" && info.Info.OperatingSystem != "Docker Desktop" && localEngine(docker)
	default:
		docker.Close()
		return nil, fmt.Errorf("containers: RATELIMIT_REDIS_NETWORK=%q; want host or bridge", mode)
	}
	if l.host {
		// Every server is at 127.0.0.1; without this, testcontainers inside a container
		// (as on CI's machine) would take the default gateway for the engine's address.
		setDefault("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")
	}
	l.removeOrphans(ctx)
	return l, nil
}

func setDefault(name, value string) {
	if _, ok := os.LookupEnv(name); !ok {
		os.Setenv(name, value)
	}
}

// localEngine says the engine runs on this machine: it is reached through a unix socket.
func localEngine(docker *testcontainers.DockerClient) bool {
	return strings.HasPrefix(docker.DaemonHost(), "unix://")
}

// Close closes the connection to the engine.
func (l *Launcher) Close() error { return l.docker.Close() }

// Name is "container", with the image and network.
func (l *Launcher) Name() string {
	if l.host {
		return "container " + l.image + ", host network"
	}
	return "container " + l.image + ", bridge network"
}

// Launch starts the servers: a container each on the host's network, or one container
// for them all on the bridge.
func (l *Launcher) Launch(t testing.TB, ports []int, args []string) ([]redistest.Node, error) {
	t.Helper()
	if l.host {
		var nodes []redistest.Node
		for _, port := range ports {
			n, err := l.startHost(t, port, args)
			if err != nil {
				return nil, err
			}
			nodes = append(nodes, n)
		}
		return nodes, nil
	}
	return l.startBridge(t, ports, args)
}

// run starts a container of the image with the labels and removes it when the test ends.
func (l *Launcher) run(t testing.TB, opts ...testcontainers.ContainerCustomizer) (*testcontainers.DockerContainer, error) {
	host, _ := os.Hostname()
	opts = append([]testcontainers.ContainerCustomizer{testcontainers.WithLogger(tclog.TestLogger(t))}, opts...)
	opts = append(opts, testcontainers.WithLabels(map[string]string{
		labelKind: "redis", labelPID: strconv.Itoa(os.Getpid()), labelHost: host,
	}))
	ctx, cancel := context.WithTimeout(context.Background(), redistest.StartupTimeout)
	defer cancel()
	c, err := testcontainers.Run(ctx, l.image, opts...)
	if c != nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), redistest.StartupTimeout)
			defer cancel()
			if err := c.Terminate(ctx, testcontainers.StopTimeout(0)); err != nil {
				t.Errorf("removing container %s: %v", c.GetContainerID(), err)
			}
		})
	}
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", l.image, err)
	}
	return c, nil
}

// removeOrphans removes the containers that test processes of this machine which are no
// longer running left behind.
func (l *Launcher) removeOrphans(ctx context.Context) {
	host, _ := os.Hostname()
	list, err := l.docker.ContainerList(ctx, client.ContainerListOptions{
		All: true, Filters: make(client.Filters).Add("label", labelKind+"=redis", labelHost+"="+host),
	})
	if err != nil {
		return
	}
	for _, c := range list.Items {
		pid, err := strconv.Atoi(c.Labels[labelPID])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue // not ours to judge, or its process still runs
		}
		l.docker.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	}
}

// watch returns a channel closed when c next stops running.
func (l *Launcher) watch(c *testcontainers.DockerContainer) <-chan struct{} {
	stopped := make(chan struct{})
	wait := l.docker.ContainerWait(context.Background(), c.GetContainerID(),
		client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	go func() {
		select {
		case <-wait.Result:
		case <-wait.Error: // the container is gone, or the engine
		}
		close(stopped)
	}()
	return stopped
}

// hostNode is a server alone in a container on the host's network.
type hostNode struct {
	l    *Launcher
	c    *testcontainers.DockerContainer
	port int

	mu     sync.Mutex
	exited <-chan struct{}
}

func (l *Launcher) startHost(t testing.TB, port int, args []string) (*hostNode, error) {
	c, err := l.run(t,
		testcontainers.WithEntrypoint("redis-server"),
		testcontainers.WithCmd(append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", "/data",
		}, args...)...),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
	)
	if err != nil {
		return nil, err
	}
	n := &hostNode{l: l, c: c, port: port}
	n.watch()
	return n, nil
}

// watch sets a new exited channel, closed when the container next stops running.
func (n *hostNode) watch() {
	exited := n.l.watch(n.c)
	n.mu.Lock()
	n.exited = exited
	n.mu.Unlock()
}

func (n *hostNode) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// Signal pauses and unpauses the container for SIGSTOP and SIGCONT (the engine's freezer:
// connections stay open, nothing answers), and sends it any other signal.
func (n *hostNode) Signal(sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), redistest.StartupTimeout)
	defer cancel()
	id := n.c.GetContainerID()
	switch sig {
	case syscall.SIGSTOP:
		_, err := n.l.docker.ContainerPause(ctx, id, client.ContainerPauseOptions{})
		return err
	case syscall.SIGCONT:
		state, err := n.c.State(ctx)
		if err != nil || !state.Paused {
			return err
		}
		_, err = n.l.docker.ContainerUnpause(ctx, id, client.ContainerUnpauseOptions{})
		return err
	}
	_, err := n.l.docker.ContainerKill(ctx, id, client.ContainerKillOptions{Signal: strconv.Itoa(int(sig))})
	if err != nil {
		if state, serr := n.c.State(ctx); serr == nil && !state.Running {
			return nil // it had exited already
		}
	}
	return err
}

// Restart starts the stopped container again: the same server, empty, on the same port.
func (n *hostNode) Restart() error {
	ctx, cancel := context.WithTimeout(context.Background(), redistest.StartupTimeout)
	defer cancel()
	if _, err := n.l.docker.ContainerStart(ctx, n.c.GetContainerID(), client.ContainerStartOptions{}); err != nil {
		return err
	}
	n.watch()
	return nil
}

func (n *hostNode) Exited() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exited
}

func (n *hostNode) Log() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := n.c.Logs(ctx)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer r.Close()
	b, _ := io.ReadAll(r)
	return redistest.LastLines(string(b), 5)
}

// bridgeNode is one of the servers of a container on the bridge network, run as a
// daemon by the container's shell, which exec reaches.
type bridgeNode struct {
	c    *testcontainers.DockerContainer
	addr string
	port int
	cmd  string // the shell command that starts it

	stopped <-chan struct{} // closed when the container stops
}

func (l *Launcher) startBridge(t testing.TB, ports []int, args []string) ([]redistest.Node, error) {
	var script []string
	var exposed []string
	bindings := network.PortMap{}
	nodes := make([]*bridgeNode, len(ports))
	for i, port := range ports {
		p := strconv.Itoa(port)
		nodeArgs := append([]string{"redis-server", "--port", p, "--bind", "0.0.0.0", "--protected-mode", "no",
			"--dir", "/data/" + p}, args...)
		// After the harness's settings, so that these win: a daemon the shell outlives.
		nodeArgs = append(nodeArgs, "--daemonize", "yes", "--pidfile", "/data/"+p+".pid",
			"--logfile", "/data/"+p+".log", "--cluster-announce-ip", "127.0.0.1")
		nodes[i] = &bridgeNode{port: port, cmd: "mkdir -p /data/" + p + " && " + shellJoin(nodeArgs)}
		script = append(script, nodes[i].cmd)
		exposed = append(exposed, p+"/tcp")
		bindings[network.MustParsePort(p+"/tcp")] = []network.PortBinding{{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: p}}
	}
	script = append(script, "while :; do sleep 3600; done")
	c, err := l.run(t,
		testcontainers.WithEntrypoint("sh", "-c", strings.Join(script, " && ")),
		testcontainers.WithExposedPorts(exposed...),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.PortBindings = bindings }),
	)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), redistest.StartupTimeout)
	defer cancel()
	host, err := c.Host(ctx)
	if err != nil {
		return nil, err
	}
	stopped := l.watch(c)
	out := make([]redistest.Node, len(nodes))
	for i, n := range nodes {
		n.c, n.addr, n.stopped = c, host+":"+strconv.Itoa(n.port), stopped
		out[i] = n
	}
	return out, nil
}

func (n *bridgeNode) Addr() string { return n.addr }

// exec runs a shell command in the container and returns what it printed.
func (n *bridgeNode) exec(cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), redistest.StartupTimeout)
	defer cancel()
	code, r, err := n.c.Exec(ctx, []string{"sh", "-c", cmd}, tcexec.Multiplexed())
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	io.Copy(&out, r)
	if code != 0 {
		return out.String(), fmt.Errorf("%q exited %d: %s", cmd, code, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

func (n *bridgeNode) Signal(sig syscall.Signal) error {
	_, err := n.exec(fmt.Sprintf("kill -%d $(cat /data/%d.pid)", int(sig), n.port))
	return err
}

func (n *bridgeNode) Restart() error {
	_, err := n.exec(n.cmd)
	return err
}

// Exited is closed when the container stops: a server of it that exits alone is seen
// by its failing to answer.
func (n *bridgeNode) Exited() <-chan struct{} { return n.stopped }

func (n *bridgeNode) Log() string {
	out, err := n.exec(fmt.Sprintf("tail -n 5 /data/%d.log", n.port))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return strings.Join(strings.Split(strings.TrimSpace(out), "\n"), " | ")
}

// shellJoin quotes each word for sh.
func shellJoin(words []string) string {
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(quoted, " ")
}
