// Package observe turns the library's decision events (ratelimit.Event, from
// Middleware.OnDecision, ContextLimiter and ContextInFlight) into metrics: Prometheus and
// OpenTelemetry, so that a service imports them and writes one line:
//
//	mw.OnDecision, err = observe.Prometheus(prometheus.DefaultRegisterer)
//
// It is a module of its own, so that the library's go.mod holds neither Prometheus nor
// OpenTelemetry.
//
// Both count decisions by policy, outcome (allowed, denied, shadowed denied, error) and
// the store that made them (primary, secondary, or local when the store is not a fallback
// store), and record each decision's latency.
package observe

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ratelimit-go/ratelimit"
)

// Outcome is an event's outcome as the metrics label it.
func Outcome(e ratelimit.Event) string {
	switch {
	case e.Err != nil:
		return "error"
	case e.Decision.Allowed:
		return "allowed"
	case e.Shadowed:
		return "shadow_denied"
	default:
		return "denied"
	}
}

// Source is an event's store as the metrics label it.
func Source(e ratelimit.Event) string {
	if e.Source == "" {
		return "local"
	}
	return e.Source
}

// Prometheus registers ratelimit_decisions_total and ratelimit_decision_duration_seconds
// with reg and returns the hook that fills them.
func Prometheus(reg prometheus.Registerer) (func(context.Context, ratelimit.Event), error) {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_decisions_total",
		Help: "Rate-limit decisions by policy, outcome (allowed, denied, shadow_denied, error) and the store that decided.",
	}, []string{"policy", "outcome", "source"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ratelimit_decision_duration_seconds",
		Help:    "The time a rate-limit decision took.",
		Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 100e-3},
	}, []string{"policy"})
	for _, c := range []prometheus.Collector{decisions, latency} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return func(_ context.Context, e ratelimit.Event) {
		decisions.WithLabelValues(e.Policy, Outcome(e), Source(e)).Inc()
		latency.WithLabelValues(e.Policy).Observe(e.Latency.Seconds())
	}, nil
}

// OpenTelemetry makes the counter ratelimit.decisions and the histogram
// ratelimit.decision.duration (seconds) on meter and returns the hook that records them.
func OpenTelemetry(meter metric.Meter) (func(context.Context, ratelimit.Event), error) {
	decisions, err := meter.Int64Counter("ratelimit.decisions",
		metric.WithDescription("Rate-limit decisions by policy, outcome and the store that decided."))
	if err != nil {
		return nil, err
	}
	latency, err := meter.Float64Histogram("ratelimit.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("The time a rate-limit decision took."),
		metric.WithExplicitBucketBoundaries(50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 100e-3))
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, e ratelimit.Event) {
		policy := attribute.String("policy", e.Policy)
		decisions.Add(ctx, 1, metric.WithAttributes(policy, attribute.String("outcome", Outcome(e)),
			attribute.String("source", Source(e))))
		latency.Record(ctx, e.Latency.Seconds(), metric.WithAttributes(policy))
	}, nil
}
