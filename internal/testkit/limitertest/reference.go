package limitertest

import (
	"fmt"
	"sort"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Reference is the allowance property's reference for a test of its own: a decorator
// whose decisions come from memory (Leases) admits events the store counted earlier, when
// it lent them, and is held where its decisions must hold all the same. It knows every
// admission's true cost, placed at its decision's instant, on a clock that never goes
// back. A window (fixed or sliding) admits no more than the rule, nor does a sliding
// window's estimate at an admission exceed it; a bucket admits no more from any mark on
// than its capacity and its rate since, plus what the instances held at the mark and
// were given back since of takes made before it. Beyond those, only the debts, and in a
// segment's windows what the instances held when it began or were given back of an
// earlier segment's takes.
type Reference struct {
	name  string
	rules [2]ratelimit.Rule
	keys  map[string]*keyModel
	start int64
	trust int64 // see Trust
}

// Trust allows n events beyond the rule in every interval of a bucket and every window:
// the most the instances admit at a time before the store counted them (hotkey's
// WithTrust, times the instances), which the key then owes.
func (r *Reference) Trust(n int64) { r.trust = n }

// mark is an instant a test knew what the instances held of a key (on loan, spendable
// without asking the store), and the events given back to them since of takes made
// before it.
type mark struct {
	at, held, back int64
}

// NewReference is a Reference of the algorithm named (a Kind's Name) under two rules of
// one period; every key begins at start, under the first, its instances holding nothing.
func NewReference(name string, rules [2]ratelimit.Rule, start time.Time) *Reference {
	return &Reference{name: name, rules: rules, keys: map[string]*keyModel{}, start: start.UnixMicro()}
}

func (r *Reference) key(k string) *keyModel {
	m := r.keys[k]
	if m == nil {
		m = &keyModel{segments: []segment{{marks: []mark{{at: r.start}}}}}
		r.keys[k] = m
	}
	return m
}

func (m *keyModel) last() *segment { return &m.segments[len(m.segments)-1] }

// Admit records an admission of key at at (microseconds, no earlier than any before), of
// cost its true cost, over of it above what it was admitted on (a debt).
func (r *Reference) Admit(key string, at, cost, over int64) {
	m := r.key(key)
	m.last().as = append(m.last().as, admission{at: at, cost: cost, over: over})
}

// Restart begins a segment of key at at under rule (an index of the rules): a reset, or
// a change of the key's rule, when the instances held held of it.
func (r *Reference) Restart(key string, at int64, rule int, held int64) {
	m := r.key(key)
	m.rule = rule
	m.segments = append(m.segments, segment{rule: rule, carry: held, marks: []mark{{at: at, held: held}}})
}

// Mark records that the instances held held of key at at.
func (r *Reference) Mark(key string, at, held int64) {
	sg := r.key(key).last()
	sg.marks = append(sg.marks, mark{at: at, held: held})
}

// Refunded records that n events of a take of key made at takenAt were given back now
// (after every admission so far): to the store, or to the lease of an instance, which
// may admit them again.
func (r *Reference) Refunded(key string, takenAt, n int64) {
	sg := r.key(key).last()
	for i := range sg.marks {
		if sg.marks[i].at > takenAt {
			sg.marks[i].back += n
		}
	}
	if takenAt < sg.marks[0].at {
		sg.carry += n
	}
}

// Rule is the index of key's rule now.
func (r *Reference) Rule(key string) int { return r.key(key).rule }

// Check is what the admissions break of the bounds, or "". It checks each admission as
// the end of its intervals once.
func (r *Reference) Check() string {
	p := r.rules[0].Period.Microseconds()
	for k, m := range r.keys {
		for s := range m.segments {
			sg := &m.segments[s]
			rule := r.rules[sg.rule]
			msg := checkWindows(r.name, p, rule, sg.as, sg.carry+r.trust)
			if msg == "" && (r.name == "tokenbucket" || r.name == "leakybucket") {
				msg = checkLeasedBucket(sg, rule, r.trust)
			}
			if msg != "" {
				return fmt.Sprintf("key %s, segment %d: %s", k, s, msg)
			}
		}
	}
	return ""
}

// checkLeasedBucket holds each admission of sg not checked yet, as the end of an interval
// from each of sg's marks before it, to the bucket's capacity and its rate over the
// interval, plus what the instances held at the mark and were given back since, the
// debts of the interval's requests, and trust.
func checkLeasedBucket(sg *segment, rule ratelimit.Rule, trust int64) string {
	limit, capacity, p := rule.Limit, core.Capacity(core.Rule(rule)), rule.Period.Microseconds()
	// sums of cost and of debts of sg.as[:i], for any interval's in constant time
	costs, debts := make([]int64, len(sg.as)+1), make([]int64, len(sg.as)+1)
	for i, a := range sg.as {
		costs[i+1], debts[i+1] = costs[i]+a.cost, debts[i]+a.over
	}
	for j := sg.checked; j < len(sg.as); j++ {
		end := sg.as[j].at
		for _, mk := range sg.marks {
			if mk.at > end {
				break
			}
			i := sort.Search(len(sg.as), func(i int) bool { return sg.as[i].at >= mk.at })
			sum, extra := costs[j+1]-costs[i], debts[j+1]-debts[i]+mk.held+mk.back+trust
			if sum*p > (capacity+extra)*p+limit*(end-mk.at) {
				return fmt.Sprintf("%d admitted from %v to %v; at most %d, %d held then and given back since, %d of debts, %d on trust, and %d per %v over it",
					sum, time.Duration(mk.at)*time.Microsecond, time.Duration(end)*time.Microsecond,
					capacity, mk.held+mk.back, debts[j+1]-debts[i], trust, limit, rule.Period)
			}
		}
	}
	sg.checked = len(sg.as)
	return ""
}
