package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// Middleware limits the requests that reach an http.Handler. For each request it finds
// the key and asks the limiter. It sets the rate-limit headers. It passes an admitted
// request on, and answers a denied one with 429 Too Many Requests and Retry-After.
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
// Every response it decides carries these headers:
//   - X-RateLimit-Limit, the key's limit (Decision.Limit).
//   - X-RateLimit-Remaining, what the key has left.
//   - X-RateLimit-Reset, the seconds until the key is full again.
//   - RateLimit-Policy, from the IETF draft: the quota, and the seconds a full quota
//     takes to come back.
//   - RateLimit, from the same draft: the remaining and the reset.
//
// A denied response also carries Retry-After, in whole seconds rounded up. A client that
// waits that long is not early. A shaping algorithm (the leaky bucket) may admit a
// request after a Decision.Delay. The Middleware holds such a request for that delay,
// then passes it on.
//
// With InFlight, it also bounds the requests of a key in progress at once. Each holds a
// lease until its handler returns. RateLimit-Policy lists that limit in the draft's unit,
// qu="concurrent-requests". With Cost, a request whose cost is known only once it is
// served (a completion's tokens) is admitted on an estimate. It is charged the rest after
// the answer.
//
// Exempt requests skip it whole. Shadow decides and counts without denying anyone.
// OnDecision sees every decision. Logger gets the errors a fail-open swallows.
//
// Fields left nil have the defaults written beside them. A Middleware must not be changed
// once Wrap has been called. It is safe for concurrent use.
type Middleware struct {
	// Limiter decides each request, with n = 1. It is the one limit of the simple case.
	// For several limits, or a key or a rule chosen per request, see Policies. Required
	// unless Policies, Decide or InFlight is set.
	Limiter Limiter

	// Key is the limiter key of a request, such as a client IP (see ClientIP) or an API
	// key. Join a tenant and a route with Key or redisstore.TaggedKey. Required. When it
	// returns an error, the request gets KeyError's answer, and the limiter is not asked.
	// So does a key longer than MaxKeyLength, or one that holds control characters (as a
	// header folded over several lines does). No client can then make itself a fresh key
	// per request by padding one.
	Key func(r *http.Request) (string, error)

	// Policies, when set, decides each request under several limits at once, as AllowAll
	// does. The limits admit a request all together or not at all. A request one limit
	// denies consumes nothing from the others. A request that no policy matches is not
	// limited.
	//
	// Each policy is a named limiter of an algorithm package, and all are on one store. A
	// policy applies to the requests it matches, with the request's Key or a key of its
	// own. It decides under its limiter's rule, or under one that Policy.For chooses per
	// request (a tenant's monthly quota beside its route's rate). It decides at the
	// request's priority, and may have a Cost of its own.
	//
	// RateLimit-Policy lists every policy that took part. RateLimit and X-RateLimit-* come
	// from the one policy that binds the client now. That is the denying policy with the
	// longest RetryAfter, or else the policy with the least remaining. The headers never
	// put a limit from one policy beside a reset from another.
	//
	// Wrap panics on a policy with neither a limiter of an algorithm package nor For. It
	// panics on a name that is not a valid header string (see PolicyName), or that
	// another policy has. It panics on limiters of different stores, and on two limiters
	// of one algorithm and namespace, which would count the same keys.
	Policies []Policy

	// Decide, when set, decides a request instead of Limiter or Policies. It is for a
	// decision made outside this library's limiters, such as a remote rate limit service
	// or Envoy's descriptors. It returns the rule of the decision, for the
	// RateLimit-Policy header. A zero Rule leaves that header out. For the library's own
	// limiters, use Policies, however many there are and whatever each request's rule and
	// key.
	Decide func(r *http.Request, key string) (Decision, Rule, error)

	// Cost, when set, charges Limiter a request's cost once the request is served (see
	// Cost). The request is admitted on its estimate. After the answer, it is charged the
	// rest, or refunded. Wrap panics if Cost is set without a Limiter, or with Policies or
	// Decide. Each of Policies has a Cost of its own.
	Cost *Cost

	// MaxKeyLength bounds the length of a key in bytes: 256 when 0.
	MaxKeyLength int

	// PolicyName names a request's policy in the RateLimit and RateLimit-Policy headers (a
	// route's name, say). It is "default" when nil. The headers carry the name as an
	// RFC 8941 string: printable ASCII, with '"' and '\\' escaped. A name with any other
	// character (a control character, a letter outside ASCII) leaves those two headers
	// out of the response. No strict client could read them.
	PolicyName func(r *http.Request) string

	// Denied answers a denied request, after the headers are set. By default it answers
	// 429 Too Many Requests with a one-line text body.
	Denied func(w http.ResponseWriter, r *http.Request, d Decision)

	// KeyError answers a request whose key could not be found or is refused. Its error
	// wraps ErrInvalidKey, and the Key function's error if there is one. By default it
	// answers 400 Bad Request with the error's text. A missing API key deserves 401.
	KeyError func(w http.ResponseWriter, r *http.Request, err error)

	// Error is called when the limiter fails (its store is down, say). It reports whether
	// the request goes on (fail open). If not, Error has answered the request. When Error
	// is nil, every request goes on: rate limiting never takes a service down. A request
	// whose client has gone away is dropped without calling Error.
	Error func(w http.ResponseWriter, r *http.Request, err error) (pass bool)

	// InFlight, when set, also bounds the requests of a key in progress at once. A request
	// the rate limit admits holds one of its key's leases while the handler serves it.
	// Without Limiter, Policies and Decide, every request does. The lease is extended every
	// half lease duration while the handler runs. It is released when the handler returns,
	// even if it panics. A request that finds every lease held gets InFlightDenied's
	// answer. A failure of InFlight's store goes to Error, as a rate limit's does.
	//
	// A request refused for being one too many in progress costs the rate limits nothing.
	// Limiters of the algorithm packages decide first. If the in-flight limit then refuses
	// the request, they give back what they took, their Cost's estimate included (see
	// Charge.Settle). With a Limiter of another kind, or Decide, the in-flight limit
	// decides first.
	InFlight *InFlightLimiter

	// InFlightLimit, when set, is a request's in-flight limit (a route's, say), instead of
	// InFlight's own. 0 or less means none for this request.
	InFlightLimit func(r *http.Request) int64

	// Priority, when set, is a request's priority (its route's class, a header of a
	// trusted caller). Every limit decides the request at that priority (see
	// WithPriority). That way, the limiters with reserves (WithReserves) shed the least
	// important requests first. The request's context carries the priority on to the
	// handler.
	// Without Priority, a request has its context's priority, Critical when there is
	// none. Then no request is shed for another.
	Priority func(r *http.Request) Priority

	// Exempt, when set, reports which requests skip the limits entirely (health checks,
	// an allow-list of internal callers). For them no key is read, no limiter asked, no
	// header set and no hook called.
	Exempt func(r *http.Request) bool

	// Shadow decides and counts every request as usual, but denies none. Use it to try
	// limits on live traffic, like envoyproxy/ratelimit's shadow_mode. A request the
	// limits would deny goes on, and OnDecision sees it. No rate-limit headers are set:
	// their absence says that nothing was enforced. A Policy's Shadow shadows that policy
	// alone.
	Shadow bool

	// OnDecision, when set, sees every decision the Middleware makes, for metrics and
	// logs. It is called after the decision, before the request goes on or is answered. It
	// runs on the request's goroutine and must be fast.
	OnDecision func(ctx context.Context, e Event)

	// Logger, when set, receives at Warn level the errors the Middleware would otherwise
	// swallow. Among them are a limiter's error after which the request went on (fail
	// open), and a lease that could not be released or extended.
	Logger *slog.Logger

	// InFlightDenied answers a request that found every lease of its key held. By default
	// it answers 429 Too Many Requests with a one-line text body. Set it to answer 503
	// instead, say. Retry-After is set to 1 second first, as a lease may come back at any
	// moment. The rate limit's headers are taken off, as their quota left would contradict
	// the 429. RateLimit-Policy and RateLimit then state the in-flight limit alone.
	InFlightDenied func(w http.ResponseWriter, r *http.Request, d Decision)

	// Headers, when set, writes a decided request's rate-limit headers instead of the
	// defaults: X-RateLimit-*, RateLimit-Policy and RateLimit, from the binding policy.
	// Use it for an API whose clients read headers of their own, such as a language model
	// provider's x-ratelimit-remaining-tokens. It can report each limit of the request.
	//
	// Headers gets each enforced policy's part of the decision, in the order of Policies.
	// A Limiter or Decide makes one part. It is called after the request is decided, and
	// before it is answered or passed on. The Middleware still sets Retry-After, from the
	// limit that binds. The in-flight limit still adds its quota to RateLimit-Policy. A
	// request the in-flight limit refuses loses every header Headers wrote, as their quota
	// left would contradict the 429.
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
	// Binding reports whether this policy binds the client now, as the default headers
	// choose it. Of the policies that denied, it is the one with the longest RetryAfter.
	// If none denied, it is the one with the least remaining.
	Binding bool
}

// leaseTimeout bounds Middleware's releases and extensions, which outlive the request's
// context: a store that does not answer loses only the lease, which expires by itself.
const leaseTimeout = time.Second

const defaultMaxKeyLength = 256

// Wrap returns next behind the limit. It panics if the Middleware has no Key, or none of
// Limiter, Policies, Decide and InFlight. It also panics on invalid Policies or Costs, as
// those fields' docs say. A misconfigured server should not start: net/http's
// constructors panic on a nil handler for the same reason.
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
