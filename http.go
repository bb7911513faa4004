package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"
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
// at once, each holding a lease until its handler returns (RateLimit-Policy lists it,
// in the draft's unit qu="concurrent-requests"). With Cost, a request whose cost is
// known only once it is served (a completion's tokens) is admitted on an estimate and
// charged the rest after the answer.
//
// Exempt requests skip it whole; Shadow decides and counts without denying anyone;
// OnDecision sees every decision, and Logger what a fail-open swallows.
//
// Fields left nil have the defaults written beside them. A Middleware must not be changed
// once Wrap has been called; it is safe for concurrent use.
type Middleware struct {
	// Limiter decides each request, with n = 1: the one limit of the simple case (for
	// several, or a key or a rule chosen per request, see Policies). Required unless
	// Policies, Decide or InFlight is set.
	Limiter Limiter

	// Key is the limiter key of a request: a client IP (see ClientIP), an API key, a
	// tenant and a route joined with Key or redisstore.TaggedKey. Required. When it
	// returns an error, the request gets KeyError's answer and the limiter is not asked.
	// A key longer than MaxKeyLength, or that holds control characters (a header folded
	// over several lines does), gets KeyError's answer too, so that no client makes
	// itself a fresh key per request by padding one.
	Key func(r *http.Request) (string, error)

	// Policies, when set, decides each request under several limits at once, all or
	// none, as AllowAll does: a request one limit denies consumes nothing from the others.
	// Each is a named limiter of an algorithm package, all on one store. Each applies to
	// the requests it matches, with the request's Key or a key of its own. It decides
	// under the limiter's rule, or one Policy.For chooses per request (a tenant's monthly
	// quota beside its route's rate). It decides at the request's priority, and may have
	// a Cost of its own. RateLimit-Policy lists every policy that took part, and RateLimit
	// and X-RateLimit-* are the one policy's that bounds the client now: the denying one
	// with the longest RetryAfter, or else the one with the least remaining (never a
	// limit from one policy beside a reset from another). A request no policy matches is
	// not limited. Wrap panics on a policy without a limiter of an algorithm package (or
	// For), with a name that is not a valid header string (see PolicyName) or the name of
	// another, or on limiters of different stores.
	Policies []Policy

	// Decide, when set, decides a request instead of Limiter or Policies: for a decision
	// made outside this library's limiters (a remote rate limit service, Envoy's
	// descriptors). It returns the rule the decision was made under, for the
	// RateLimit-Policy header (a zero Rule leaves that header out). A decision of the
	// library's limiters, however many, and whatever rule and key each request has, is
	// Policies'.
	Decide func(r *http.Request, key string) (Decision, Rule, error)

	// Cost, when set, is what a request costs Limiter when it is known only once the
	// request is served (see Cost): the request is admitted on its estimate, and charged
	// the rest, or refunded, after the answer. Each of Policies has a Cost of its own.
	Cost *Cost

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

	// KeyError answers a request whose key could not be found or is refused, with an
	// error that wraps ErrInvalidKey (and the Key function's): by default 400 Bad Request
	// with the error's text. An API key that is missing deserves 401.
	KeyError func(w http.ResponseWriter, r *http.Request, err error)

	// Error is called when the limiter fails (its store is down, say), and says whether
	// the request goes on (fail open) or not, in which case Error has answered it. When
	// nil, every request goes on: rate limiting never takes a service down. A request
	// whose client has gone away is dropped without calling it.
	Error func(w http.ResponseWriter, r *http.Request, err error) (pass bool)

	// InFlight, when set, also bounds the requests of a key in progress at once. A request
	// the rate limit admits (every request, without Limiter and Decide) holds one of its
	// key's leases while the handler serves it. The lease is extended every half lease
	// duration while it runs, and released when it returns, even if it panics. A request that finds
	// every lease held gets InFlightDenied's answer; a failure of InFlight's store goes to
	// Error, as the rate limit's does. A request refused for being one too many in
	// progress costs the rate limits nothing. Limiters of the algorithm packages decide
	// first, and give back what they took, their Cost's estimate included (see Charge.Settle).
	// With a Limiter of another kind, or Decide, the in-flight limit decides first.
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
	// Headers, when set, writes the rate-limit headers of a decided request instead of
	// the defaults (X-RateLimit-*, RateLimit-Policy and RateLimit, from the binding
	// policy): the headers of an API whose clients read their own (a language model
	// provider's x-ratelimit-remaining-tokens), each limit of the request reported. It
	// gets every enforced policy's part of the decision, in the order of Policies (one
	// for a Limiter or Decide), after the request was decided and before it is answered
	// or passed on; Retry-After is still the Middleware's, from the limit that binds. The
	// in-flight limit adds its quota to RateLimit-Policy as it does by default, and a
	// request it refuses loses every header Headers wrote (their quota left would
	// contradict the 429).
	Headers func(h http.Header, limits []PolicyDecision)
}

// PolicyDecision is one policy's part of a request's decision, for Middleware.Headers.
type PolicyDecision struct {
	// Name is the policy's name (PolicyName's for a Limiter or Decide).
	Name string
	// Key is the key the policy decided, the Middleware's unless the policy has its own.
	Key string
	// Rule is the rule the policy decided under (zero when Decide gave none).
	Rule Rule
	// Unit is what the policy counts: its Cost's Unit, or "requests".
	Unit string
	// Decision is the policy's own decision.
	Decision Decision
	// Binding says that this policy bounds the client now (as the default headers choose
	// it): of those that denied, the one with the longest RetryAfter; else the one with
	// the least remaining.
	Binding bool
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
	case m.Limiter == nil && m.Decide == nil && m.Policies == nil && m.InFlight == nil:
		panic("ratelimit: Middleware without a Limiter, Policies, a Decide function or an InFlight limiter")
	}
	if err := checkPolicies(m.Policies); err != nil {
		panic(err.Error())
	}
	if m.Cost != nil && (m.Limiter == nil || m.Decide != nil || m.Policies != nil) {
		panic("ratelimit: Middleware.Cost is charged to its Limiter, and it has none, or decides otherwise (a Policy has a Cost of its own)")
	}
	if err := checkCost("Middleware", m.Limiter, m.Cost); err != nil {
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
	if err = keyOf(key, err, m.MaxKeyLength); err != nil {
		m.keyError(w, r, err)
		return
	}
	if m.Priority != nil {
		r = r.WithContext(WithPriority(r.Context(), m.Priority(r)))
	}
	if m.Limiter == nil && m.Decide == nil && m.Policies == nil {
		m.serveAdmitted(w, r, key, next, nil, nil, nil)
		return
	}
	// A request refused for being one too many in progress costs its rate limits nothing:
	// it gives back what they took, or, where they cannot give it back (a Limiter of
	// another kind, Decide), the in-flight limit is decided before them.
	var h *held
	if m.InFlight != nil && !m.givesBack() {
		var ok bool
		if h, ok = m.acquire(w, r, key, nil); !ok {
			return
		}
		defer h.release()
	}
	var one [1]policy // the usual decision, under one policy, without an allocation
	ps, shadows, d, err := m.decideReported(r, key, one[:0])
	if errors.Is(err, ErrInvalidKey) { // a policy's own key: no limit's failure
		m.keyError(w, r, err)
		return
	}
	if err != nil {
		if m.passes(w, r, err) {
			m.serveAdmitted(w, r, key, next, h, nil, nil)
		}
		return
	}
	if len(ps) == 0 { // no enforced policy applies
		m.serveAdmitted(w, r, key, next, h, nil, charges(nil, false, shadows))
		return
	}
	if m.Shadow { // decided and counted, never enforced: no headers, and on it goes
		m.serveAdmitted(w, r, key, next, h, nil, charges(ps, d.Allowed, shadows))
		return
	}
	written := m.setHeaders(w.Header(), key, ps)
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
	m.serveAdmitted(w, r, key, next, h, takes(ps), charges(ps, true, shadows), written...)
}

// keyError answers a request without a valid key.
func (m *Middleware) keyError(w http.ResponseWriter, r *http.Request, err error) {
	if m.KeyError != nil {
		m.KeyError(w, r, err)
	} else {
		http.Error(w, err.Error(), http.StatusBadRequest)
	}
}

// serveAdmitted serves r, which the rate limits admitted, holding one of key's leases of
// the in-flight limit: h, taken before them, or one taken now; a request refused now
// gives back what the rate limits took (taken). Once the handler has returned, each limit
// of charges is charged what r cost.
//
// written are the rate-limit headers set for r, to take off if the in-flight limit
// refuses it (the defaults' when none is named).
func (m *Middleware) serveAdmitted(w http.ResponseWriter, r *http.Request, key string, next http.Handler, h *held, taken, charges []charge, written ...string) {
	if h == nil {
		var ok bool
		if h, ok = m.acquire(w, r, key, written); !ok {
			for _, c := range taken { // refused after all: it costs nothing
				c.giveBack(r.Context(), m.observer())
			}
			return
		}
		defer h.release()
	}
	if h.limit > 0 && !m.Shadow {
		hd := w.Header()
		if list := hd.Get("RateLimit-Policy"); list != "" {
			hd.Set("RateLimit-Policy", list+", "+inFlightPolicy(h.limit))
		} else {
			hd.Set("RateLimit-Policy", inFlightPolicy(h.limit))
		}
	}
	if len(charges) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	aw := &answerWriter{ResponseWriter: w}
	next.ServeHTTP(aw, r)
	a := aw.answer()
	for _, c := range charges {
		c.settle(r.Context(), m.observer(), r, a)
	}
}

// held is a request's hold on one of its key's leases of the in-flight limit: limit is
// the in-flight limit it was taken under, 0 when none applies (or none was taken: a
// shadow, a store that failed open).
type held struct {
	limit int64
	give  func() // gives the lease back; nil for none
}

// release gives the lease back, if one is held.
func (h *held) release() {
	if h.give != nil {
		h.give()
	}
}

// acquire takes one of key's in-flight leases for r, when an in-flight limit applies; ok
// false when it answered r instead: every lease held (429, or InFlightDenied), or the
// store failed and Error said not to go on. A refusal takes off the rate-limit headers
// written (the defaults' when none is named).
func (m *Middleware) acquire(w http.ResponseWriter, r *http.Request, key string, written []string) (h *held, ok bool) {
	if m.InFlight == nil {
		return &held{}, true
	}
	limit := m.InFlight.Rule().Limit
	if m.InFlightLimit != nil {
		if limit = m.InFlightLimit(r); limit <= 0 {
			return &held{}, true
		}
	}
	release, d, err := m.observer().hold(r.Context(), m.InFlight, key, limit, m.Shadow)
	switch {
	case err != nil:
		return &held{}, m.passes(w, r, err)
	case release == nil && m.Shadow:
		return &held{}, true
	case release == nil:
		hd := w.Header()
		for _, name := range rateHeaders {
			hd.Del(name)
		}
		for _, name := range written {
			hd.Del(name)
		}
		hd.Set("RateLimit-Policy", inFlightPolicy(limit))
		hd.Set("RateLimit", `"in-flight";r=0`)
		hd.Set("Retry-After", "1")
		if m.InFlightDenied != nil {
			m.InFlightDenied(w, r, d)
		} else {
			http.Error(w, "too many requests in progress; retry after 1s", http.StatusTooManyRequests)
		}
		return nil, false
	}
	return &held{limit: limit, give: release}, true
}

// inFlightPolicy is an in-flight limit in RateLimit-Policy: its quota of requests in
// progress at once, in the IETF draft's unit for it.
func inFlightPolicy(limit int64) string {
	return `"in-flight";q=` + strconv.FormatInt(limit, 10) + `;qu="concurrent-requests"`
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
