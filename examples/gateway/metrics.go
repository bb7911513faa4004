package main

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
)

// metrics are the gateway's Prometheus metrics, on a registry of their own. No label
// carries the tenant: with 100,000 tenants that would be 100,000 series per metric.
type metrics struct {
	registry  *prometheus.Registry
	decisions *prometheus.CounterVec // by route and outcome (allowed, denied, error, in_flight_denied)
	latency   prometheus.Histogram   // time to decide, in seconds
	store     *backend.Metrics       // the fallback store's
	// denials are the (tenant, route) keys denied most over the last minute, for
	// /denied: what no metric label can say with 100,000 tenants
	denials ratelimit.Denials
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
	}
	m.store = backend.NewMetrics(m.registry)
	m.registry.MustRegister(m.decisions, m.latency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// deniedHandler answers /denied?n=20 (20 when absent, at most 256): the keys denied most
// over the last minute, in JSON, the most denied first; each count may be over by its
// error.
func (m *metrics) deniedHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n <= 0 {
			n = 20
		}
		type denied struct {
			Key   string `json:"key"`
			Count int64  `json:"count"`
			Error int64  `json:"error"`
		}
		top := []denied{}
		for _, d := range m.denials.Top(min(n, 256)) {
			top = append(top, denied(d))
		}
		writeJSON(w, http.StatusOK, map[string]any{"window_seconds": 60, "denied": top})
	})
}
