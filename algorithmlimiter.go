package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// AlgorithmLimiter is a Limiter that runs one Algorithm under one Rule on a Store, in one
// namespace. Each algorithm package's Limiter embeds it, so its methods are every
// algorithm's. It is safe for concurrent use.
//
// Limiters count together exactly when they share a store, an algorithm, a namespace and
// a key. By default the namespace is the rule's: "100/1s" for PerSecond(100). So two
// limiters of different rules never share a count. The same limiter in every instance of
// an application does, on a shared store such as Redis. Use WithNamespace when two
// limiters of the same rule must count apart (logins and password resets, both 5 an
// hour). Use it too when the rule may change and the counts should carry over.
type AlgorithmLimiter struct {
	store     Store
	alg       *Algorithm
	rule      Rule
	namespace string
	limit     int64   // the largest n the rule can ever allow
	reserves  []int64 // by priority, in percent (WithReserves); nil for none
	err       error   // an option's
	// the Specs of takes under the limiter's rule, one per reserve (one alone without
	// reserves), and under the other rules AllowRule has seen (ruleSpecs)
	takes []*core.Spec
	rules *ruleSpecs
}

var _ Limiter = (*AlgorithmLimiter)(nil)

// Option configures a limiter of any algorithm.
type Option interface{ apply(*AlgorithmLimiter) }

type optionFunc func(*AlgorithmLimiter)

func (f optionFunc) apply(l *AlgorithmLimiter) { f(l) }

// WithNamespace puts the limiter's keys in namespace instead of the rule's. Name every
// limiter's namespace. Without one, a limiter whose rule changes starts every key from
// full. During a rolling deploy, instances on the old rule and on the new one then count
// apart. Between them, they admit up to twice the limit. A name also keeps two limiters of
// one rule apart (logins and password resets, both 5 an hour). Any string is a
// namespace, the empty one included (see AlgorithmLimiter).
func WithNamespace(namespace string) Option {
	return optionFunc(func(l *AlgorithmLimiter) { l.namespace = namespace })
}

// NewAlgorithmLimiter validates rule for alg and returns an AlgorithmLimiter on store. If
// alg cannot enforce rule, the error wraps ErrInvalidRule. Algorithm packages call it.
// Users call the package's New.
func NewAlgorithmLimiter(store Store, alg *Algorithm, rule Rule, opts ...Option) (*AlgorithmLimiter, error) {
	if alg == nil || alg.Prepare == nil || alg.Step == nil {
		return nil, errors.New("ratelimit: nil algorithm")
	}
	if store == nil {
		return nil, errors.New(alg.Name + ": store is nil")
	}
	a, err := alg.Prepare(core.Rule(rule), 1)
	if err != nil {
		return nil, err
	}
	l := &AlgorithmLimiter{store: store, alg: alg, rule: rule, limit: a.Limit, namespace: ruleNamespace(rule)}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New(alg.Name + ": nil option")
		}
		o.apply(l)
	}
	if l.err != nil {
		return nil, fmt.Errorf("%s: %w", alg.Name, l.err)
	}
	l.rules = &ruleSpecs{}
	reserves := l.reserves
	if reserves == nil {
		reserves = []int64{0}
	}
	for _, r := range reserves {
		l.takes = append(l.takes, &core.Spec{Algorithm: alg, Namespace: l.namespace, Rule: core.Rule(rule), Reserve: r})
	}
	return l, nil
}

// Rule returns the limiter's rule, the one Allow and AllowN decide under.
func (l *AlgorithmLimiter) Rule() Rule { return l.rule }

// Namespace returns the namespace of the limiter's keys (see WithNamespace).
func (l *AlgorithmLimiter) Namespace() string { return l.namespace }

// ruleNamespace is the default namespace of a rule: "100/1s", or "100/1s/200" with a
// burst.
func ruleNamespace(r Rule) string {
	ns := strconv.FormatInt(r.Limit, 10) + "/" + r.Period.String()
	if r.Burst != 0 {
		ns += "/" + strconv.FormatInt(r.Burst, 10)
	}
	return ns
}

// Allow is AllowN with n = 1.
func (l *AlgorithmLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	if l.reserves != nil {
		return l.take(ctx, key, l.rule, 1)
	}
	o, err := l.store.Apply(ctx, core.Request{Key: key, N: 1, Spec: l.takes[0]})
	if err != nil {
		return Decision{}, err
	}
	retry, delay := waits(o)
	return Decision{Allowed: o.Allowed(), Limit: o.Limit(), Remaining: o.Remaining, RetryAfter: retry, ResetAfter: o.Reset, Delay: delay}, nil
}

// AllowN admits n events for key, all or none. If n is less than 1, or more than the rule
// allows at once (Decision.Limit), the error wraps ErrInvalidN. Nothing is then consumed.
func (l *AlgorithmLimiter) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	return l.take(ctx, key, l.rule, n)
}

// take asks the store to take n events for key under rule, at ctx's priority.
func (l *AlgorithmLimiter) take(ctx context.Context, key string, rule Rule, n int64) (Decision, error) {
	spec, err := l.takeSpec(ctx, rule, n)
	if err != nil { // the store is not asked
		return Decision{}, err
	}
	o, err := l.store.Apply(ctx, core.Request{Key: key, N: n, Spec: spec})
	if err != nil {
		return Decision{}, err
	}
	retry, delay := waits(o)
	return Decision{Allowed: o.Allowed(), Limit: o.Limit(), Remaining: o.Remaining, RetryAfter: retry, ResetAfter: o.Reset, Delay: delay}, nil
}

// waits are the RetryAfter and the Delay of o's Decision. The Decision itself is built in
// the statement that returns it (o.Decision's work, written out): built by a call and
// returned again, it would be copied through memory once more.
func waits(o core.Outcome) (retry, delay time.Duration) {
	if o.Allowed() {
		return 0, o.Wait
	}
	return o.Wait, 0
}

// takeSpec is the Spec of a take of n under rule at ctx's priority; or the error of an n
// the rule, or the priority's reserve, never allows.
func (l *AlgorithmLimiter) takeSpec(ctx context.Context, rule Rule, n int64) (*core.Spec, error) {
	p := l.priority(ctx)
	if rule == l.rule {
		if n < 1 || n > l.limit {
			return nil, badN(l.alg, rule, n)
		}
		spec := l.takes[p]
		return spec, l.fits(ctx, l.limit, n, spec.Reserve)
	}
	spec, limit, err := l.rules.get(l, rule, p)
	if err == nil && (n < 1 || n > limit) {
		err = badN(l.alg, rule, n)
	}
	if err == nil {
		err = l.fits(ctx, limit, n, spec.Reserve)
	}
	return spec, err
}

// specUnder is the Spec of a take under rule at ctx's priority, and the Decisions' Limit
// under it; the error of a rule l's algorithm refuses.
func (l *AlgorithmLimiter) specUnder(ctx context.Context, rule Rule) (*core.Spec, int64, error) {
	p := l.priority(ctx)
	if rule == l.rule {
		return l.takes[p], l.limit, nil
	}
	return l.rules.get(l, rule, p)
}

// fits is the error for n events that a request of ctx's priority, which must leave
// reserve percent of an allowance of limit, can never take: more than the allowance less
// its reserve; nil when it can.
func (l *AlgorithmLimiter) fits(ctx context.Context, limit, n, reserve int64) error {
	if reserve == 0 {
		return nil
	}
	if keep := mathx.Keep(limit, reserve); n > limit-keep {
		return fmt.Errorf("%s: n = %d: %w: a request of priority %v may take at most %d of %d, leaving %d%% to more important ones",
			l.alg.Name, n, ErrInvalidN, PriorityFrom(ctx), limit-keep, limit, reserve)
	}
	return nil
}

// AllowRule is AllowN under rule instead of the limiter's own. It is for a rule chosen
// per call, such as a tenant's plan looked up per request. The key is counted in the
// limiter's namespace whatever the rule. So a key whose rule changes keeps its count.
// Give such a limiter a namespace with WithNamespace. An invalid rule returns an error
// wrapping ErrInvalidRule. An n the rule cannot allow returns one wrapping ErrInvalidN.
// Neither consumes anything.
func (l *AlgorithmLimiter) AllowRule(ctx context.Context, key string, rule Rule, n int64) (Decision, error) {
	return l.take(ctx, key, rule, n)
}

// ruleSpecs are the Specs of takes under rules other than the limiter's own (AllowRule),
// by rule and priority, each made once, up to maxRuleSpecs of them; past that, a take
// under a rule not among them makes its Spec anew.
type ruleSpecs struct {
	last atomic.Pointer[ruleSpec] // the latest asked for, which the next take most often wants again
	m    sync.Map                 // ruleSpecKey -> *ruleSpec
	n    atomic.Int64
}

const maxRuleSpecs = 4096

type ruleSpecKey struct {
	rule     Rule
	priority int
}

type ruleSpec struct {
	ruleSpecKey
	spec  *core.Spec
	limit int64 // Args.Limit under the rule
}

// get is the Spec of a take under rule at the priority p of l, and its Decisions' Limit;
// the error of a rule l's algorithm refuses.
func (rs *ruleSpecs) get(l *AlgorithmLimiter, rule Rule, p int) (*core.Spec, int64, error) {
	k := ruleSpecKey{rule, p}
	if r := rs.last.Load(); r != nil && r.ruleSpecKey == k {
		return r.spec, r.limit, nil
	}
	if v, ok := rs.m.Load(k); ok {
		r := v.(*ruleSpec)
		rs.last.Store(r)
		return r.spec, r.limit, nil
	}
	a, err := l.alg.Prepare(core.Rule(rule), 1)
	if err != nil {
		return nil, 0, err
	}
	r := &ruleSpec{k, &core.Spec{Algorithm: l.alg, Namespace: l.namespace, Rule: core.Rule(rule), Reserve: l.takes[p].Reserve}, a.Limit}
	if rs.n.Load() < maxRuleSpecs {
		if v, loaded := rs.m.LoadOrStore(k, r); loaded {
			r = v.(*ruleSpec)
		} else {
			rs.n.Add(1)
		}
	}
	rs.last.Store(r)
	return r.spec, r.limit, nil
}

// badN is the error for an n out of range of rule, as Prepare, the one place that words
// it, has it.
func badN(alg *Algorithm, rule Rule, n int64) error {
	_, err := alg.Prepare(core.Rule(rule), n)
	if err == nil { // cannot happen for an n out of range; never return a nil error here
		err = fmt.Errorf("%s: n = %d: %w", alg.Name, n, ErrInvalidN)
	}
	return err
}

// PeekN returns the Decision AllowN(ctx, key, n) would give now, at ctx's priority. It
// consumes nothing.
func (l *AlgorithmLimiter) PeekN(ctx context.Context, key string, n int64) (Decision, error) {
	return l.do(ctx, key, n, core.OpPeek)
}

// Charge admits n events for key as AllowN does. When it admits them, it also returns
// their Charge. Settle the Charge once the request's real cost is known. That may be a
// completion's tokens, the rows a query scanned, or nothing if the upstream failed. Admit
// on an estimate, then Settle the truth:
//
//	c, d, err := tokens.Charge(ctx, apiKey, estimate)
//	if err != nil || c == nil {
//		// denied (d.RetryAfter says when to come back), or the store failed
//	}
//	... // serve the request
//	c.Settle(ctx, used) // debits what it cost beyond the estimate, refunds what it did not use
//
// The Charge is nil when the events were denied, and its Settle then does nothing. The
// errors are AllowN's.
func (l *AlgorithmLimiter) Charge(ctx context.Context, key string, n int64) (*Charge, Decision, error) {
	return l.charge(ctx, key, l.rule, n)
}

func (l *AlgorithmLimiter) charge(ctx context.Context, key string, rule Rule, n int64) (*Charge, Decision, error) {
	spec, err := l.takeSpec(ctx, rule, n)
	if err != nil { // the store is not asked
		return nil, Decision{}, err
	}
	receipt := &core.Receipt{}
	o, err := l.store.Apply(ctx, core.Request{Key: key, N: n, Spec: spec, Receipt: receipt})
	if err != nil {
		return nil, Decision{}, err
	}
	d := decisionOf(o)
	if !d.Allowed {
		return nil, d, nil
	}
	return &Charge{store: l.store, key: key, spec: spec, receipt: receipt, n: n}, d, nil
}

// Charge holds the events a limiter admitted for a key (AlgorithmLimiter.Charge), until
// their real cost is settled. It is safe for concurrent use. A nil Charge holds nothing.
type Charge struct {
	store   Store
	key     string
	spec    *core.Spec // of the take
	receipt *core.Receipt
	n       int64
	state   atomic.Int32 // open, settling or settled
	tried   int64        // 1 + the cost of an attempt that failed, 0 for none: its settling's alone
}

// The states of a Charge: a Settle moves it from open to settling, then to settled, or
// back to open when its store failed.
const (
	chargeOpen int32 = iota
	chargeSettling
	chargeSettled
)

// Settle charges the key what the request really cost. A Charge is settled once. A cost
// above the events admitted takes the rest as a debit (see AlgorithmLimiter.Debit). The
// key may then go into debt, and it denies until the debt is repaid. A cost below the
// events admitted gives the difference back. The same cost changes nothing.
//
// A refund never creates allowance. It gives back only what the key would still hold,
// had the take been smaller from the start. Each algorithm's package says what that is.
// For example, a window that is over gives nothing back, and neither does a bucket that
// has been full since.
//
// The Decision is the key's after the settlement, for a request of 1. After a debit, it
// is the debit's Decision. Otherwise it is a peek's, after any refund.
//
// The cost must be between 0 and 2^52, or the error wraps ErrInvalidN and nothing is
// settled. Settling a Charge that is settled already returns an error. So does a debit
// on an algorithm that takes no debts, such as the leaky bucket or the sliding log. That
// error wraps errors.ErrUnsupported.
//
// If the store fails, the charge stays unsettled. Settle may then be called again at the
// same cost. The failed attempt may have landed, with its reply lost on the way back. The
// next call is then a retry, which redisstore applies only if the first did not land. A
// retry at another cost is an error.
func (c *Charge) Settle(ctx context.Context, cost int64) (Decision, error) {
	if c == nil {
		return Decision{}, nil
	}
	if cost < 0 || cost > mathx.MaxExact {
		return Decision{}, fmt.Errorf("%s: settling a cost of %d: %w: want 0 to %d", c.spec.Algorithm.Name, cost, ErrInvalidN, int64(mathx.MaxExact))
	}
	if cost > c.n && c.spec.Algorithm.Debit == nil {
		return Decision{}, fmt.Errorf("%s: a cost of %d above the %d admitted: %w: it takes no debts", c.spec.Algorithm.Name, cost, c.n, errors.ErrUnsupported)
	}
	if !c.state.CompareAndSwap(chargeOpen, chargeSettling) {
		return Decision{}, fmt.Errorf("%s: a charge of key %q settled twice", c.spec.Algorithm.Name, c.key)
	}
	if c.tried != 0 && c.tried != cost+1 {
		c.state.Store(chargeOpen)
		return Decision{}, fmt.Errorf("%s: a charge of key %q settled at %d, after an attempt at %d that may have landed: %w: settle it again at %d",
			c.spec.Algorithm.Name, c.key, cost, c.tried-1, ErrInvalidN, c.tried-1)
	}
	// a debit names the take it settles (its receipt), as a refund does
	req := core.Request{Key: c.key, Spec: core.WithOp(c.spec, core.OpDebit), N: cost - c.n, Receipt: c.receipt}
	switch {
	case cost == c.n:
		req.Spec, req.N, req.Receipt = core.WithOp(c.spec, core.OpPeek), 1, nil
	case cost < c.n:
		req.Spec, req.N = core.WithOp(c.spec, core.OpRefund), c.n-cost
		req.Spec.Reserve = 0
	}
	req.Spec.Retry = c.tried != 0 && cost != c.n
	o, err := c.store.Apply(ctx, req)
	if err != nil {
		if !errors.Is(err, ErrInvalidN) && !errors.Is(err, ErrInvalidRule) {
			c.tried = cost + 1 // it may have landed
		}
		c.state.Store(chargeOpen)
		return Decision{}, err
	}
	c.state.Store(chargeSettled)
	return decisionOf(o), nil
}

// Debit takes n events from key whatever it has left, even past zero. It is for a cost
// known only once a request was served. Examples are the tokens of a completion, the
// bytes streamed, or the rows scanned. The debit comes after the answer, on top of the
// estimate the request was admitted on. A key in debt denies until it has earned the
// debt back, with the exact RetryAfter. A debit may exceed the rule's Limit, up to 2^52.
//
// The Decision is the key's after the debit, for a request of 1 at ctx's priority.
// Allowed is false if the debit left the key in debt. It is also false if the debit left
// the key inside the reserve kept for more important requests (WithReserves). RetryAfter
// then says when such a request is admitted again.
//
// The leaky bucket, the sliding log and the in-flight limit take no debts. For them,
// Debit returns an error wrapping errors.ErrUnsupported, without asking the store.
func (l *AlgorithmLimiter) Debit(ctx context.Context, key string, n int64) (Decision, error) {
	if l.alg.Debit == nil {
		return Decision{}, fmt.Errorf("%s: a debit: %w: it takes no debts", l.alg.Name, errors.ErrUnsupported)
	}
	spec := core.WithOp(l.takes[l.priority(ctx)], core.OpDebit)
	o, err := l.store.Apply(ctx, core.Request{Key: key, N: n, Spec: spec})
	if err != nil {
		return Decision{}, err
	}
	return decisionOf(o), nil
}

// AllowAtMost admits as many of n events for key as it has left, from none to n. It
// returns how many it granted: a batch consumer's "up to n". It decides in one atomic
// step on the store, at ctx's priority. It leaves alone what WithReserves keeps back for
// more important requests. The n asked for may exceed the rule's Limit, up to 2^52. An n
// less than 1 or more than 2^52 returns an error wrapping ErrInvalidN.
//
// The Decision is the key's after the grant. Allowed is true when granted is above 0.
// When none is granted, RetryAfter is the time until one event would be.
//
// AllowAtMost needs a store that lends: localstore, redisstore or fallback. It also needs
// an algorithm that lends: the token bucket, the windows or the calendar quotas.
// Otherwise it returns an error wrapping errors.ErrUnsupported, without asking the store.
func (l *AlgorithmLimiter) AllowAtMost(ctx context.Context, key string, n int64) (granted int64, d Decision, err error) {
	lender, ok := l.store.(core.Lender)
	if !ok || !l.alg.Lendable {
		return 0, Decision{}, fmt.Errorf("%s: AllowAtMost: %w: the store (%T) or the algorithm does not lend", l.alg.Name, errors.ErrUnsupported, l.store)
	}
	if n < 1 || n > mathx.MaxExact {
		return 0, Decision{}, fmt.Errorf("%s: AllowAtMost of %d: %w: want 1 to %d", l.alg.Name, n, ErrInvalidN, int64(mathx.MaxExact))
	}
	lent, err := lender.Lend(ctx, []core.Loan{{Key: key, Spec: l.takes[l.priority(ctx)], Want: n, Share: 1}})
	if err != nil {
		return 0, Decision{}, err
	}
	return lent[0].N, decisionOf(lent[0].Outcome), nil
}

// Reset forgets key: its next decision sees it full (after a successful login, say).
func (l *AlgorithmLimiter) Reset(ctx context.Context, key string) error {
	_, err := l.do(ctx, key, 1, core.OpReset)
	return err
}

func (l *AlgorithmLimiter) do(ctx context.Context, key string, n int64, op core.Op) (Decision, error) {
	if n < 1 || n > l.limit {
		return Decision{}, badN(l.alg, l.rule, n)
	}
	spec := core.WithOp(l.takes[0], op)
	if op == core.OpPeek {
		spec.Reserve = l.takes[l.priority(ctx)].Reserve
	} else {
		spec.Reserve = 0
	}
	o, err := l.store.Apply(ctx, core.Request{Key: key, N: n, Spec: spec})
	if err != nil {
		return Decision{}, err
	}
	return decisionOf(o), nil
}

// base is how AllowAll finds the AlgorithmLimiter inside an algorithm's
// Limiter.
func (l *AlgorithmLimiter) base() *AlgorithmLimiter { return l }
