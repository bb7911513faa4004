package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// limit is the rate-limiting middleware: it identifies the tenant (X-Api-Key) and the
// route, decides on the store under the (tenant, route) rule, sets the rate-limit
// headers, and answers 429 or passes the request on. A store error never becomes an
// error for the client: the request passes, and the error is logged and counted.
type limit struct {
	next    http.Handler
	store   ratelimit.Store
	rules   *atomic.Pointer[Rules]
	perIP   func(*http.Request) (netip.Addr, bool) // nil: limits per (tenant, route) only
	metrics *metrics
	log     *slog.Logger
}

func (m *limit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get("X-Api-Key")
	if tenant == "" {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing X-Api-Key header"})
		return
	}
	rules := m.rules.Load()
	route := rules.route(r.Method, r.URL.Path)
	p := rules.policy(tenant, route)
	key := ratelimit.TaggedKey(tenant, route) // one hash tag per tenant; no name collides
	if m.perIP != nil {
		if ip, ok := m.perIP(r); ok {
			key = ratelimit.TaggedKey(tenant, route, ip.String())
		}
	}

	start := time.Now()
	d, err := m.store.Apply(r.Context(), ratelimit.Request{Algorithm: p.alg, Key: key, Rule: p.rule, N: 1})
	m.metrics.latency.Observe(time.Since(start).Seconds())
	switch {
	case err != nil && r.Context().Err() != nil:
		return // the client is gone
	case err != nil:
		m.metrics.decisions.WithLabelValues(route, "error").Inc()
		m.log.Warn("rate limiter failed; letting the request through", "tenant", tenant, "route", route, "err", err)
		m.next.ServeHTTP(w, r)
		return
	}
	setHeaders(w.Header(), route, p, d)
	if !d.Allowed {
		m.metrics.decisions.WithLabelValues(route, "denied").Inc()
		retry := seconds(d.RetryAfter)
		w.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
		writeJSON(w, http.StatusTooManyRequests, map[string]any{
			"error": "rate limit exceeded", "route": route, "retry_after_seconds": retry,
		})
		return
	}
	m.metrics.decisions.WithLabelValues(route, "allowed").Inc()
	if d.Delay > 0 && !sleep(r.Context(), d.Delay) { // a leaky bucket paces what it admits
		return
	}
	m.next.ServeHTTP(w, r)
}

// setHeaders sets the de facto X-RateLimit-* headers and the IETF draft's RateLimit-Policy
// and RateLimit (draft-ietf-httpapi-ratelimit-headers-10): the policy named by the route,
// its quota and the seconds it takes to refill, the requests left and the seconds to reset.
func setHeaders(h http.Header, route string, p policy, d ratelimit.Decision) {
	reset := seconds(d.ResetAfter)
	if d.ResetAfter == 0 {
		reset = 0
	}
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	name := strconv.Quote(route)
	h.Set("RateLimit-Policy", name+";q="+strconv.FormatInt(p.capacity, 10)+";w="+strconv.FormatInt(p.window, 10))
	h.Set("RateLimit", name+";r="+strconv.FormatInt(d.Remaining, 10)+";t="+strconv.FormatInt(reset, 10))
}

// seconds is d in whole seconds, rounded up, at least 1: a client that waits this long is
// never early.
func seconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}
