// Grpcservice is a gRPC service limited per API key: a rate limit (ratelimit.ContextLimiter)
// and an in-flight limit (ratelimit.ContextInFlight), each through interceptors for unary
// and streaming calls alike, answering as gRPC's conventions say.
//
//	go run ./examples/grpcservice
//
// serves grpc.testing.TestService (the service of gRPC's own interop tests, whose
// generated client any Go program has) on :8083, and /metrics on :8084. A call carries
// its key in the x-api-key metadata; a call without one is Unauthenticated, for that is
// no rate limit. Each key may make -rate calls (20 per second, burst 40) and hold
// -inflight calls in progress at once (10): a call over either limit is
// ResourceExhausted, with the time to retry in google.rpc.RetryInfo (the status details)
// and in the grpc-retry-pushback-ms trailer, which a client's retry policy honours. Decisions are made on Redis as in the gateway (-redis, -redis-cluster,
// -instances, -timeout; an embedded miniredis by default), behind the fallback store, and
// counted in ratelimit_decisions_total by policy, outcome and the store that decided.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
	"github.com/ratelimit-go/ratelimit/examples/internal/servers"
	"github.com/ratelimit-go/ratelimit/examples/observe"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

type config struct {
	addr, httpAddr string
	rate           ratelimit.Rule
	inflight       int64
	lease          time.Duration
	store          backend.Config
	release        chan struct{} // for tests: calls with a payload of "hold" wait for it to close,
	entered        chan struct{} // after a send on this one
}

func main() {
	c := config{}
	flag.StringVar(&c.addr, "addr", ":8083", "gRPC address")
	flag.StringVar(&c.httpAddr, "http", ":8084", "HTTP address of /metrics")
	flag.TextVar(&c.rate, "rate", ratelimit.Rule{Limit: 20, Period: time.Second, Burst: 40}, "each API key's rate of calls")
	flag.Int64Var(&c.inflight, "inflight", 10, "each API key's calls in progress at once (0: no limit)")
	flag.DurationVar(&c.lease, "lease", 30*time.Second, "how long a call's lease lives unless extended")
	c.store.Flags(flag.CommandLine)
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, log, nil); err != nil {
		log.Error("service stopped", "err", err)
		os.Exit(1)
	}
}

// apiKey is a call's key, from its x-api-key metadata.
func apiKey(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-api-key"); len(v) == 1 && v[0] != "" {
		return v[0], nil
	}
	return "", errors.New("a call needs one x-api-key")
}

// run serves until ctx ends; ready, when set, gets the addresses it listens on.
func run(ctx context.Context, c config, log *slog.Logger, ready func(grpcAddr, httpAddr string)) error {
	reg := prometheus.NewRegistry()
	c.store.Members = "grpcservice"
	store, closeStore, err := backend.Open(ctx, c.store, backend.NewMetrics(reg), log)
	if err != nil {
		return err
	}
	defer closeStore()
	rate, err := tokenbucket.New(store, c.rate, ratelimit.WithNamespace("grpc-calls"))
	if err != nil {
		return fmt.Errorf("-rate: %w", err)
	}
	record, err := observe.Prometheus(reg)
	if err != nil {
		return err
	}
	limit := &ratelimit.ContextLimiter{Limiter: rate, Key: apiKey, Policy: "calls", OnDecision: record, Logger: log}
	unary := []grpc.UnaryServerInterceptor{limitUnary(limit)}
	stream := []grpc.StreamServerInterceptor{limitStream(limit)}
	if c.inflight > 0 {
		inflight, err := ratelimit.NewInFlight(store, c.inflight, c.lease, ratelimit.WithNamespace("grpc-inflight"))
		if err != nil {
			return fmt.Errorf("-inflight, -lease: %w", err)
		}
		in := &ratelimit.ContextInFlight{InFlight: inflight, Key: apiKey, OnDecision: record, Logger: log}
		unary = append(unary, inFlightUnary(in))
		stream = append(stream, inFlightStream(in))
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
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
	testpb.RegisterTestServiceServer(g, &service{release: c.release, entered: c.entered})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	h := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("grpc service listening", "grpc", lis.Addr().String(), "http", hlis.Addr().String(), "rate", c.rate, "inflight", c.inflight)
	if ready != nil {
		ready(lis.Addr().String(), hlis.Addr().String())
	}
	return servers.GRPCAndHTTP(ctx, g, lis, h, hlis, nil)
}

// service answers the TestService's unary and server-streaming calls; a payload of
// "hold" holds the call (for the tests): it says so on entered, then waits for release to
// close.
type service struct {
	testpb.UnimplementedTestServiceServer
	release, entered chan struct{}
}

func (s *service) hold(ctx context.Context, p *testpb.Payload) error {
	if s.release == nil || p == nil || string(p.Body) != "hold" {
		return nil
	}
	if s.entered != nil {
		s.entered <- struct{}{}
	}
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// maxResponseSize bounds the payload a caller may ask the service to answer with: a
// field that allows 2 GiB, on keys callers invent, would let a few calls take the
// process's memory whatever the limits.
const maxResponseSize = 64 << 10

// responseBody is a payload of size bytes, or an InvalidArgument error past
// maxResponseSize.
func responseBody(size int32) ([]byte, error) {
	if size > maxResponseSize {
		return nil, status.Errorf(codes.InvalidArgument, "a response size of %d bytes: at most %d", size, maxResponseSize)
	}
	return make([]byte, max(0, size)), nil
}

func (s *service) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	body, err := responseBody(req.GetResponseSize())
	if err != nil {
		return nil, err
	}
	if err := s.hold(ctx, req.GetPayload()); err != nil {
		return nil, err
	}
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: body}}, nil
}

func (s *service) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	if err := s.hold(ss.Context(), req.GetPayload()); err != nil {
		return err
	}
	for _, p := range req.GetResponseParameters() {
		body, err := responseBody(p.GetSize())
		if err != nil {
			return err
		}
		if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: body}}); err != nil {
			return err
		}
	}
	return nil
}
