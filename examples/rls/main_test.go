package main

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// serve serves s on a free port of the loopback and returns a client of it, both closed
// when the test ends.
func serve(t testing.TB, s *server) rlsv3.RateLimitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, s)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return newClient(t, lis.Addr().String())
}

// newClient is a client of the server at addr, closed when the test ends.
func newClient(t testing.TB, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// request is a RateLimitRequest of the public-api domain, each descriptor "k=v,k2=v2".
func request(hits uint32, descriptors ...string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "public-api", HitsAddend: hits}
	for _, d := range descriptors {
		desc := &ratelimitv3.RateLimitDescriptor{}
		for _, pair := range strings.Split(d, ",") {
			k, v, _ := strings.Cut(pair, "=")
			desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, desc)
	}
	return req
}

type rls struct {
	t      *testing.T
	client rlsv3.RateLimitServiceClient
}

func (r rls) ask(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	r.t.Helper()
	resp, err := r.client.ShouldRateLimit(context.Background(), req)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp
}

// The generated client against the server over a real socket, on the embedded rules:
// 100 a minute per api_key, 5 a minute on /login, a nested rule, an unlimited one, a
// shadow-mode one, hits_addend, and a request whose second descriptor denies while its
// first would allow, which consumes nothing.
func TestShouldRateLimit(t *testing.T) {
	rules, err := loadRules("")
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m := newMetrics()
	r := rls{t, serve(t, newServer(localstore.New(localstore.WithClock(clk)), rules, m, true, quiet()))}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	resp := r.ask(request(1, "api_key=a", "path=/login"))
	if resp.OverallCode != ok || len(resp.Statuses) != 2 {
		t.Fatalf("first: %v", resp)
	}
	s := resp.Statuses[0]
	if s.Code != ok || s.CurrentLimit.RequestsPerUnit != 100 || s.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE ||
		s.LimitRemaining != 99 || s.DurationUntilReset.AsDuration() != time.Minute {
		t.Errorf("api_key status: %v", s)
	}
	if s := resp.Statuses[1]; s.CurrentLimit.RequestsPerUnit != 5 || s.LimitRemaining != 4 {
		t.Errorf("/login status: %v", s)
	}
	headers := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		headers[h.Key] = h.Value
	}
	if headers["RateLimit-Limit"] != "5" || headers["RateLimit-Remaining"] != "4" || headers["RateLimit-Reset"] != "60" {
		t.Errorf("headers %v; want /login's, the tightest: 5, 4, 60", headers)
	}

	// hits_addend: 4 more logins spend /login
	if resp := r.ask(request(4, "api_key=b", "path=/login")); resp.OverallCode != ok || resp.Statuses[1].LimitRemaining != 0 {
		t.Fatalf("4 hits: %v", resp)
	}
	// a's next login: /login denies, a's own limit would allow; nothing is consumed
	resp = r.ask(request(1, "api_key=a", "path=/login"))
	if resp.OverallCode != over || resp.Statuses[0].Code != ok || resp.Statuses[1].Code != over {
		t.Fatalf("the sixth login: %v", resp)
	}
	if resp := r.ask(request(1, "api_key=a")); resp.Statuses[0].LimitRemaining != 98 {
		t.Errorf("a after the denied login: %d left; want 98 (nothing taken)", resp.Statuses[0].LimitRemaining)
	}
	// 100 a minute per api_key: c's 101st is over, d is not
	if resp := r.ask(request(100, "api_key=c")); resp.OverallCode != ok {
		t.Fatalf("100 of 100: %v", resp)
	}
	if resp := r.ask(request(1, "api_key=c")); resp.OverallCode != over {
		t.Errorf("the 101st of c: %v", resp)
	}
	if resp := r.ask(request(1, "api_key=d")); resp.OverallCode != ok {
		t.Errorf("d: %v", resp)
	}
	// the nested rule: 10 an hour of (api_key, /export), on the sliding log
	for i := range 11 {
		want := ok
		if i == 10 {
			want = over
		}
		if resp := r.ask(request(1, "api_key=e,path=/export")); resp.OverallCode != want ||
			resp.Statuses[0].CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Fatalf("export %d: %v", i+1, resp)
		}
	}
	// unlimited, and a descriptor no rule matches
	resp = r.ask(request(1000, "path=/healthz", "path=/nowhere"))
	if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != math.MaxUint32 || resp.Statuses[1].CurrentLimit != nil {
		t.Errorf("unlimited and unmatched: %v", resp)
	}
	// shadow mode: 50 a second, answered OK past it, counted in the metrics
	if resp := r.ask(request(60, "path=/search")); resp.OverallCode != ok || resp.Statuses[0].Code != ok {
		t.Errorf("60 searches of a shadow 50/s: %v", resp)
	}
	if got := counter(t, m, "ratelimit_service_rate_limit_shadow_mode", "public-api.path_/search"); got != 60 {
		t.Errorf("shadow_mode counter %v; want 60", got)
	}
	if got := counter(t, m, "ratelimit_service_rate_limit_over_limit", "public-api.path_/login"); got != 1 {
		t.Errorf("/login over_limit counter %v; want 1", got)
	}
	if got := counter(t, m, "ratelimit_service_rate_limit_within_limit", "public-api.api_key"); got < 100 {
		t.Errorf("api_key within_limit counter %v", got)
	}
	// a minute later, /login is back
	clk.Advance(time.Minute)
	if resp := r.ask(request(1, "api_key=a", "path=/login")); resp.OverallCode != ok {
		t.Errorf("a minute later: %v", resp)
	}
	// a domain without rules limits nothing
	other := request(1, "api_key=a")
	other.Domain = "elsewhere"
	if resp := r.ask(other); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("another domain: %v", resp)
	}
}

// Requests the service refuses are refused, with the gRPC code that says why.
func TestBadRequests(t *testing.T) {
	rules, err := loadRules("")
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, newServer(localstore.New(), rules, newMetrics(), true, quiet()))
	override := request(1, "api_key=a")
	override.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	perDescriptor := request(1, "api_key=a")
	perDescriptor.Descriptors[0].HitsAddend = wrapperspb.UInt64(3)
	for name, c2 := range map[string]struct {
		req  *rlsv3.RateLimitRequest
		code codes.Code
	}{
		"no domain":             {&rlsv3.RateLimitRequest{Descriptors: request(1, "a=b").Descriptors}, codes.InvalidArgument},
		"no descriptors":        {&rlsv3.RateLimitRequest{Domain: "public-api"}, codes.InvalidArgument},
		"too many descriptors":  {request(1, slices.Repeat([]string{"api_key=a"}, 65)...), codes.InvalidArgument},
		"a limit override":      {override, codes.Unimplemented},
		"hits_addend per entry": {perDescriptor, codes.Unimplemented},
	} {
		if _, err := c.ShouldRateLimit(context.Background(), c2.req); status.Code(err) != c2.code {
			t.Errorf("%s: %v; want %v", name, err, c2.code)
		}
	}
	// a descriptor without entries matches nothing, and is OK, as in the service
	empty := &rlsv3.RateLimitRequest{Domain: "public-api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}}
	if resp, err := c.ShouldRateLimit(context.Background(), empty); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("an empty descriptor: %v, %v; want OK", resp, err)
	}
}

// counter is the value of a per-rule counter.
func counter(t *testing.T, m *metrics, name, key string) float64 {
	t.Helper()
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "key" && l.GetValue() == key {
					return mt.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// The whole program: the embedded miniredis behind the fallback store, gRPC health
// checking, /metrics and /healthcheck, and a rules file reloaded when it changes.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(limit string) {
		rules := "domain: public-api\ndescriptors:\n  - {key: api_key, rate_limit: {unit: hour, requests_per_unit: " + limit + "}}\n"
		if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("7")
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, config{addr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", rules: path, headers: true,
			store: backendConfig()}, quiet(), func(g, h string) { addrs <- [2]string{g, h} })
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	conn, err := grpc.NewClient(a[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(),
		&healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check: %v, %v", h, err)
	}
	r := rls{t, rlsv3.NewRateLimitServiceClient(conn)}
	if resp := r.ask(request(1, "api_key=a")); resp.OverallCode != rlsv3.RateLimitResponse_OK ||
		resp.Statuses[0].CurrentLimit.RequestsPerUnit != 7 || resp.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("on the embedded miniredis: %v", resp)
	}
	write("70")
	redistest.Eventually(t, "the changed rules file in force", func() bool {
		return r.ask(request(1, "api_key=b")).Statuses[0].CurrentLimit.RequestsPerUnit == 70
	})
	for _, url := range []string{"http://" + a[1] + "/healthcheck", "http://" + a[1] + "/metrics"} {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d", url, resp.StatusCode)
		}
		if strings.HasSuffix(url, "/metrics") {
			for _, want := range []string{`ratelimit_service_rate_limit_within_limit{domain="public-api",key="public-api.api_key"}`,
				`ratelimit_store_decisions_total{source="redis"}`} {
				if !strings.Contains(string(body), want) {
					t.Errorf("/metrics has no %s", want)
				}
			}
		}
	}
}

// backendConfig is the store of a test: the embedded miniredis, one instance.
func backendConfig() backend.Config {
	return backend.Config{Instances: 1, Timeout: 50 * time.Millisecond, BreakerOpen: time.Second}
}
