package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Policy is one of a Middleware's Policies: a limit with a name for the headers.
type Policy struct {
	// Name names the policy in RateLimit and RateLimit-Policy. Middleware.PolicyName says
	// which characters it may hold. Required.
	Name string
	// Limiter is a limiter of an algorithm package: its New's, or a
	// fixedwindow.QuotaLimiter. No other kind compiles. Every policy's limiter is on the
	// same store. Required unless For chooses one for every request.
	Limiter algorithmBased
	// Match reports whether the policy applies to r (an export route's limit, say). Nil
	// applies it to every request.
	Match func(r *http.Request) bool
	// For, when set, chooses the policy's limit for each request it applies to. It may
	// choose a key of its own, a rule, a limiter on the policies' store, or the policy's
	// name in the headers. Its own key suits a tenant's monthly quota, beside the
	// Middleware's key of a tenant and a route. A rule suits a tenant's plan. What For
	// leaves zero is the Policy's own. Its error counts as a request without a key: the
	// request gets KeyError's answer, as for the Key function's error.
	For func(r *http.Request) (PolicyLimit, error)
	// Shadow decides and counts the policy without enforcing it (see Middleware.Shadow).
	// A shadowed policy is decided alone, after the enforced policies have admitted the
	// request. It is left out of the headers.
	Shadow bool
	// Cost, when set, charges this policy a request's cost once the request is served
	// (see Cost). The policy admits the request on its estimate. After the answer, it is
	// charged the rest, or refunded. Nil charges 1 event a request.
	Cost *Cost
}

// PolicyLimit is a Policy's limit for one request, as Policy.For chooses it. A field left
// zero takes the Policy's own: its name, the Middleware's Key, its limiter, or the
// limiter's rule.
type PolicyLimit struct {
	Name    string
	Key     string
	Limiter algorithmBased
	Rule    Rule
}

// decideReported is decide, reported to the hook: the decision, then each shadowed
// policy's.
func (m *Middleware) decideReported(r *http.Request, key string, ps []policy) ([]policy, []shadowed, Decision, error) {
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
			b := ps[binding(ps)]
			e.Policy, e.Key = b.name, cmp.Or(b.key, key)
		}
		o.report(ctx, rec, start, e)
	}
	for _, s := range shadows {
		if o.hook != nil {
			o.hook(ctx, Event{Key: cmp.Or(s.key, key), Policy: s.name, Decision: s.d, Shadowed: true, Source: rec.Source(), Latency: s.latency,
				Priority: PriorityFrom(ctx)})
		}
	}
	return ps, shadows, d, err
}

// policy is one limit that took part in a request's decision, for the headers, and for
// what follows the answer: its charge (c.cost when it has a Cost), or, when the request
// may yet be refused for being one too many in progress, its take to give back (c.store
// is nil when there is neither).
type policy struct {
	name string
	key  string // its own key, when not the Middleware's
	rule Rule
	d    Decision
	c    charge
}

// shadowed is the decision of a shadowed policy, for the hook, and its charge after the
// answer when it has a Cost and admitted the request.
type shadowed struct {
	name    string
	key     string
	d       Decision
	latency time.Duration
	c       charge
}

// charges are the charges due after the answer of a request the policies ps admitted
// (none of theirs when it was not admitted), and those of the shadowed policies that
// admitted it: nil, without an allocation, when no policy has a Cost.
func charges(ps []policy, admitted bool, shadows []shadowed) []charge {
	var cs []charge
	for _, p := range ps {
		if admitted && p.c.cost != nil {
			cs = append(cs, p.c)
		}
	}
	for _, s := range shadows {
		if s.c.cost != nil {
			cs = append(cs, s.c)
		}
	}
	return cs
}

// takes are what the enforced policies ps took of an admitted request, to give back if
// it is refused after all (for being one too many in progress).
func takes(ps []policy) []charge {
	var cs []charge
	for _, p := range ps {
		if p.c.store != nil {
			cs = append(cs, p.c)
		}
	}
	return cs
}

// decide decides r under the Middleware's limits: the policies that took part and are
// enforced (none when no policy applies), their combined Decision, and the decisions of
// the shadowed policies.
//
// The policies are appended to ps.
func (m *Middleware) decide(r *http.Request, key string, ps []policy) ([]policy, []shadowed, Decision, error) {
	if m.Decide == nil && m.Policies != nil {
		return m.decidePolicies(r, key)
	}
	name := "default"
	if m.PolicyName != nil {
		name = m.PolicyName(r)
	}
	if m.Decide != nil {
		d, rule, err := m.Decide(r, key)
		return append(ps, policy{name: name, rule: rule, d: d}), nil, d, err
	}
	var rule Rule
	if rl, ok := m.Limiter.(interface{ Rule() Rule }); ok {
		rule = rl.Rule()
	}
	if b, ok := m.Limiter.(algorithmBased); ok && b.base() != nil && (m.Cost != nil || m.InFlight != nil) {
		// a take with a receipt: to settle, or to give back (Wrap checked a Cost's limiter)
		l := b.base()
		c := admit(r, l, key, l.takes[l.priority(r.Context())], l.limit, m.Cost)
		o, err := l.store.Apply(r.Context(), c.request())
		d := decisionOf(o)
		if err != nil {
			d = Decision{}
		}
		return append(ps, policy{name: name, rule: rule, d: d, c: c}), nil, d, err
	}
	d, err := m.Limiter.Allow(r.Context(), key)
	return append(ps, policy{name: name, rule: rule, d: d}), nil, d, err
}

// givesBack reports whether every limit of the Middleware can give back what a request
// took (limiters of the algorithm packages, alone or as Policies), so that the in-flight
// limit is decided after them, and a request it refuses gives back what they took;
// otherwise (a Limiter of another kind, Decide) the in-flight limit is decided first.
func (m *Middleware) givesBack() bool {
	if m.Decide != nil {
		return false
	}
	if m.Policies != nil {
		return true
	}
	b, ok := m.Limiter.(algorithmBased)
	return ok && b.base() != nil
}

// decidePolicies takes one event (or a Cost's estimate) under every enforced policy
// that applies to r, each with its key and rule, at r's priority, all or none, and then,
// if they admit it, under each shadowed one alone.
func (m *Middleware) decidePolicies(r *http.Request, key string) ([]policy, []shadowed, Decision, error) {
	var ps []policy
	var reqs, shadowReqs []core.Request
	var shadows []shadowed
	var store Store
	ctx := r.Context()
	for _, p := range m.Policies {
		if p.Match != nil && !p.Match(r) {
			continue
		}
		pol, l, req, err := m.policyRequest(r, key, p)
		if err != nil {
			return nil, nil, Decision{}, err
		}
		if store == nil {
			store = l.store
		} else if !sameStore(store, l.store) {
			return nil, nil, Decision{}, fmt.Errorf("ratelimit: Middleware policy %q: its limiter is on another store than the other policies'", pol.name)
		}
		if p.Shadow {
			shadowReqs = append(shadowReqs, req)
			shadows = append(shadows, shadowed{name: pol.name, key: pol.key, c: pol.c})
			continue
		}
		ps = append(ps, pol)
		reqs = append(reqs, req)
	}
	var d Decision
	if len(reqs) > 0 {
		ds, err := applyAll(ctx, store, reqs)
		if err != nil {
			return nil, nil, Decision{}, err
		}
		denied := false
		for _, pd := range ds {
			denied = denied || !pd.Allowed
		}
		for i := range ps {
			if denied && ds[i].Allowed { // not taken: what it has left is what it had
				ds[i].Remaining = min(ds[i].Limit, ds[i].Remaining+reqs[i].N)
			}
			ps[i].d = ds[i]
		}
		d = combine(ds)
		if !d.Allowed {
			return ps, nil, d, nil // a request the enforced policies deny counts in no shadow
		}
	}
	decided := shadows[:0]
	for i, req := range shadowReqs {
		start := time.Now()
		so, err := store.Apply(ctx, req)
		if err != nil { // a shadow's failure never touches the request
			m.observer().warn(ctx, "a shadowed policy failed", req.Key, err)
			continue
		}
		sh := shadows[i]
		sh.d, sh.latency = decisionOf(so), time.Since(start)
		if !so.Allowed() {
			sh.c = charge{}
		}
		decided = append(decided, sh)
	}
	return ps, decided, d, nil
}

// policyRequest is p's part in the decision of r: its limit (For's choice over p's own),
// its limiter, and its take, on its key under its rule at r's priority, of one event or
// a Cost's estimate.
func (m *Middleware) policyRequest(r *http.Request, key string, p Policy) (policy, *AlgorithmLimiter, core.Request, error) {
	lim := PolicyLimit{Name: p.Name, Key: key, Limiter: p.Limiter}
	if p.For != nil {
		chosen, err := p.For(r)
		if err = keyOf(chosen.Key, err, max(m.MaxKeyLength, defaultMaxKeyLength)); err != nil {
			return policy{}, nil, core.Request{}, fmt.Errorf("policy %q: %w", p.Name, err)
		}
		lim.Name, lim.Key = cmp.Or(chosen.Name, lim.Name), cmp.Or(chosen.Key, key)
		lim.Limiter, lim.Rule = cmp.Or(chosen.Limiter, lim.Limiter), chosen.Rule
	}
	var l *AlgorithmLimiter
	if lim.Limiter != nil {
		l = lim.Limiter.base()
	}
	if l == nil {
		return policy{}, nil, core.Request{}, fmt.Errorf("ratelimit: Middleware policy %q has no limiter", lim.Name)
	}
	rule := cmp.Or(lim.Rule, l.rule)
	spec, limit, err := l.specUnder(r.Context(), rule)
	if err != nil {
		return policy{}, nil, core.Request{}, fmt.Errorf("ratelimit: Middleware policy %q: %w", lim.Name, err)
	}
	pol, req := policy{name: lim.Name, key: lim.Key, rule: rule}, core.Request{Key: lim.Key, N: 1, Spec: spec}
	if p.Cost != nil && l.alg.Debit == nil {
		return policy{}, nil, core.Request{}, fmt.Errorf("ratelimit: Middleware policy %q has a Cost, and %s takes no debts", lim.Name, l.alg.Name)
	}
	if p.Cost != nil || (m.InFlight != nil && !p.Shadow) { // a take with a receipt: to settle, or to give back
		pol.c = admit(r, l, lim.Key, spec, limit, p.Cost)
		req = pol.c.request()
	}
	return pol, l, req, nil
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
		if p.Limiter == nil && p.For != nil { // chosen per request: checked then
			if err := checkPolicyName(i, p.Name, names); err != nil {
				return err
			}
			if p.Cost != nil {
				if err := checkCostFields(fmt.Sprintf("Middleware policy %q", p.Name), p.Cost); err != nil {
					return err
				}
			}
			continue
		}
		var l *AlgorithmLimiter
		if p.Limiter != nil {
			l = p.Limiter.base()
		}
		if l == nil {
			return fmt.Errorf("ratelimit: Middleware policy %d (%q) has no limiter", i, p.Name)
		}
		if err := checkPolicyName(i, p.Name, names); err != nil {
			return err
		}
		if err := checkCost(fmt.Sprintf("Middleware policy %q", p.Name), p.Limiter, p.Cost); err != nil {
			return err
		}
		if other, dup := spaces[space{l.alg, l.namespace}]; dup {
			return fmt.Errorf("ratelimit: Middleware policies %q and %q count the same keys (one algorithm and namespace): give one a namespace of its own", other, p.Name)
		}
		spaces[space{l.alg, l.namespace}] = p.Name
		if store == nil {
			store = l.store
		} else if !sameStore(store, l.store) {
			return fmt.Errorf("ratelimit: Middleware policy %q has another store than policy %q", p.Name, policies[0].Name)
		}
	}
	return nil
}

// checkPolicyName is why policy i cannot be named name beside the names before it, or
// nil; it adds name to them.
func checkPolicyName(i int, name string, names map[string]bool) error {
	if _, ok := sfString(name); !ok || name == "" {
		return fmt.Errorf("ratelimit: Middleware policy %d: the name %q is not a header string (printable ASCII)", i, name)
	}
	if names[name] {
		return fmt.Errorf("ratelimit: Middleware policy %d: the name %q is another policy's", i, name)
	}
	names[name] = true
	return nil
}

// checkKey refuses a key that is too long or holds control characters.
func checkKey(key string, maxLen int) error {
	if len(key) > maxLen {
		return fmt.Errorf("%w: the key is longer than %d bytes", ErrInvalidKey, maxLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: the key holds a control character", ErrInvalidKey)
		}
	}
	return nil
}

// keyOf is key's error, if any, wrapped with ErrInvalidKey, or key's refusal by
// checkKey.
func keyOf(key string, err error, maxLen int) error {
	if err != nil {
		if errors.Is(err, ErrInvalidKey) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	return checkKey(key, maxLen)
}
