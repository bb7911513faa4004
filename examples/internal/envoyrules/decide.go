package envoyrules

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Status is the answer for one descriptor of a request.
type Status struct {
	Match      *Match // the limit it fell under; nil for none (none found, unlimited or replaced)
	Unlimited  bool
	OverLimit  bool          // the limit denies it (never in shadow mode)
	Remaining  uint32        // what the limit has left; math.MaxUint32 when unlimited
	ResetAfter time.Duration // until the limit is whole again
	Hits       Hits          // what this decision adds to the rule's metrics

	receipt *core.Receipt // of its take, for the refund of a request denied after all
}

// Hits are the service's counters of one rule, for one decision: every hit, and those
// within the limit, near it (past the near-limit ratio), over it, and over it in shadow
// mode (counted over and shadow, and answered OK).
type Hits struct {
	Total, Within, Near, Over, Shadow uint64
}

// Result is the answer for a request.
type Result struct {
	OverLimit bool // the request is denied
	Statuses  []Status
}

// Tightest is the status the rate limit headers describe, as the service picks it: the
// last descriptor over its limit, else the limited one with the least remaining.
func (r Result) Tightest() (Status, bool) {
	best, found, over := Status{}, false, false
	for _, s := range r.Statuses {
		switch {
		case s.Match == nil:
		case s.OverLimit:
			best, found, over = s, true, true
		case !over && (!found || s.Remaining < best.Remaining):
			best, found = s, true
		}
	}
	return best, found
}

// Decider decides requests' descriptors on a store.
type Decider struct {
	Store ratelimit.Store
	// NearLimitRatio is the part of a limit past which hits count as near it; 0.8 when 0,
	// as in the service.
	NearLimitRatio float64
	// Clock tells the time until a window ends, for hits that can never fit its limit
	// (see untilWindowEnds); nil is the system's clock.
	Clock clock.Clock
}

// Namespace is the namespace of a domain's limits on the store.
func Namespace(domain string) string { return "envoy/" + domain }

// Decide decides descriptors of domain d with hits each (0 counts as 1, as in the
// service), all or none: every limited descriptor's limit is taken in one atomic
// decision where the store can (core.ApplyAll), and a request that one of them
// denies consumes nothing from the others. As in the service: unlimited descriptors and
// those without a limit are OK; a rule named in another matched rule's replaces is not
// applied; quota-mode descriptors deny the request only when every one of them is over
// (then nothing is consumed either); shadow-mode descriptors are decided and counted
// after the others, and never deny. An error is the store's.
func (dc *Decider) Decide(ctx context.Context, d *Domain, descriptors [][]Entry, hits uint32) (Result, error) {
	n := int64(max(1, hits))
	res := Result{Statuses: make([]Status, len(descriptors))}
	replaced := map[string]bool{}
	for i, desc := range descriptors {
		m := d.Match(desc)
		if m == nil {
			continue
		}
		for _, r := range m.Replaces {
			replaced[r] = true
		}
		if m.Unlimited {
			res.Statuses[i] = Status{Unlimited: true, Remaining: math.MaxUint32}
			continue
		}
		res.Statuses[i].Match = m
	}
	var enforced, quota, shadow []int
	for i := range res.Statuses {
		switch m := res.Statuses[i].Match; {
		case m == nil:
		case m.Name != "" && replaced[m.Name]:
			res.Statuses[i].Match = nil
		case m.ShadowMode:
			shadow = append(shadow, i)
		case m.QuotaMode:
			quota = append(quota, i)
		default:
			enforced = append(enforced, i)
		}
	}
	taken, ok, err := dc.takeAll(ctx, &res, enforced, n)
	if err != nil {
		return Result{}, err
	}
	if ok && len(quota) > 0 {
		over := 0
		for _, i := range quota {
			if err := dc.decide(ctx, &res.Statuses[i], n, core.OpTake); err != nil {
				return Result{}, err
			}
			if res.Statuses[i].OverLimit {
				over++
			} else {
				taken = append(taken, i)
			}
		}
		if over == len(quota) { // every quota descriptor is over: the request is, and gives back
			ok = false
			for _, i := range taken {
				if err := dc.decide(ctx, &Status{Match: res.Statuses[i].Match, receipt: res.Statuses[i].receipt}, n, core.OpRefund); err != nil {
					return Result{}, err
				}
			}
		}
	} else {
		for _, i := range quota {
			if err := dc.decide(ctx, &res.Statuses[i], n, core.OpPeek); err != nil {
				return Result{}, err
			}
		}
	}
	op := core.OpTake
	if !ok {
		op = core.OpPeek
	}
	for _, i := range shadow {
		if err := dc.decide(ctx, &res.Statuses[i], n, op); err != nil {
			return Result{}, err
		}
	}
	res.OverLimit = !ok
	return res, nil
}

// takeAll takes n under the limits of the statuses at idx, all or none, and reports the
// indexes taken and whether all were allowed.
func (dc *Decider) takeAll(ctx context.Context, res *Result, idx []int, n int64) ([]int, bool, error) {
	if len(idx) == 0 {
		return nil, true, nil
	}
	type counter struct {
		alg *ratelimit.Algorithm
		key string
	}
	var reqs []core.Request
	of := make([]int, len(idx)) // the request of each status; two descriptors of one counter share one
	seen := map[counter]int{}
	doomed := false // a limit of 0, or hits more than the limit can hold: denied without asking
	for j, i := range idx {
		m := res.Statuses[i].Match
		c := counter{alg: m.Algorithm, key: m.Key}
		if r, dup := seen[c]; dup {
			of[j] = r
			reqs[r].N += n
		} else {
			seen[c], of[j] = len(reqs), len(reqs)
			reqs = append(reqs, core.Request{Key: m.Key, N: n, Spec: &core.Spec{Algorithm: m.Algorithm, Namespace: m.namespace, Rule: core.Rule(m.Rule)},
				Receipt: &core.Receipt{}})
		}
	}
	for j, i := range idx {
		if r := reqs[of[j]]; neverFits(r.Spec.Algorithm, ratelimit.Rule(r.Spec.Rule), r.N) {
			doomed = true
			res.Statuses[i].deny(n)
			res.Statuses[i].ResetAfter = dc.untilWindowEnds(ratelimit.Rule(r.Spec.Rule))
		}
	}
	var ds []ratelimit.Decision
	var err error
	asked := make([]int64, len(reqs)) // the n each decision was asked for
	if doomed {                       // only what each stands at, for its status
		ds = make([]ratelimit.Decision, len(reqs))
		for k, r := range reqs {
			if r.Spec.Rule.Limit == 0 || neverFits(r.Spec.Algorithm, ratelimit.Rule(r.Spec.Rule), r.N) {
				continue
			}
			r.Spec.Op, r.N = core.OpPeek, 1
			asked[k] = 1
			if ds[k], err = decision(ctx, dc.Store, r); err != nil {
				return nil, false, err
			}
		}
	} else {
		os, err := core.ApplyAll(ctx, dc.Store, reqs)
		if err != nil {
			return nil, false, err
		}
		ds = make([]ratelimit.Decision, len(os))
		for k, o := range os {
			ds[k] = decisionOf(o)
		}
		for k, r := range reqs {
			asked[k] = r.N
		}
	}
	all := !doomed
	for _, d := range ds {
		all = all && d.Allowed
	}
	var taken []int
	for j, i := range idx {
		s := &res.Statuses[i]
		if s.OverLimit { // doomed above
			continue
		}
		d := ds[of[j]]
		if !all && d.Allowed {
			// the request is denied and nothing was taken: what this limit has left is
			// what it had, not what a take would have left (ApplyAll's answer)
			d.Remaining = min(d.Limit, d.Remaining+asked[of[j]])
		}
		s.record(d, n, dc.ratio())
		if all {
			s.receipt = reqs[of[j]].Receipt // two descriptors of one counter share its take
			taken = append(taken, i)
		}
	}
	return taken, all, nil
}

// untilWindowEnds is the time until the window of rule now ends, windows aligned to
// multiples of its period since the Unix epoch, as the service's and fixedwindow's are:
// when a request's hits can never fit, the service still says when its limit is whole.
func (dc *Decider) untilWindowEnds(rule ratelimit.Rule) time.Duration {
	if rule.Period <= 0 {
		return 0
	}
	now := time.Now()
	if dc.Clock != nil {
		now = dc.Clock.Now()
	}
	return rule.Period - time.Duration(now.UnixNano()%int64(rule.Period))
}

// decide applies op with n under s's limit, and records the outcome in s.
func (dc *Decider) decide(ctx context.Context, s *Status, n int64, op core.Op) error {
	m := s.Match
	if neverFits(m.Algorithm, m.Rule, n) {
		if op != core.OpRefund { // a refund of what was never taken: nothing to give back
			s.deny(n)
			s.ResetAfter = dc.untilWindowEnds(m.Rule)
		}
		return nil
	}
	req := core.Request{Key: m.Key, N: n, Spec: &core.Spec{Algorithm: m.Algorithm, Namespace: m.namespace, Rule: core.Rule(m.Rule), Op: op}}
	switch op {
	case core.OpTake: // a take, which a request denied after all gives back
		s.receipt = &core.Receipt{}
		req.Receipt = s.receipt
	case core.OpRefund:
		req.Receipt = s.receipt
	}
	d, err := decision(ctx, dc.Store, req)
	if err != nil || op == core.OpRefund {
		return err
	}
	s.record(d, n, dc.ratio())
	return nil
}

// decision is store's answer to req as a Decision.
func decision(ctx context.Context, store ratelimit.Store, req core.Request) (ratelimit.Decision, error) {
	o, err := store.Apply(ctx, req)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	return decisionOf(o), nil
}

// decisionOf is the Decision o stands for.
func decisionOf(o core.Outcome) ratelimit.Decision {
	var d ratelimit.Decision
	d.Allowed, d.Limit, d.Remaining, d.Delay, d.RetryAfter, d.ResetAfter = o.Split()
	return d
}

// neverFits reports whether n hits can never be admitted under rule: a limit of 0 (the
// service's way to deny everything), or more hits than the limit can ever hold.
func neverFits(alg *ratelimit.Algorithm, rule ratelimit.Rule, n int64) bool {
	if rule.Limit == 0 {
		return true
	}
	_, err := alg.Prepare(core.Rule(rule), n)
	return n >= 1 && errors.Is(err, ratelimit.ErrInvalidN)
}

func (dc *Decider) ratio() float64 {
	if dc.NearLimitRatio <= 0 {
		return 0.8
	}
	return dc.NearLimitRatio
}

// deny records n hits over s's limit, decided without the store.
func (s *Status) deny(n int64) {
	s.Hits.Total += uint64(n)
	s.Hits.Over += uint64(n)
	if s.Match.ShadowMode {
		s.Hits.Shadow += uint64(n)
	} else {
		s.OverLimit = true
	}
}

// record sets s from the store's Decision for n hits, and counts them.
func (s *Status) record(d ratelimit.Decision, n int64, ratio float64) {
	s.Remaining = uint32(min(d.Remaining, math.MaxUint32))
	s.ResetAfter = d.ResetAfter
	if s.ResetAfter == 0 && !d.Allowed {
		s.ResetAfter = d.RetryAfter
	}
	if !d.Allowed {
		s.deny(n)
		return
	}
	s.Hits.Total += uint64(n)
	s.Hits.Within += uint64(n)
	near := int64(math.Floor(float64(d.Limit) * ratio))
	if used := d.Limit - d.Remaining; used > near {
		s.Hits.Near += uint64(min(n, used-near))
	}
}
