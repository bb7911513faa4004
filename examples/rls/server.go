package main

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/internal/envoyrules"
)

// server is envoy.service.ratelimit.v3.RateLimitService on a store, under the rules in
// force.
type server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	rules   atomic.Pointer[envoyrules.Config]
	decider envoyrules.Decider
	metrics *metrics
	headers bool // add the RateLimit-Limit, -Remaining and -Reset headers, as the service can
	log     *slog.Logger
}

func newServer(store ratelimit.Store, rules *envoyrules.Config, m *metrics, headers bool, log *slog.Logger) *server {
	s := &server{decider: envoyrules.Decider{Store: store}, metrics: m, headers: headers, log: log}
	s.rules.Store(rules)
	return s
}

// ShouldRateLimit decides a request's descriptors under the rules of its domain, all or
// none (see envoyrules.Decider.Decide), and answers as the service does: OVER_LIMIT
// when any descriptor is over its limit, each descriptor's status, and the rate limit
// headers of the tightest. A domain without rules is OK. A store that fails (after the
// fallback store's own shares) is UNAVAILABLE, and Envoy's failure_mode_deny decides.
func (s *server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.shouldRateLimit(ctx, req)
	s.metrics.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		s.metrics.errors.Inc()
	}
	return resp, err
}

func (s *server) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if len(req.Descriptors) > maxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors in one request; at most %d", len(req.Descriptors), maxDescriptors)
	}
	descriptors := make([][]envoyrules.Entry, len(req.Descriptors))
	for i, d := range req.Descriptors {
		if err := supported(d); err != nil {
			return nil, status.Errorf(codes.Unimplemented, "descriptor %d: %v", i, err)
		}
		if len(d.GetEntries()) > maxEntries {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries; at most %d", i, len(d.GetEntries()), maxEntries)
		}
		for _, e := range d.GetEntries() {
			descriptors[i] = append(descriptors[i], envoyrules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descriptors))}
	domain := s.rules.Load().Domain(req.Domain)
	if domain == nil { // no rules for it: nothing is limited, as in the service
		for i := range resp.Statuses {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		}
		return resp, nil
	}
	res, err := s.decider.Decide(ctx, domain, descriptors, req.GetHitsAddend())
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		s.log.Warn("the store failed; answering UNAVAILABLE", "domain", req.Domain, "err", err)
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if res.OverLimit {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for i, st := range res.Statuses {
		resp.Statuses[i] = descriptorStatus(st)
		if st.Match != nil {
			s.metrics.count(req.Domain, st.Match.MetricKey, st.Hits)
		}
	}
	if t, ok := res.Tightest(); ok && s.headers {
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(t.Match.RequestsPerUnit), 10)},
			{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(t.Remaining), 10)},
			{Key: "RateLimit-Reset", Value: strconv.FormatInt(ceilSeconds(t.ResetAfter), 10)},
		}
	}
	return resp, nil
}

// supported refuses what this server does not do, rather than deciding without it.
func supported(d *ratelimitv3.RateLimitDescriptor) error {
	switch {
	case d.GetLimit() != nil:
		return errors.New("a limit override in the request is not supported; put the limit in the rules")
	case d.GetHitsAddend() != nil:
		return errors.New("a hits_addend per descriptor is not supported; use the request's")
	case d.GetIsNegativeHits():
		return errors.New("negative hits are not supported")
	}
	return nil // a descriptor without entries matches no rule, and is OK, as in the service
}

// maxDescriptors and maxEntries bound what one request may ask for: each limited
// descriptor is a key in one script that Redis runs alone (see redisstore.MaxApplyAll),
// and Envoy's route configurations send a handful.
const (
	maxDescriptors = 64
	maxEntries     = 32
)

// descriptorStatus is a descriptor's status as the service reports it.
func descriptorStatus(st envoyrules.Status) *rlsv3.RateLimitResponse_DescriptorStatus {
	switch {
	case st.Unlimited:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
	case st.Match == nil:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	out := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code: rlsv3.RateLimitResponse_OK,
		CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: st.Match.Name, RequestsPerUnit: st.Match.RequestsPerUnit,
			Unit: rlsv3.RateLimitResponse_RateLimit_Unit(rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(st.Match.Unit)])},
		LimitRemaining:     st.Remaining,
		DurationUntilReset: durationpb.New(st.ResetAfter),
	}
	if st.OverLimit {
		out.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return out
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// metrics are the service's: per rule (its metric key, as the service names it), the
// hits, and those within the limit, near it, over it, and over it in shadow mode; and the
// calls' latency and errors.
type metrics struct {
	registry                          *prometheus.Registry
	total, within, near, over, shadow *prometheus.CounterVec
	latency                           prometheus.Histogram
	errors                            prometheus.Counter
}

func newMetrics() *metrics {
	perRule := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + name, Help: help},
			[]string{"domain", "key"})
	}
	m := &metrics{
		registry: prometheus.NewRegistry(),
		total:    perRule("total_hits", "Hits of a rule."),
		within:   perRule("within_limit", "Hits within a rule's limit."),
		near:     perRule("near_limit", "Hits past the near-limit ratio of a rule's limit."),
		over:     perRule("over_limit", "Hits over a rule's limit."),
		shadow:   perRule("shadow_mode", "Hits over a rule's limit in shadow mode, answered OK."),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ratelimit_service_should_rate_limit_seconds", Help: "Time to answer one ShouldRateLimit.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 100e-3},
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_service_should_rate_limit_errors_total", Help: "ShouldRateLimit calls answered with an error.",
		}),
	}
	m.registry.MustRegister(m.total, m.within, m.near, m.over, m.shadow, m.latency, m.errors)
	return m
}

func (m *metrics) count(domain, key string, h envoyrules.Hits) {
	for _, c := range []struct {
		vec *prometheus.CounterVec
		n   uint64
	}{{m.total, h.Total}, {m.within, h.Within}, {m.near, h.Near}, {m.over, h.Over}, {m.shadow, h.Shadow}} {
		if c.n > 0 {
			c.vec.WithLabelValues(domain, key).Add(float64(c.n))
		}
	}
}
