package main

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore/members"
)

// TestEndToEnd builds the gateway, runs it on a real redis-server beside another member of
// its fleet, drives it, kills Redis, and checks that it keeps answering, from its share of
// the rules: half, as it learned there were two gateways.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the gateway binary")
	}
	srv := redistest.Start(t)
	bin := filepath.Join(t.TempDir(), "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	other := members.New(srv.Client(), "gateway", members.WithID("the-other-gateway"))
	if _, err := other.Beat(context.Background()); err != nil { // a member before the gateway starts
		t.Fatal(err)
	}
	beating, stopBeating := context.WithCancel(context.Background())
	defer stopBeating()
	go other.Run(beating) // and as long as the test runs
	// no -instances: the gateway learns that there are 2
	la, err := net.Listen("tcp", "127.0.0.1:0") // the binary's admin address
	if err != nil {
		t.Fatal(err)
	}
	admin := la.Addr().String()
	la.Close()
	gw := exec.Command(bin, "-addr", addr, "-admin-addr", admin, "-redis", "redis://"+srv.Addr,
		"-timeout", "50ms", "-breaker-open", "200ms")
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- gw.Wait() }()
	t.Cleanup(func() { gw.Process.Kill() })
	eventually(t, "the gateway to answer /healthz", func() bool {
		res, err := http.Get("http://" + admin + "/healthz")
		if err == nil {
			res.Body.Close()
		}
		return err == nil && res.StatusCode == 200
	})

	// drive sends n requests for tenant, checks that each is answered 200 or 429, and
	// returns the 200s and the X-RateLimit-Limit of the last response
	drive := func(tenant string, n int) (ok int, limit string) {
		for range n {
			req, _ := http.NewRequest("GET", "http://"+addr+"/anything", nil)
			req.Header.Set("X-Api-Key", tenant)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			switch res.StatusCode {
			case 200:
				ok++
			case 429:
			default:
				t.Fatalf("tenant %s: status %d", tenant, res.StatusCode)
			}
			limit = res.Header.Get("X-RateLimit-Limit")
		}
		return ok, limit
	}
	// the default rule: capacity 20, refilled at 10 per second
	if ok, limit := drive("before", 25); ok < 20 || ok > 23 || limit != "20" {
		t.Errorf("with Redis: %d of 25 admitted, limit %s; want about 20 of 20", ok, limit)
	}
	srv.Kill()
	if ok, limit := drive("during", 25); ok < 10 || ok > 13 || limit != "20" {
		t.Errorf("without Redis: %d of 25 admitted, limit %s; want about 10, the share of 2 instances, under the rule's limit of 20", ok, limit)
	}

	gw.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the gateway did not stop cleanly: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Error("the gateway did not stop within 15s of SIGTERM")
	}
}

// TestRegionsEndToEnd: a gateway of region eu, beside region us's Redis, moves its share
// of every rule toward its traffic: all of it comes to eu, so eu's share grows from a
// half, and its responses' X-RateLimit-Limit with it.
func TestRegionsEndToEnd(t *testing.T) {
	eu, us := redistest.Start(t), redistest.Start(t)
	addr, _ := startGateway(t, config{reload: time.Hour,
		regions: regionsConfig{self: "eu", list: "eu=redis://" + eu.Addr + ",us=redis://" + us.Addr, every: time.Second},
		store: backend.Config{Instances: 1, Timeout: 50 * time.Millisecond, BreakerOpen: time.Second,
			LocalMaxKeys: 1000, LocalMaxBytes: 1 << 20}})
	limit := func() string {
		req, _ := http.NewRequest("GET", "http://"+addr+"/anything", nil)
		req.Header.Set("X-Api-Key", "shop-z")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return ""
		}
		res.Body.Close()
		return res.Header.Get("X-RateLimit-Limit")
	}
	eventually(t, "the gateway to answer", func() bool { return limit() != "" })
	if got := limit(); got != "10" {
		t.Fatalf("X-RateLimit-Limit %q at first; want 10, half of the default burst of 20", got)
	}
	eventually(t, "eu's share to grow with its traffic", func() bool {
		n, _ := strconv.Atoi(limit())
		return n > 10
	})
}
