package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/trace"
)

// Middleware limits the requests that reach an http.Handler: it finds each request's
// key, asks the limiter, sets the rate-limit headers, and answers a denied request with
// 429 Too Many Requests and Retry-After, or passes the request on.
//
//	limiter, _ := tokenbucket.New(store, ratelimit.PerSecond(10), ratelimit.WithNamespace("per-ip"))
//	mw := &ratelimit.Middleware{
//		Limiter: limiter,
//		Key: func(r *http.Request) (string, error) {
//			ip, err := ratelimit.ClientIP(r, nil) // no proxy in front
//			return ip.String(), err
//		},
//	}
//	http.ListenAndServe(":8080", mw.Wrap(mux))
//
// Every response it decides carries X-RateLimit-Limit (Decision.Limit),
// X-RateLimit-Remaining, X-RateLimit-Reset (seconds until the key is full again), and
// the IETF draft's RateLimit-Policy (its quota and the seconds a full quota takes to
// come back) and RateLimit (remaining and reset). A denied one also carries Retry-After,
// in whole seconds rounded up, so a client that waits that long is not early. A request
// admitted by a shaping algorithm (the leaky bucket) is held for its Decision.Delay
// before it is passed on. With InFlight, it also bounds the requests of a key in progress
// at once, each holding a lease until its handler returns.
//
// Exempt requests skip it whole; Shadow decides and counts without denying anyone;
// OnDecision sees every decision, and Logger what a fail-open swallows.
//
// Fields left nil have the defaults written beside them. A Middleware must not be changed
// once Wrap has been called; it is safe for concurrent use.
type Middleware struct {
	// Limiter decides each request, with n = 1. Required unless Decide, Policies or
	// InFlight is set.
	Limiter Limiter

	// Key is the limiter key of a request: a client IP (see ClientIP), an API key, a
	// tenant and a route joined with Key or redisstore.TaggedKey. Required. When it
	// returns an error, the request gets KeyError's answer and the limiter is not asked.
	// A key longer than MaxKeyLength, or that holds control characters (a header folded
	// over several lines does), gets KeyError's answer too, so that no client makes
	// itself a fresh key per request by padding one.
	Key func(r *http.Request) (string, error)

	// Decide, when set, decides a request instead of Limiter: for a rule chosen per
	// request (AlgorithmLimiter.AllowRule, a tenant's plan). It returns the rule the
	// decision was made under, for the RateLimit-Policy header (a zero Rule leaves that
	// header out). For several limits decided together use Policies, whose headers name
	// each limit: the Decision of several limits has no one rule.
	Decide func(r *http.Request, key string) (Decision, Rule, error)

	// Policies, when set, decides each request under several limits at once, all or none
	// (as AllowAll: a request one limit denies consumes nothing from the others), each a
	// named limiter of an algorithm package on one store, applied to the requests it
	// matches, all with the request's key. RateLimit-Policy lists every policy that took
	// part, and RateLimit names the one that bounds the client now: the denying one with
	// the longest RetryAfter, or else the one with the least remaining. X-RateLimit-* are
	// the combined Decision's (AllowAll). A request no policy matches is not limited.
	// Wrap panics on a policy without a limiter of an algorithm package, with a name that
	// is not a valid header string (see PolicyName) or the name of another, or on
	// limiters of different stores.
	Policies []Policy

	// DecidePolicies, when set, decides a request under several limits chosen per request
	// (a tenant's monthly quota beside its route's rate, from a rule table), all or none
	// (ApplyAll), and returns each limit's part, in order, for the headers: as with
	// Policies, RateLimit-Policy lists them and RateLimit names the binding one, and
	// X-RateLimit-* are the parts' Decisions combined as AllowAll combines them. An error
	// goes to Error, as Decide's does.
	DecidePolicies func(r *http.Request, key string) ([]PolicyDecision, error)

	// MaxKeyLength bounds the length of a key in bytes: 256 when 0.
	MaxKeyLength int

	// PolicyName names a request's policy in the RateLimit and RateLimit-Policy headers
	// (a route's name, say): "default" when nil. The headers carry it as a string of
	// RFC 8941 structured fields: printable ASCII, with '"' and '\\' escaped; a name
	// with any other character (a control character, a letter outside ASCII) leaves those
	// two headers out of the response, as no strict client could read them.
	PolicyName func(r *http.Request) string

	// Denied answers a denied request, after the headers are set: by default 429 Too
	// Many Requests with a one-line text body.
	Denied func(w http.ResponseWriter, r *http.Request, d Decision)

	// KeyError answers a request whose key could not be found or is refused: by default
	// 400 Bad Request with the error's text.
	KeyError func(w http.ResponseWriter, r *http.Request, err error)

	// Error is called when the limiter fails (its store is down, say), and says whether
	// the request goes on (fail open) or not, in which case Error has answered it. When
	// nil, every request goes on: rate limiting never takes a service down. A request
	// whose client has gone away is dropped without calling it.
	Error func(w http.ResponseWriter, r *http.Request, err error) (pass bool)

	// InFlight, when set, also bounds the requests of a key in progress at once: a
	// request the rate limit admits (every request, without Limiter and Decide) holds one
	// of its key's leases while the handler serves it, extended every half lease duration
	// while it runs and released when it returns, even if it panics. A request that finds
	// every lease held gets InFlightDenied's answer; a failure of InFlight's store goes to
	// Error, as the rate limit's does. The rate limit has counted a request that is then
	// denied for being one too many in progress.
	InFlight *InFlightLimiter

	// InFlightLimit, when set, is the in-flight limit of a request (a route's, say)
	// instead of InFlight's own; 0 or less means none for this request.
	InFlightLimit func(r *http.Request) int64

	// Priority, when set, is a request's priority (its route's class, a header of a
	// trusted caller): every limit decides it at that priority (WithPriority), so that the
	// limiters with reserves (WithReserves) shed the least important requests first, and
	// the request's context carries it on to the handler. Without it, requests have the
	// priority their context has (Critical when none): none is shed for another.
	Priority func(r *http.Request) Priority

	// Exempt, when set, says which requests skip the limits entirely (health checks, an
	// allow-list of internal callers): no key is read, no limiter asked, no header set,
	// no hook called.
	Exempt func(r *http.Request) bool

	// Shadow decides and counts every request as without it, but denies none: a request
	// the limits would deny goes on, without the rate-limit headers (their absence says
	// that nothing was enforced), and OnDecision sees it. For trying limits on live
	// traffic (envoyproxy/ratelimit's shadow_mode). A Policy's Shadow shadows that policy
	// alone.
	Shadow bool

	// OnDecision, when set, sees every decision the Middleware makes, after it is made and
	// before the request goes on or is answered: for metrics and logs. It runs on the
	// request's goroutine and must be fast.
	OnDecision func(ctx context.Context, e Event)

	// Logger, when set, receives at Warn level what the Middleware would otherwise
	// swallow: a limiter's error after which the request went on (fail open), a lease
	// that could not be released or extended.
	Logger *slog.Logger

	// InFlightDenied answers a request that found every lease of its key held, after
	// Retry-After is set to 1 second (a lease may come back at any moment) and the rate
	// limit's headers are taken off (their quota left would contradict the 429): by
	// default 429 Too Many Requests with a one-line text body. Set it to answer 503
	// instead, say.
	InFlightDenied func(w http.ResponseWriter, r *http.Request, d Decision)
}

// PolicyDecision is one limit's part in a decision of Middleware.DecidePolicies.
type PolicyDecision struct {
	Name     string // names the limit in RateLimit and RateLimit-Policy (see Middleware.PolicyName)
	Rule     Rule   // its q and w in RateLimit-Policy; a zero Rule leaves the limit out of that header
	Decision Decision
}

// Policy is one of a Middleware's Policies: a limit with a name for the headers.
type Policy struct {
	// Name names the policy in RateLimit and RateLimit-Policy (see
	// Middleware.PolicyName for the characters it may hold). Required.
	Name string
	// Limiter is a limiter of an algorithm package (AlgorithmLimiter); every policy's
	// limiter is on the same store. Required.
	Limiter Limiter
	// Match says whether the policy applies to r (an export route's limit, say); nil
	// applies it to every request.
	Match func(r *http.Request) bool
	// Shadow decides and counts the policy without enforcing it (see
	// Middleware.Shadow): it is decided alone, after the policies it does not shadow
	// have admitted the request, and is left out of the headers.
	Shadow bool
}

// Event is one decision of a Middleware, as OnDecision sees it.
type Event struct {
	// Key is the request's limiter key.
	Key string
	// Policy names the limit: the binding policy of a rate decision (see Policies), the
	// shadowed policy of a shadow decision, PolicyName's of the Limiter's or Decide's.
	Policy string
	// Decision is the decision (the combined one under several policies); zero when Err
	// is set. When Shadowed and not Allowed, the request went on anyway.
	Decision Decision
	// InFlight says that the decision is the in-flight limit's: a lease acquired, or
	// refused.
	InFlight bool
	// Shadowed says that the decision was not enforced (Shadow, Policy.Shadow).
	Shadowed bool
	// Priority is the priority the request was decided at (see Middleware.Priority).
	Priority Priority
	// Source is the store that decided when the limiter's store is a fallback.Store:
	// "primary" (Redis) or "secondary" (this instance's share); "" for any other store.
	Source string
	// Latency is how long the decision took.
	Latency time.Duration
	// Err is the limiter's error; the request then went on or not as Error says.
	Err error
}

// leaseTimeout bounds Middleware's releases and extensions, which outlive the request's
// context: a store that does not answer loses only the lease, which expires by itself.
const leaseTimeout = time.Second

const defaultMaxKeyLength = 256

// Wrap returns next behind the limit. It panics if the Middleware has no Key, or neither
// a Limiter nor Decide, as net/http's constructors do for a nil handler: a misconfigured
// server should not start.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	switch {
	case m == nil:
		panic("ratelimit: Wrap on a nil Middleware")
	case next == nil:
		panic("ratelimit: Middleware.Wrap of a nil handler")
	case m.Key == nil:
		panic("ratelimit: Middleware without a Key function")
	case m.Limiter == nil && m.Decide == nil && m.DecidePolicies == nil && m.Policies == nil && m.InFlight == nil:
		panic("ratelimit: Middleware without a Limiter, a Decide or DecidePolicies function, Policies or an InFlight limiter")
	}
	if err := checkPolicies(m.Policies); err != nil {
		panic(err.Error())
	}
	cfg := *m // later changes to m do not race with requests
	if cfg.MaxKeyLength <= 0 {
		cfg.MaxKeyLength = defaultMaxKeyLength
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { cfg.serve(w, r, next) })
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.Exempt != nil && m.Exempt(r) {
		next.ServeHTTP(w, r)
		return
	}
	key, err := m.Key(r)
	if err == nil {
		err = checkKey(key, m.MaxKeyLength)
	}
	if err != nil {
		if m.KeyError != nil {
			m.KeyError(w, r, err)
		} else {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
		return
	}
	if m.Priority != nil {
		r = r.WithContext(WithPriority(r.Context(), m.Priority(r)))
	}
	if m.Limiter == nil && m.Decide == nil && m.DecidePolicies == nil && m.Policies == nil {
		m.serveInFlight(w, r, key, next)
		return
	}
	var one [1]policy // the usual decision, under one policy, without an allocation
	ps, d, err := m.decideReported(r, key, one[:0])
	if err != nil {
		if m.passes(w, r, err) {
			m.serveInFlight(w, r, key, next)
		}
		return
	}
	if len(ps) == 0 { // no policy applies
		m.serveInFlight(w, r, key, next)
		return
	}
	if m.Shadow { // decided and counted, never enforced: no headers, and on it goes
		m.serveInFlight(w, r, key, next)
		return
	}
	setHeaders(w.Header(), ps, d)
	if !d.Allowed {
		w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(d.RetryAfter), 10))
		if m.Denied != nil {
			m.Denied(w, r, d)
		} else {
			http.Error(w, "rate limit exceeded; retry after "+strconv.FormatInt(ceilSeconds(d.RetryAfter), 10)+"s",
				http.StatusTooManyRequests)
		}
		return
	}
	if d.Delay > 0 && sleep(r.Context(), d.Delay) != nil {
		return // the client left while its request was held
	}
	m.serveInFlight(w, r, key, next)
}

// serveInFlight serves r holding one of key's leases, when there is an in-flight limit.
func (m *Middleware) serveInFlight(w http.ResponseWriter, r *http.Request, key string, next http.Handler) {
	if m.InFlight == nil {
		next.ServeHTTP(w, r)
		return
	}
	limit := m.InFlight.Rule().Limit
	if m.InFlightLimit != nil {
		if limit = m.InFlightLimit(r); limit <= 0 {
			next.ServeHTTP(w, r)
			return
		}
	}
	release, d, err := m.observer().hold(r.Context(), m.InFlight, key, limit, m.Shadow)
	switch {
	case err != nil:
		if m.passes(w, r, err) {
			next.ServeHTTP(w, r)
		}
		return
	case release == nil && m.Shadow:
		next.ServeHTTP(w, r)
		return
	case release == nil:
		h := w.Header()
		for _, name := range rateHeaders {
			h.Del(name)
		}
		h.Set("Retry-After", "1")
		if m.InFlightDenied != nil {
			m.InFlightDenied(w, r, d)
		} else {
			http.Error(w, "too many requests in progress; retry after 1s", http.StatusTooManyRequests)
		}
		return
	}
	defer release()
	next.ServeHTTP(w, r)
}

// passes says whether a request whose limiter failed with err goes on: not when its
// client is gone; else as Error says, or yes without it.
func (m *Middleware) passes(w http.ResponseWriter, r *http.Request, err error) bool {
	pass := r.Context().Err() == nil && (m.Error == nil || m.Error(w, r, err))
	if pass {
		m.observer().warn(r.Context(), "the limiter failed; the request goes on", "", err)
	}
	return pass
}

// observer is what a middleware tells of its decisions: to the hook, and to the logger
// what it swallows. Either may be nil.
type observer struct {
	hook func(context.Context, Event)
	log  *slog.Logger
}

func (m *Middleware) observer() observer { return observer{m.OnDecision, m.Logger} }

// warn logs what the middleware swallows, when it has a logger.
func (o observer) warn(ctx context.Context, what, key string, err error) {
	if o.log != nil {
		o.log.WarnContext(ctx, "ratelimit: "+what, "key", key, "err", err)
	}
}

// begin starts a decision to report: ctx carrying a record of the store that decides,
// and the clock's reading, when there is a hook to tell (none read otherwise).
func (o observer) begin(ctx context.Context) (context.Context, *trace.Record, time.Time) {
	if o.hook == nil {
		return ctx, nil, time.Time{}
	}
	ctx, rec := trace.With(ctx)
	return ctx, rec, time.Now()
}

// report hands e to the hook, if any, with the store rec names and the time since start.
func (o observer) report(ctx context.Context, rec *trace.Record, start time.Time, e Event) {
	if o.hook != nil {
		e.Source, e.Latency, e.Priority = rec.Source(), time.Since(start), PriorityFrom(ctx)
		o.hook(ctx, e)
	}
}

// hold takes one of key's leases of l under limit for the call in ctx, reported as an
// in-flight decision. With a lease it returns release, which stops the lease's
// extensions (every half lease duration meanwhile) and gives it back, once; without
// one, a nil release, the Decision and the store's error.
func (o observer) hold(ctx context.Context, l *InFlightLimiter, key string, limit int64, shadow bool) (release func(), d Decision, err error) {
	tctx, rec, start := o.begin(ctx)
	lease, d, err := l.AcquireLimit(tctx, key, limit)
	o.report(ctx, rec, start, Event{Key: key, Policy: "in-flight", Decision: d, InFlight: true, Shadowed: shadow, Err: err})
	if lease == nil {
		return nil, d, err
	}
	stop := lease.keepAlive(ctx, leaseTimeout, func(err error) { o.warn(ctx, "extending a lease", key, err) })
	var once sync.Once
	return func() {
		once.Do(func() {
			stop()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseTimeout)
			defer cancel()
			if err := lease.Release(rctx); err != nil { // the lease expires by itself
				o.warn(ctx, "releasing a lease", key, err)
			}
		})
	}, d, nil
}

// decideReported is decide, reported to the hook: the decision, then each shadowed
// policy's.
func (m *Middleware) decideReported(r *http.Request, key string, ps []policy) ([]policy, Decision, error) {
	o := m.observer()
	ctx, rec, start := o.begin(r.Context())
	rr := r
	if rec != nil {
		rr = r.WithContext(ctx)
	}
	ps, shadows, d, err := m.decide(rr, key, ps)
	if len(ps) > 0 || err != nil {
		e := Event{Key: key, Decision: d, Shadowed: m.Shadow, Err: err}
		if len(ps) > 0 {
			e.Policy = ps[binding(ps)].name
		}
		o.report(ctx, rec, start, e)
	}
	for _, s := range shadows {
		if o.hook != nil {
			o.hook(ctx, Event{Key: key, Policy: s.name, Decision: s.d, Shadowed: true, Source: rec.Source(), Latency: s.latency,
				Priority: PriorityFrom(ctx)})
		}
	}
	return ps, d, err
}

// policy is one limit that took part in a request's decision, for the headers.
type policy struct {
	name string
	rule Rule
	d    Decision
}

// shadowed is the decision of a shadowed policy, for the hook.
type shadowed struct {
	name    string
	d       Decision
	latency time.Duration
}

// decide decides r under the Middleware's limits: the policies that took part and are
// enforced (none when no policy applies), their combined Decision, and the decisions of
// the shadowed policies.
//
// The policies are appended to ps.
func (m *Middleware) decide(r *http.Request, key string, ps []policy) ([]policy, []shadowed, Decision, error) {
	if m.Policies != nil {
		return m.decidePolicies(r, key)
	}
	name := "default"
	if m.PolicyName != nil {
		name = m.PolicyName(r)
	}
	if m.Decide != nil {
		d, rule, err := m.Decide(r, key)
		return append(ps, policy{name, rule, d}), nil, d, err
	}
	if m.DecidePolicies != nil {
		pds, err := m.DecidePolicies(r, key)
		if err != nil {
			return nil, nil, Decision{}, err
		}
		ds := make([]Decision, len(pds))
		for i, pd := range pds {
			ps = append(ps, policy{pd.Name, pd.Rule, pd.Decision})
			ds[i] = pd.Decision
		}
		if len(ds) == 0 { // no limit applies
			return nil, nil, Decision{Allowed: true}, nil
		}
		return ps, nil, combine(ds), nil
	}
	d, err := m.Limiter.Allow(r.Context(), key)
	var rule Rule
	if rl, ok := m.Limiter.(interface{ Rule() Rule }); ok {
		rule = rl.Rule()
	}
	return append(ps, policy{name, rule, d}), nil, d, err
}

// decidePolicies takes one event of key under every enforced policy that matches r, all
// or none, and then, if they admit it, under each shadowed one alone.
func (m *Middleware) decidePolicies(r *http.Request, key string) ([]policy, []shadowed, Decision, error) {
	var ps []policy
	var reqs, shadowReqs []Request
	var shadowNames []string
	var store Store
	for _, p := range m.Policies {
		if p.Match != nil && !p.Match(r) {
			continue
		}
		l := p.Limiter.(algorithmBased).base() // checked by Wrap
		store = l.store
		req := Request{Key: key, N: 1, Spec: l.takes[l.priority(r.Context())]}
		if p.Shadow {
			shadowReqs, shadowNames = append(shadowReqs, req), append(shadowNames, p.Name)
			continue
		}
		ps = append(ps, policy{name: p.Name, rule: l.rule})
		reqs = append(reqs, req)
	}
	var d Decision
	if len(reqs) > 0 {
		ds, err := ApplyAll(r.Context(), store, reqs)
		if err != nil {
			return nil, nil, Decision{}, err
		}
		for i := range ps {
			ps[i].d = ds[i]
		}
		d = combine(ds)
		if !d.Allowed {
			return ps, nil, d, nil // a request the enforced policies deny counts in no shadow
		}
	}
	var shadows []shadowed
	for i, req := range shadowReqs {
		start := time.Now()
		so, err := store.Apply(r.Context(), req)
		if err != nil { // a shadow's failure never touches the request
			m.observer().warn(r.Context(), "a shadowed policy failed", key, err)
			continue
		}
		a, _ := req.Args() // Wrap checked the rule
		shadows = append(shadows, shadowed{shadowNames[i], so.Decision(a.Limit), time.Since(start)})
	}
	return ps, shadows, d, nil
}

// checkPolicies is why policies cannot be decided together, or nil.
func checkPolicies(policies []Policy) error {
	type space struct {
		alg *Algorithm
		ns  string
	}
	names := make(map[string]bool, len(policies))
	spaces := make(map[space]string, len(policies))
	var store Store
	for i, p := range policies {
		b, ok := p.Limiter.(algorithmBased)
		if !ok || b.base() == nil {
			return fmt.Errorf("ratelimit: Middleware policy %d (%q): %T is not a limiter of an algorithm package", i, p.Name, p.Limiter)
		}
		l := b.base()
		if _, ok := sfString(p.Name); !ok || p.Name == "" {
			return fmt.Errorf("ratelimit: Middleware policy %d: the name %q is not a header string (printable ASCII)", i, p.Name)
		}
		if names[p.Name] {
			return fmt.Errorf("ratelimit: Middleware policy %d: the name %q is another policy's", i, p.Name)
		}
		names[p.Name] = true
		if other, dup := spaces[space{l.alg, l.namespace}]; dup {
			return fmt.Errorf("ratelimit: Middleware policies %q and %q count the same keys (one algorithm and namespace): give one a namespace of its own", other, p.Name)
		}
		spaces[space{l.alg, l.namespace}] = p.Name
		if i == 0 {
			store = l.store
		} else if !sameStore(store, l.store) {
			return fmt.Errorf("ratelimit: Middleware policy %q has another store than policy %q", p.Name, policies[0].Name)
		}
	}
	return nil
}

// checkKey refuses a key that is too long or holds control characters.
func checkKey(key string, maxLen int) error {
	if len(key) > maxLen {
		return errors.New("ratelimit: the request's key is longer than " + strconv.Itoa(maxLen) + " bytes")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c == 0x7f {
			return errors.New("ratelimit: the request's key holds a control character")
		}
	}
	return nil
}

// rateHeaders are the headers setHeaders sets.
var rateHeaders = [...]string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"}

// setHeaders sets the de facto X-RateLimit-* headers from d, the combined Decision, and
// the IETF draft's RateLimit-Policy (each policy's quota and the seconds a full quota takes
// to come back) and RateLimit (the binding policy's remaining and reset) from ps
// (draft-ietf-httpapi-ratelimit-headers). A name that is not an RFC 8941 string leaves
// the draft's two out.
func setHeaders(h http.Header, ps []policy, d Decision) {
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(resetSeconds(d), 10))
	b := binding(ps)
	var bname string
	var list strings.Builder
	list.Grow(48 * len(ps))
	for i, p := range ps {
		name, ok := sfString(p.name)
		if !ok {
			return
		}
		if i == b {
			bname = name
		}
		if w := windowSeconds(p.d.Limit, p.rule); w > 0 {
			if list.Len() > 0 {
				list.WriteString(", ")
			}
			list.WriteString(name)
			list.WriteString(";q=")
			list.WriteString(strconv.FormatInt(p.d.Limit, 10))
			list.WriteString(";w=")
			list.WriteString(strconv.FormatInt(w, 10))
		}
	}
	if list.Len() > 0 {
		h.Set("RateLimit-Policy", list.String())
	}
	h.Set("RateLimit", bname+";r="+strconv.FormatInt(ps[b].d.Remaining, 10)+";t="+strconv.FormatInt(resetSeconds(ps[b].d), 10))
}

// binding is the index of the policy that bounds the client now: of those that denied,
// the one with the longest RetryAfter; when none did, the one with the least remaining;
// the first of equals.
func binding(ps []policy) int {
	b := 0
	for i, p := range ps {
		switch {
		case !p.d.Allowed && (ps[b].d.Allowed || p.d.RetryAfter > ps[b].d.RetryAfter):
			b = i
		case p.d.Allowed && ps[b].d.Allowed && p.d.Remaining < ps[b].d.Remaining:
			b = i
		}
	}
	return b
}

// resetSeconds is d's ResetAfter in whole seconds, rounded up; 0 for a key that is full.
func resetSeconds(d Decision) int64 {
	if d.ResetAfter <= 0 {
		return 0
	}
	return ceilSeconds(d.ResetAfter)
}

// windowSeconds is how long a quota of limit takes to come back at rule's rate, in whole
// seconds rounded up and at least 1 (limit * Period / Limit, exactly: the product may
// pass 64 bits); 0 for a rule without a rate.
func windowSeconds(limit int64, rule Rule) int64 {
	if limit <= 0 || rule.Limit <= 0 || rule.Period <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(limit), uint64(rule.Period))
	hi, lo = ceilDiv128(hi, lo, uint64(rule.Limit))
	hi, lo = ceilDiv128(hi, lo, uint64(time.Second))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return max(1, int64(lo))
}

// ceilDiv128 is the 128-bit hi:lo divided by d > 0, rounded up.
func ceilDiv128(hi, lo, d uint64) (uint64, uint64) {
	qhi, r := hi/d, hi%d
	qlo, r := bits.Div64(r, lo, d)
	if r != 0 {
		var carry uint64
		qlo, carry = bits.Add64(qlo, 1, 0)
		qhi += carry
	}
	return qhi, qlo
}

// sfString is name as a String of RFC 8941 structured fields (quoted, '"' and '\'
// escaped), and whether it can be one: printable ASCII only.
func sfString(name string) (string, bool) {
	plain := true
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return "", false
		} else if c == '"' || c == '\\' {
			plain = false
		}
	}
	if plain {
		return `"` + name + `"`, true
	}
	var b strings.Builder
	b.Grow(len(name) + 4)
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		if c := name[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(name[i])
	}
	b.WriteByte('"')
	return b.String(), true
}

// ceilSeconds is d in whole seconds, rounded up, at least 1.
func ceilSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

// ClientIP is the address of the client that sent r. The peer (r.RemoteAddr) is the
// client, unless it is in one of the trusted prefixes (proxies or load balancers in front
// of the server): then X-Forwarded-For is read from the right, past the trusted hops, and
// the first address that is not trusted is the client. A header the client wrote itself
// sits to the left of that and is never read, so a client cannot choose its own address.
// With no trusted prefixes, X-Forwarded-For is ignored. An IPv6 client is masked to its
// /64, which one client usually holds whole. The error says that RemoteAddr is not an
// address (a custom listener's, say).
func ClientIP(r *http.Request, trusted []netip.Prefix) (netip.Addr, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	client, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, errors.New("ratelimit: the request's RemoteAddr " + strconv.Quote(r.RemoteAddr) + " is not an IP address")
	}
	client = client.Unmap()
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	if isTrusted(client) {
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0 && isTrusted(client); i-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // a malformed hop: the last trusted proxy is the best we know
			}
			client = hop.Unmap()
		}
	}
	if client.Is6() {
		client = netip.PrefixFrom(client, 64).Masked().Addr()
	}
	return client, nil
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
