package backend

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-go/ratelimit/fallback"
)

// Metrics are the fallback store's Prometheus metrics: decisions by the store that made
// them, Redis errors, and the breaker's state.
type Metrics struct {
	sources *prometheus.CounterVec // decisions by store: redis or fallback
	errors  *prometheus.CounterVec // Redis errors, by whether they count against Redis
	breaker prometheus.Gauge       // 0 closed, 1 open, 2 half-open
}

// NewMetrics makes the store's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
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
	reg.MustRegister(m.sources, m.errors, m.breaker)
	return m
}

// Hooks report the fallback store's events into the metrics; the store's own logger
// (fallback.WithLogger) says why it switches to and from the shares.
func (m *Metrics) Hooks() fallback.Hooks {
	return fallback.Hooks{
		OnDecision: func(src fallback.Source, _ time.Duration) {
			if src == fallback.Primary {
				m.sources.WithLabelValues("redis").Inc()
			} else {
				m.sources.WithLabelValues("fallback").Inc()
			}
		},
		OnPrimaryError: func(_ error, failure bool) {
			m.errors.WithLabelValues(strconv.FormatBool(failure)).Inc()
		},
		OnStateChange: func(_, to fallback.BreakerState) { m.breaker.Set(float64(to)) },
	}
}
