package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
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
	// envoy, when set, decides instead of the rules' own limits (-envoy-rules)
	envoy *envoyRules
	// inflight holds the leases of the routes with an in_flight limit (with
	// defaultLease when nil)
	inflight *ratelimit.InFlightLimiter
	// reserves are every limit's, by priority (-reserves); nil: no shedding
	reserves []int64

	once     sync.Once
	handler  http.Handler
	limiters sync.Map // *ratelimit.Algorithm -> *ratelimit.AlgorithmLimiter
	quotas   sync.Map // quotaNamespace + a quota's text -> *fixedwindow.QuotaLimiter
}

// namespace keeps the gateway's keys apart from any other limiter on the same Redis.
const namespace = "gateway"

// newInFlight is the gateway's in-flight limiter on store: each request's limit is its
// rule's in_flight, per (tenant, route) key, in the gateway's namespace, with reserves.
func newInFlight(store ratelimit.Store, lease time.Duration, reserves []int64) (*ratelimit.InFlightLimiter, error) {
	return ratelimit.NewInFlight(store, 1, lease, ratelimit.WithNamespace(namespace), ratelimit.WithReserves(reserves...))
}

// parseReserves reads -reserves: percentages, comma-separated, for critical, normal and
// sheddable requests; empty for none.
func parseReserves(s string) ([]int64, error) {
	if s == "" {
		return nil, nil
	}
	var out []int64
	for _, f := range strings.Split(s, ",") {
		p, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: not a percentage", f)
		}
		out = append(out, p)
	}
	// the same check every limiter makes
	if _, err := ratelimit.NewInFlight(localstore.New(), 1, time.Second, ratelimit.WithReserves(out...)); err != nil {
		return nil, err
	}
	return out, nil
}

// priority is a request's class: its route's (see routeSpec.Priority), or a lower one
// its X-Priority header asks for ("normal", "sheddable"): a caller may offer to be shed
// first (a batch job, a prefetch), never claim more than its route gives. Any other
// value is the route's.
func (m *limit) priority(r *http.Request) ratelimit.Priority {
	p := m.rules.Load().match(r.Method, r.URL.Path).priority
	if asked, ok := parsePriority(r.Header.Get("X-Priority")); ok && asked > p {
		return asked
	}
	return p
}

// defaultLease is how long a request's in-flight lease lives unless extended (the
// middleware extends it every half of that while the request runs): the leases of a
// gateway that dies come back after it.
const defaultLease = 30 * time.Second

func (m *limit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := canonicalPath(r); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	if strings.ToUpper(r.Method) != r.Method {
		// Methods are case-sensitive (RFC 9110, 9.1), and the routes name upper-case ones:
		// "post" would skip the POST routes' rules, and an upstream that folds case would
		// take it for a POST. Refused, as a method the gateway does not implement.
		writeJSON(w, http.StatusNotImplemented, map[string]string{
			"error": "method " + strconv.Quote(r.Method) + " is not implemented; method names are case-sensitive"})
		return
	}
	m.once.Do(func() {
		if m.inflight == nil {
			m.inflight, _ = newInFlight(m.store, defaultLease, m.reserves) // valid: checked by parseReserves
		}
		m.handler = (&ratelimit.Middleware{
			InFlight: m.inflight,
			InFlightLimit: func(r *http.Request) int64 {
				return m.ruleOf(r).inFlight
			},
			InFlightDenied: func(w http.ResponseWriter, r *http.Request, d ratelimit.Decision) {
				route := m.route(r)
				m.metrics.decisions.WithLabelValues(route, "in_flight_denied").Inc()
				writeJSON(w, http.StatusTooManyRequests, map[string]any{
					"error": "too many requests in progress", "route": route, "in_flight_limit": d.Limit,
					"retry_after_seconds": 1,
				})
			},
			Key:        m.key,
			Policies:   m.policies(),
			Decide:     m.decideEnvoy(),
			OnDecision: m.record,
			Priority:   m.priority,
			KeyError: func(w http.ResponseWriter, r *http.Request, err error) {
				status := http.StatusBadRequest
				switch {
				case errors.Is(err, errNoKey):
					status = http.StatusUnauthorized
				case errors.Is(err, errKeyTooLong):
					status = http.StatusRequestHeaderFieldsTooLarge
				}
				writeJSON(w, status, map[string]string{"error": err.Error()})
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
	route := m.route(r)
	t, _ := tenant(r) // the key checks it
	f := &found{route: route, rule: m.rules.Load().policy(t, route)}
	m.handler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), foundKey{}, f)))
}

// found is a request's route and the rule of its (tenant, route), found once, before the
// Middleware: its policies, its in-flight limit and the decision hook read them from the
// request's context, and decide under one rule however the rules are reloaded meanwhile.
type found struct {
	route string
	rule  policy
}

type foundKey struct{}

// foundOf is what ServeHTTP found of the request in ctx; nil before it.
func foundOf(ctx context.Context) *found {
	f, _ := ctx.Value(foundKey{}).(*found)
	return f
}

// canonicalPath makes r's path the one the upstream will see and the routes match: its
// dot segments and repeated slashes resolved (path.Clean, a trailing slash kept), and
// sent on in that form. What could reach the upstream as another path than the one the
// limit counted is refused: an encoded slash or backslash ("/search%2F..%2Forders" is
// one segment here, "/orders" to an upstream that decodes it), a backslash, a path
// parameter (";": "/orders;x" is "/orders" to many servers), a control character, or a
// path that does not start with "/". Routes match without regard to case (see
// Rules.route), as an upstream that folds case would serve them.
func canonicalPath(r *http.Request) error {
	escaped := strings.ToLower(r.URL.EscapedPath())
	p := r.URL.Path
	switch {
	case strings.Contains(escaped, "%2f") || strings.Contains(escaped, "%5c"):
		return errors.New("the path holds an encoded slash or backslash")
	case strings.ContainsAny(p, `;\`):
		return errors.New("the path holds a path parameter (;) or a backslash")
	case strings.ContainsFunc(p, unicode.IsControl):
		return errors.New("the path holds a control character")
	case !strings.HasPrefix(p, "/"):
		return errors.New("the path does not start with /")
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	r.URL.Path, r.URL.RawPath = clean, ""
	return nil
}

// maxTenantLength bounds an X-Api-Key, in bytes: a key of a megabyte would cost Redis
// milliseconds a decision and the gateway a megabyte of memory per key.
const maxTenantLength = 128

var (
	errNoKey      = errors.New("missing X-Api-Key header")
	errKeyTooLong = fmt.Errorf("the X-Api-Key header is longer than %d bytes", maxTenantLength)
	errKeyChars   = errors.New("the X-Api-Key header may hold only ASCII letters, digits and - . _ ~ + / =")
)

// tenant is the request's X-Api-Key: exactly one header, without the spaces and tabs
// around it (HTTP's optional white space, not part of a value), of 1 to maxTenantLength
// bytes, each an ASCII letter, a digit or one of "-._~+/=" (what API keys, base64
// included, are made of). Anything else is refused, not made canonical: bytes that are
// not UTF-8 (0x85, 0xFF), Unicode spaces and format characters (U+0085, a zero-width
// space), or a value folded over several lines would each count as a tenant of their
// own, and an upstream might read them as another. The value is written back without
// its white space, so that the upstream sees the identity the limit counted.
func tenant(r *http.Request) (string, error) {
	values := r.Header.Values("X-Api-Key")
	if len(values) > 1 {
		return "", errors.New("more than one X-Api-Key header")
	}
	t := ""
	if len(values) == 1 {
		t = strings.Trim(values[0], " \t")
	}
	switch {
	case t == "":
		return "", errNoKey
	case len(t) > maxTenantLength:
		return "", errKeyTooLong
	case strings.ContainsFunc(t, func(c rune) bool { return !tenantChar(c) }):
		return "", errKeyChars
	}
	r.Header.Set("X-Api-Key", t)
	return t, nil
}

// tenantChar reports whether c may stand in a tenant id (see tenant).
func tenantChar(c rune) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.ContainsRune("-._~+/=", c)
}

func (m *limit) route(r *http.Request) string {
	if f := foundOf(r.Context()); f != nil {
		return f.route
	}
	return m.rules.Load().route(r.Method, r.URL.Path)
}

// ruleOf is the rule of r's (tenant, route).
func (m *limit) ruleOf(r *http.Request) policy {
	if f := foundOf(r.Context()); f != nil {
		return f.rule
	}
	t, _ := tenant(r) // the key has checked it
	return m.rules.Load().policy(t, m.route(r))
}

// key is redisstore.TaggedKey(tenant, route): one hash tag per tenant, so a tenant's keys
// share a Redis Cluster node, and no name collides; with trusted proxies, the client IP
// too.
func (m *limit) key(r *http.Request) (string, error) {
	t, err := tenant(r)
	if err != nil {
		return "", err
	}
	if m.trusted != nil {
		if ip, err := ratelimit.ClientIP(r, m.trusted); err == nil {
			return redisstore.TaggedKey(t, m.route(r), ip.String()), nil
		}
	}
	return redisstore.TaggedKey(t, m.route(r)), nil
}

// policies are the gateway's limits (unless -envoy-rules decides): the (tenant, route)'s
// rule, with the limiter of its algorithm, named after the route in the headers; and the
// tenant's quota, on the tenant's own key, where its rule has one. The Middleware
// decides them all or none, at the request's priority.
func (m *limit) policies() []ratelimit.Policy {
	if m.envoy != nil {
		return nil
	}
	return []ratelimit.Policy{
		{Name: "rate", For: func(r *http.Request) (ratelimit.PolicyLimit, error) {
			p := m.ruleOf(r)
			l, err := m.limiter(p.alg)
			return ratelimit.PolicyLimit{Name: m.route(r), Limiter: l, Rule: p.rule}, err
		}},
		{Name: "quota", Match: func(r *http.Request) bool { return m.ruleOf(r).quota != nil }, For: func(r *http.Request) (ratelimit.PolicyLimit, error) {
			t, _ := tenant(r)
			q := m.ruleOf(r).quota
			l, err := m.quotaLimiter(q.Quota)
			// the tenant's key, on the same hash tag as its routes' keys: one script on a cluster
			return ratelimit.PolicyLimit{Key: redisstore.TaggedKey(t), Limiter: l}, err
		}},
	}
}

// decideEnvoy decides under the Envoy rules, with -envoy-rules; nil otherwise.
func (m *limit) decideEnvoy() func(r *http.Request, key string) (ratelimit.Decision, ratelimit.Rule, error) {
	if m.envoy == nil {
		return nil
	}
	return func(r *http.Request, key string) (ratelimit.Decision, ratelimit.Rule, error) {
		t, _ := tenant(r) // the key has checked it
		return m.envoy.decide(r, t, m.route(r))
	}
}

// record counts a rate decision by route and outcome, its latency, and a denial's key
// for /denied; the in-flight limit's and the failures are counted where they are
// answered.
func (m *limit) record(ctx context.Context, e ratelimit.Event) {
	if e.InFlight || e.Err != nil {
		return
	}
	var route string
	if f := foundOf(ctx); f != nil {
		route = f.route
	}
	m.metrics.latency.Observe(e.Latency.Seconds())
	outcome := "allowed"
	if !e.Decision.Allowed {
		outcome = "denied"
		m.metrics.denials.Record(e.Key, 1)
	}
	m.metrics.decisions.WithLabelValues(route, outcome).Inc()
}

// quotaLimiter is the gateway's limiter of q: one per quota, in a namespace of its
// text, apart from the rates'.
func (m *limit) quotaLimiter(q fixedwindow.Quota) (*fixedwindow.QuotaLimiter, error) {
	name := quotaNamespace + q.String()
	if l, ok := m.quotas.Load(name); ok {
		return l.(*fixedwindow.QuotaLimiter), nil
	}
	l, err := fixedwindow.NewQuota(m.store, q, ratelimit.WithNamespace(name), ratelimit.WithReserves(m.reserves...))
	if err != nil {
		return nil, err
	}
	got, _ := m.quotas.LoadOrStore(name, l)
	return got.(*fixedwindow.QuotaLimiter), nil
}

// limiter is the gateway's limiter of alg: one per algorithm, in the gateway's
// namespace, deciding under each request's rule.
func (m *limit) limiter(alg *ratelimit.Algorithm) (*ratelimit.AlgorithmLimiter, error) {
	if l, ok := m.limiters.Load(alg); ok {
		return l.(*ratelimit.AlgorithmLimiter), nil
	}
	l, err := ratelimit.NewAlgorithmLimiter(m.store, alg, ratelimit.PerSecond(1), ratelimit.WithNamespace(namespace),
		ratelimit.WithReserves(m.reserves...))
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
