package backend

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
)

// Metrics are the fallback store's Prometheus metrics: decisions by the store that made
// them, Redis errors, and the breaker's state.
type Metrics struct {
	reg     prometheus.Registerer
	sources *prometheus.CounterVec // decisions by store: redis or fallback
	errors  *prometheus.CounterVec // Redis errors, by whether they count against Redis
	breaker prometheus.Gauge       // 0 closed, 1 open, 2 half-open
}

// NewMetrics makes the store's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reg: reg,
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

// Leases registers the metrics of leases: the decisions made from them, the keys leased,
// and the refills and their round trip.
func (m *Metrics) Leases(p *hotkey.Leases) {
	stat := func(f func(hotkey.LeasesStats) float64) func() float64 { return func() float64 { return f(p.Stats()) } }
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimit_lease_decisions_total",
			Help: "Decisions made from leases held in memory, without a round trip."},
			stat(func(s hotkey.LeasesStats) float64 { return float64(s.Local) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimit_leased_keys", Help: "Keys decided from leases now."},
			stat(func(s hotkey.LeasesStats) float64 { return float64(s.Leases) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimit_lease_refills_total",
			Help: "Refills of leases: one call to Redis for every key refilled at once."},
			stat(func(s hotkey.LeasesStats) float64 { return float64(s.Refills) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimit_lease_refill_seconds",
			Help: "The round trip of a refill, a moving average."},
			stat(func(s hotkey.LeasesStats) float64 { return s.RoundTrip.Seconds() })),
	)
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
