package main

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// limit is the gateway's rate limiting: ratelimit.Middleware, with the tenant
// (X-Api-Key) and the route as the key, each (tenant, route)'s rule chosen per request,
// JSON answers, and metrics. A store error never becomes an error for the client: the
// request passes, and the error is logged and counted.
type limit struct {
	next    http.Handler
	store   ratelimit.Store
	rules   *atomic.Pointer[Rules]
	trusted []netip.Prefix // set: limits per (tenant, route, client IP) past these proxies
	metrics *metrics
	log     *slog.Logger

	once     sync.Once
	handler  http.Handler
	limiters sync.Map // *ratelimit.Algorithm -> *ratelimit.AlgorithmLimiter
}

// namespace keeps the gateway's keys apart from any other limiter on the same Redis.
const namespace = "gateway"

func (m *limit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.once.Do(func() {
		m.handler = (&ratelimit.Middleware{
			Key:        m.key,
			Decide:     m.decide,
			PolicyName: func(r *http.Request) string { return m.route(r) },
			KeyError: func(w http.ResponseWriter, r *http.Request, err error) {
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": err.Error()})
			},
			Denied: func(w http.ResponseWriter, r *http.Request, d ratelimit.Decision) {
				retry, _ := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
				writeJSON(w, http.StatusTooManyRequests, map[string]any{
					"error": "rate limit exceeded", "route": m.route(r), "retry_after_seconds": retry,
				})
			},
			Error: func(w http.ResponseWriter, r *http.Request, err error) bool {
				route := m.route(r)
				m.metrics.decisions.WithLabelValues(route, "error").Inc()
				m.log.Warn("rate limiter failed; letting the request through", "route", route, "err", err)
				return true
			},
		}).Wrap(m.next)
	})
	m.handler.ServeHTTP(w, r)
}

// tenant is the request's X-Api-Key.
func tenant(r *http.Request) (string, error) {
	t := strings.TrimSpace(r.Header.Get("X-Api-Key"))
	if t == "" {
		return "", errors.New("missing X-Api-Key header")
	}
	return t, nil
}

func (m *limit) route(r *http.Request) string {
	return m.rules.Load().route(r.Method, r.URL.Path)
}

// key is TaggedKey(tenant, route): one hash tag per tenant, so a tenant's keys share a
// Redis Cluster node, and no name collides; with trusted proxies, the client IP too.
func (m *limit) key(r *http.Request) (string, error) {
	t, err := tenant(r)
	if err != nil {
		return "", err
	}
	if m.trusted != nil {
		if ip, err := ratelimit.ClientIP(r, m.trusted); err == nil {
			return ratelimit.TaggedKey(t, m.route(r), ip.String()), nil
		}
	}
	return ratelimit.TaggedKey(t, m.route(r)), nil
}

// decide decides under the (tenant, route) rule, with the limiter of its algorithm.
func (m *limit) decide(r *http.Request, key string) (ratelimit.Decision, ratelimit.Rule, error) {
	t, _ := tenant(r) // key has checked it
	route := m.route(r)
	p := m.rules.Load().policy(t, route)
	l, err := m.limiter(p.alg)
	if err != nil {
		return ratelimit.Decision{}, p.rule, err
	}
	start := time.Now()
	d, err := l.AllowRule(r.Context(), key, p.rule, 1)
	m.metrics.latency.Observe(time.Since(start).Seconds())
	if err == nil {
		outcome := "allowed"
		if !d.Allowed {
			outcome = "denied"
		}
		m.metrics.decisions.WithLabelValues(route, outcome).Inc()
	}
	return d, p.rule, err
}

// limiter is the gateway's limiter of alg: one per algorithm, in the gateway's
// namespace, deciding under each request's rule.
func (m *limit) limiter(alg *ratelimit.Algorithm) (*ratelimit.AlgorithmLimiter, error) {
	if l, ok := m.limiters.Load(alg); ok {
		return l.(*ratelimit.AlgorithmLimiter), nil
	}
	l, err := ratelimit.NewAlgorithmLimiter(m.store, alg, ratelimit.PerSecond(1), ratelimit.WithNamespace(namespace))
	if err != nil {
		return nil, err
	}
	got, _ := m.limiters.LoadOrStore(alg, l)
	return got.(*ratelimit.AlgorithmLimiter), nil
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}
