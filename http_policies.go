package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

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
	// Cost, when set, is what a request costs this policy when it is known only once the
	// request is served (see Cost): the policy admits the request on its estimate, and
	// is charged the rest, or refunded, after the answer. Nil: 1 event a request.
	Cost *Cost
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
	return ps, shadows, d, err
}

// policy is one limit that took part in a request's decision, for the headers, and
// for the charge after the answer when it has a Cost (c.l is nil otherwise).
type policy struct {
	name string
	rule Rule
	d    Decision
	c    charge
}

// shadowed is the decision of a shadowed policy, for the hook, and its charge after the
// answer when it has a Cost and admitted the request.
type shadowed struct {
	name    string
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
		if admitted && p.c.l != nil {
			cs = append(cs, p.c)
		}
	}
	for _, s := range shadows {
		if s.c.l != nil {
			cs = append(cs, s.c)
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
	if m.Policies != nil {
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
	if m.DecidePolicies != nil {
		pds, err := m.DecidePolicies(r, key)
		if err != nil {
			return nil, nil, Decision{}, err
		}
		ds := make([]Decision, len(pds))
		for i, pd := range pds {
			ps = append(ps, policy{name: pd.Name, rule: pd.Rule, d: pd.Decision})
			ds[i] = pd.Decision
		}
		if len(ds) == 0 { // no limit applies
			return nil, nil, Decision{Allowed: true}, nil
		}
		return ps, nil, combine(ds), nil
	}
	var rule Rule
	if rl, ok := m.Limiter.(interface{ Rule() Rule }); ok {
		rule = rl.Rule()
	}
	if m.Cost != nil { // checked by Wrap: a limiter of an algorithm package
		l := m.Limiter.(algorithmBased).base()
		c := admit(r.Context(), r, l, m.Cost)
		d, err := l.AllowN(r.Context(), key, c.admitted)
		return append(ps, policy{name, rule, d, c}), nil, d, err
	}
	d, err := m.Limiter.Allow(r.Context(), key)
	return append(ps, policy{name: name, rule: rule, d: d}), nil, d, err
}

// decidePolicies takes one event of key under every enforced policy that matches r, all
// or none, and then, if they admit it, under each shadowed one alone.
func (m *Middleware) decidePolicies(r *http.Request, key string) ([]policy, []shadowed, Decision, error) {
	var ps []policy
	var reqs, shadowReqs []Request
	var shadowNames []string
	var shadowCharges []charge
	var store Store
	for _, p := range m.Policies {
		if p.Match != nil && !p.Match(r) {
			continue
		}
		l := p.Limiter.(algorithmBased).base() // checked by Wrap
		store = l.store
		req := Request{Key: key, N: 1, Spec: l.takes[l.priority(r.Context())]}
		var c charge
		if p.Cost != nil {
			c = admit(r.Context(), r, l, p.Cost)
			req.N = c.admitted
		}
		if p.Shadow {
			shadowReqs, shadowNames = append(shadowReqs, req), append(shadowNames, p.Name)
			shadowCharges = append(shadowCharges, c)
			continue
		}
		ps = append(ps, policy{name: p.Name, rule: l.rule, c: c})
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
		sh := shadowed{name: shadowNames[i], d: so.Decision(), latency: time.Since(start)}
		if so.Allowed() {
			sh.c = shadowCharges[i]
		}
		shadows = append(shadows, sh)
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
		if err := checkCost(fmt.Sprintf("Middleware policy %q", p.Name), p.Limiter, p.Cost); err != nil {
			return err
		}
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
