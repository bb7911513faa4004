package main

import (
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimit-go/ratelimit/fallback"
)

// metrics are the gateway's Prometheus metrics, on a registry of their own. No label
// carries the tenant: with 100,000 tenants that would be 100,000 series per metric.
type metrics struct {
	registry  *prometheus.Registry
	decisions *prometheus.CounterVec // by route and outcome (allowed, denied, error, in_flight_denied)
	latency   prometheus.Histogram   // time to decide, in seconds
	sources   *prometheus.CounterVec // decisions by store: redis or fallback
	errors    *prometheus.CounterVec // Redis errors, by whether they count against Redis
	breaker   prometheus.Gauge       // 0 closed, 1 open, 2 half-open
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total", Help: "Rate-limit decisions by route and outcome.",
		}, []string{"route", "outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ratelimit_decision_seconds", Help: "Time to decide one request.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 100e-3},
		}),
		sources: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_store_decisions_total", Help: "Decisions by the store that made them.",
		}, []string{"source"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_redis_errors_total", Help: "Redis errors; failure=true ones count towards opening the breaker.",
		}, []string{"failure"}),
		breaker: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_breaker_state", Help: "The breaker around Redis: 0 closed, 1 open, 2 half-open.",
		}),
	}
	m.registry.MustRegister(m.decisions, m.latency, m.sources, m.errors, m.breaker,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// hooks report the fallback store's events into the metrics, and log each switch to and
// from the instances' shares, with the Redis error that caused it.
func (m *metrics) hooks(log *slog.Logger, instances func() int) fallback.Hooks {
	var lastErr atomic.Pointer[error]
	return fallback.Hooks{
		OnDecision: func(src fallback.Source, _ time.Duration) {
			if src == fallback.Primary {
				m.sources.WithLabelValues("redis").Inc()
			} else {
				m.sources.WithLabelValues("fallback").Inc()
			}
		},
		OnPrimaryError: func(err error, failure bool) {
			if failure {
				lastErr.Store(&err)
				m.errors.WithLabelValues("true").Inc()
			} else {
				m.errors.WithLabelValues("false").Inc()
			}
		},
		OnStateChange: func(from, to fallback.BreakerState) {
			m.breaker.Set(float64(to))
			switch {
			case to == fallback.Open && from == fallback.Closed:
				reason := "unknown"
				if err := lastErr.Load(); err != nil {
					reason = (*err).Error()
				}
				log.Warn("Redis is failing; deciding from this instance's share of each rule", "reason", reason, "instances", instances())
			case to == fallback.Closed:
				log.Info("Redis answers again; deciding on Redis")
			}
		},
	}
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
