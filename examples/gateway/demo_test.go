package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
)

// TestDemoDecidesOnItsStore: the README's demo (the gateway on its embedded miniredis,
// default flags) under load from 100 tenants decides on miniredis, not on the fallback's
// shares (at most 1% there; at the old 5ms timeout it sent 2-8% there and admitted more
// than the rules allow), and no tenant gets more than its rule.
func TestDemoDecidesOnItsStore(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, config{addr: addr, reload: time.Hour,
			store: backend.Config{Instances: 1, BreakerOpen: time.Second, LocalMaxKeys: 100_000, LocalMaxBytes: 64 << 20}}, quiet())
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	get := func(tenant string) int {
		req, _ := http.NewRequest("GET", "http://"+addr+"/orders", nil)
		req.Header.Set("X-Api-Key", tenant)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	eventually(t, "the gateway to answer", func() bool { return get("warm") == 200 })

	const tenants, workers, requests = 100, 16, 4000
	var admitted [tenants]atomic.Int64
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= requests; i = next.Add(1) {
				if get(fmt.Sprint("tenant-", i%tenants)) == 200 {
					admitted[i%tenants].Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// the default rule: 20 at once, 10 a second
	most := 20 + int64(10*elapsed.Seconds()) + 1
	for i := range admitted {
		if n := admitted[i].Load(); n > most {
			t.Errorf("tenant-%d: %d admitted in %v; the rule allows %d", i, n, elapsed, most)
		}
	}
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	count := func(source string) float64 {
		m := regexp.MustCompile(`ratelimit_store_decisions_total\{source="` + source + `"\} (\S+)`).FindSubmatch(body)
		if m == nil {
			return 0
		}
		n, _ := strconv.ParseFloat(string(m[1]), 64)
		return n
	}
	redis, shares := count("redis"), count("fallback")
	t.Logf("%d requests in %v: %.0f decisions on miniredis, %.0f on the shares", requests, elapsed, redis, shares)
	if redis == 0 || shares > 0.01*(redis+shares) {
		t.Errorf("%.0f decisions on miniredis, %.0f on the fallback's shares; want at most 1%% on the shares", redis, shares)
	}
}
