// Rls is a rate limit service that Envoy, Istio or any proxy speaking Envoy's rate limit
// protocol can call: envoy.service.ratelimit.v3.RateLimitService over gRPC, with rules in
// the configuration format of Envoy's own service (envoyproxy/ratelimit), on any of this
// library's five algorithms, behind the fallback store.
//
//	go run ./examples/rls
//
// serves gRPC on :8081 with the embedded rules.yaml and an embedded miniredis (nothing to
// install), and HTTP on :8082: /metrics (Prometheus: per rule, the hits within, near and
// over the limit, and over it in shadow mode; the call's latency; the store's source,
// Redis errors and breaker) and /healthcheck. gRPC health checking answers too.
//
// Each request's descriptors are matched as the service matches them, and decided in one
// atomic multi-limit decision where their keys share a store node: a request one
// descriptor denies consumes nothing from the others. hits_addend, unlimited,
// shadow_mode, quota_mode, replaces and share_threshold work as in the service; the
// response carries each descriptor's status (its limit, what is left, the time until it
// resets) and, with -headers, the RateLimit-Limit, -Remaining and -Reset headers of the
// tightest one. Rules come from -rules (a file, or a directory of them, one domain each),
// reloaded when they change; a bad file keeps the rules in force and is logged. Redis as
// in the gateway: -redis, -redis-cluster, -instances, -timeout.
package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
	"github.com/ratelimit-go/ratelimit/examples/internal/envoyrules"
	"github.com/ratelimit-go/ratelimit/examples/internal/servers"
)

//go:embed rules.yaml
var defaultRules []byte

type config struct {
	addr, httpAddr, rules string
	headers               bool
	store                 backend.Config
}

func main() {
	var c config
	flag.StringVar(&c.addr, "addr", ":8081", "gRPC address to serve RateLimitService on")
	flag.StringVar(&c.httpAddr, "http", ":8082", "HTTP address of /metrics and /healthcheck")
	flag.StringVar(&c.rules, "rules", "", "rules in Envoy's rate limit service format: a file, or a directory of them, reloaded when they change (default: the embedded rules.yaml)")
	flag.BoolVar(&c.headers, "headers", true, "add the RateLimit-Limit, -Remaining and -Reset headers to responses")
	c.store.Flags(flag.CommandLine)
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, log, nil); err != nil {
		log.Error("rate limit service stopped", "err", err)
		os.Exit(1)
	}
}

// run serves until ctx ends; ready, when set, gets the addresses it listens on.
func run(ctx context.Context, c config, log *slog.Logger, ready func(grpcAddr, httpAddr string)) error {
	rules, err := loadRules(c.rules)
	if err != nil {
		return fmt.Errorf("-rules: %w", err)
	}
	m := newMetrics()
	c.store.Members, c.store.Algorithms = "rls", envoyrules.AlgorithmList()
	c.store.LocalMaxKeys, c.store.LocalMaxBytes = 1<<20, 64<<20
	store, closeStore, err := backend.Open(ctx, c.store, backend.NewMetrics(m.registry), log)
	if err != nil {
		return err
	}
	defer closeStore()
	srv := newServer(store, rules, m, c.headers, log)
	if c.rules != "" {
		go envoyrules.Watch(ctx, c.rules, time.Second, func(r *envoyrules.Config) {
			srv.rules.Store(r)
			log.Info("rules loaded", "domains", r.Domains())
		}, func(err error) { log.Error("bad rules; keeping the rules in force", "err", err) })
	}

	lis, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	hlis, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		lis.Close()
		return err
	}
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, srv)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("OK\n")) })
	h := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	log.Info("rate limit service listening", "grpc", lis.Addr().String(), "http", hlis.Addr().String(), "domains", rules.Domains())
	if ready != nil {
		ready(lis.Addr().String(), hlis.Addr().String())
	}
	return servers.GRPCAndHTTP(ctx, g, lis, h, hlis, func() {
		log.Info("shutting down")
		hs.Shutdown() // health checks answer NOT_SERVING while the calls in flight end
	})
}

// loadRules reads the rules at path, or the embedded ones.
func loadRules(path string) (*envoyrules.Config, error) {
	if path != "" {
		return envoyrules.Load(path)
	}
	d, err := envoyrules.Parse("rules.yaml", defaultRules)
	if err != nil {
		return nil, err
	}
	return envoyrules.New(d)
}
