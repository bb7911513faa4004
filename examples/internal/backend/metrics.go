package backend

import (
	"log/slog"
	"sync/atomic"
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

// Hooks report the fallback store's events into the metrics, and log each switch to and
// from the instances' shares, with the Redis error that caused it.
func (m *Metrics) Hooks(log *slog.Logger, instances func() int) fallback.Hooks {
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
