package limitertest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// RunAllowance runs the property that every store and decorator must hold, the library's
// first promise, alone: nothing creates allowance. Run runs it too, with the rest of the
// suite; a decorator whose decisions differ from the exact ones (a Shard of several, Leases)
// runs it alone.
func RunAllowance(t *testing.T, newStore NewStore) {
	t.Run("nothing creates allowance", func(t *testing.T) { testNoAllowance(t, newStore) })
}

// testNoAllowance drives random sequences through two limiters of one algorithm and one
// namespace (two rules of one period: a key's rule changes now and then), on two keys:
// takes (each with a receipt), charges settled any time later at the cost the request
// really had (0, part of the estimate, all of it, or more: a debit), partial takes,
// debits, resets, and a clock that moves forward by small and large steps and back by
// less and more than a period. A reference that knows every admission's true cost from
// the start places each where the store counted it, in the key's own time: the instant
// its receipt holds (a partial take, without one, at the key's latest instant or now),
// and requires that the admitted total never exceed what the rule allows, in any window
// of the algorithm (a fixed window's count, the sliding window counter's estimate at each
// admission, the sliding log's any period, a bucket's capacity plus its rate over any
// interval), by more than the documented bounds: the debt of the requests admitted on an
// estimate that cost more (not yet charged when the later ones were admitted), and one
// more allowance for admissions on each side of a moment the key's time went back (the
// clock rule's one period: a clock stepped back by more than a period moves the key's
// history back, and a key a store forgot as worth nothing counts from the caller's clock,
// not its latest instant). A reset starts the reference anew, as it does the key, and so
// does a change of the key's rule: from then on the key admits no more than the new
// rule's allowance (its burst, and its rate since the change). An in-flight limit on the
// same store, acquired, released and extended meanwhile, never holds more leases than its
// limit.
func testNoAllowance(t *testing.T, newStore NewStore) {
	runs := uint64(4 * len(allowanceRules)) // enough to find each hole the test was made against in this many
	if n, err := strconv.ParseUint(os.Getenv("RATELIMIT_ALLOWANCE_RUNS"), 10, 64); err == nil && n > runs {
		runs = n // a longer search, by hand
	}
	for _, k := range Kinds {
		t.Run(k.Name, func(t *testing.T) {
			for seed := range runs {
				runAllowance(t, newStore, k, seed)
			}
		})
	}
	t.Run("in flight", func(t *testing.T) {
		for seed := range uint64(3) {
			runInFlightAllowance(t, newStore, seed)
		}
	})
}

// allowanceRules are the pairs of rules of a key (one period each), one per run in turn
// (more runs by hand: RATELIMIT_ALLOWANCE_RUNS=300).
var allowanceRules = [][2]ratelimit.Rule{
	{ratelimit.PerSecond(10), {Limit: 4, Period: time.Second, Burst: 6}},
	{ratelimit.PerMinute(7), {Limit: 20, Period: time.Minute, Burst: 25}},
	{{Limit: 5, Period: 2 * time.Second, Burst: 8}, {Limit: 3, Period: 2 * time.Second}},
	{ratelimit.PerHour(1000), ratelimit.PerHour(100)},
}

// Handovers is a store whose decisions change hands (a fallback whose primary goes away
// and comes back, each store counting only what it admitted): how many times they have
// so far. The allowance property allows one more allowance per handover, the documented
// bound of such a store.
type Handovers interface {
	Handovers() int64
}

// admission is one admission the reference knows: where the store counted it in the key's
// time, what it really cost, the part of that cost above what it was admitted on (a debt
// charged later), and the key's era: a new one begins each time the key's time goes back.
type admission struct {
	at, cost, over int64
	era            int
}

// keyModel is the reference's view of one key: the latest instant a receipt of it held and
// its era, the rule it is decided under now (of the two), and the admissions of each of
// its segments (a reset or a change of rule starts one), under each one's rule.
type keyModel struct {
	latest   int64
	seen     int64 // the latest instant of the clock an operation of the key was sent at
	era      int
	stepped  int // the clock's step back that began the key's era, if any
	rule     int
	segments []segment
}

type segment struct {
	rule int
	as   []admission
	// for a Reference: the events the store may admit in it beyond its rule (what
	// instances held when it began, and refunds given back to them of earlier takes), its
	// marks (its start the first), and the admissions checked so far
	carry   int64
	marks   []mark
	checked int
}

// admit records an admission counted at at, as its receipt says: an instant before the
// latest one seen begins an era (the key's time went back).
func (m *keyModel) admit(at, cost, over int64) {
	if at < m.latest {
		m.era++
	}
	m.latest = max(m.latest, at)
	if len(m.segments) == 0 {
		m.restart()
	}
	last := &m.segments[len(m.segments)-1]
	last.as = append(last.as, admission{at: at, cost: cost, over: over, era: m.era})
}

// restart starts a segment under the key's rule now.
func (m *keyModel) restart() { m.segments = append(m.segments, segment{rule: m.rule}) }

// pending is a take not settled yet (its receipt), what it admitted and under which
// rule, what its request really cost, and the step that took it.
type pending struct {
	key     string
	receipt *core.Receipt
	n, cost int64
	rule    int
	step    int
}

func runAllowance(t *testing.T, newStore NewStore, k Kind, seed uint64) {
	rules := allowanceRules[seed%uint64(len(allowanceRules))]
	p := rules[0].Period.Microseconds()
	clk := clock.NewFake(Start.Add(time.Duration(seed) * 1234567 * time.Microsecond))
	store := newStore(t, clk)
	var ls [2]*ratelimit.AlgorithmLimiter
	var specs [2]*core.Spec // the takes with a receipt go to the store itself, whose receipt says where it counted them
	for i, r := range rules {
		l, err := k.New(store, r, ratelimit.WithNamespace("allowance"))
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l.(*ratelimit.AlgorithmLimiter)
		specs[i] = &core.Spec{Algorithm: k.Algorithm, Namespace: "allowance", Rule: core.Rule(r)}
	}
	lends := k.Algorithm.Lendable
	if _, ok := store.(core.Lender); !ok {
		lends = false
	}
	debits := k.Algorithm.Debit != nil
	rng := rand.New(rand.NewPCG(seed, uint64(len(k.Name))))
	keys := []string{"a", "b"}
	models := map[string]*keyModel{"a": {}, "b": {}}
	var open []pending
	steps := 0 // the clock's steps back so far
	ctx := context.Background()
	var log []string // the sequence, for a failure's message
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: "+format+"\nthe sequence:\n%s", append(append([]any{seed}, args...), joinLines(log))...)
	}
	// a store whose decisions change hands (a fallback whose primary goes and comes back)
	// says how often they did: the store that decides after a handover did not count what
	// the other admitted, one more allowance at most; an era begins for every key
	handovers := func() int64 { return 0 }
	if h, ok := store.(Handovers); ok {
		handovers = h.Handovers
	}
	handed := handovers()
	handover := func() {
		if h := handovers(); h != handed {
			handed = h
			for _, m := range models {
				m.era++
			}
		}
	}
	// the rule of a key changes when an operation decides it under the other
	under := func(key string, ri int) {
		if m := models[key]; m.rule != ri {
			m.rule = ri
			m.restart()
			log = append(log, fmt.Sprintf("  key %s now under %v", key, rules[ri]))
		}
	}
	for step := range 400 {
		switch r := rng.IntN(100); { // the clock
		case r < 30:
		case r < 70:
			clk.Advance(time.Duration(rng.Int64N(p/20+1)) * time.Microsecond)
		case r < 92:
			clk.Advance(time.Duration(rng.Int64N(p)) * time.Microsecond)
		case r < 95:
			clk.Advance(time.Duration(2*p+rng.Int64N(3*p)) * time.Microsecond)
		case r < 98:
			clk.Advance(-time.Duration(1+rng.Int64N(p/2)) * time.Microsecond)
			steps++
			log = append(log, fmt.Sprintf("  clock back to %v", clk.Now().Sub(Start)))
		default:
			clk.Advance(-time.Duration(p+rng.Int64N(3*p)) * time.Microsecond)
			steps++
			log = append(log, fmt.Sprintf("  clock back to %v", clk.Now().Sub(Start)))
		}
		// an operation of a key behind its latest instant: the store decides as at it, or
		// moves the key's history back, or counts from now a key it forgot as worth
		// nothing (at any operation since, a peek's too), and which is not known here: an
		// era begins, once per step back
		touch := func(m *keyModel) {
			if now := clk.Now().UnixMicro(); now < max(m.latest, m.seen) && m.stepped != steps {
				m.era++
				m.stepped = steps
			}
			m.seen = max(m.seen, clk.Now().UnixMicro())
		}
		key := keys[rng.IntN(len(keys))]
		m := models[key]
		ri := m.rule
		if rng.IntN(20) == 0 { // now and then, under the other rule
			ri = 1 - ri
		}
		l, rule := ls[ri], rules[ri]
		a, _ := k.Algorithm.Prepare(core.Rule(rule), 1)
		limit := a.Limit
		n := 1 + rng.Int64N(min(limit, 3))
		what := ""
		op := rng.IntN(100)
		if op < 50 || op >= 75 || len(open) == 0 {
			touch(m)
		}
		switch {
		case op < 50: // a take, which may cost less or more than it took (settled later)
			receipt := &core.Receipt{}
			o, err := store.Apply(ctx, core.Request{Key: key, N: n, Spec: specs[ri], Receipt: receipt})
			handover()
			if errors.Is(err, ratelimit.ErrInvalidN) { // more than a part of the key ever admits (a Shard's): refused, as a denial is
				err, o = nil, core.Outcome{}
			}
			if err != nil {
				fail("a take of %d: %v", n, err)
			}
			under(key, ri)
			cost := n
			if op >= 20 {
				cost = []int64{0, 0, n / 2, n, n + 1 + rng.Int64N(2*limit)}[rng.IntN(5)]
				if !debits {
					cost = min(cost, n)
				}
			}
			if o.Allowed() {
				m.admit(receipt.At, cost, max(0, cost-n))
				if cost != n {
					open = append(open, pending{key, receipt, n, cost, ri, step})
				}
			}
			what = fmt.Sprintf("take %d (costs %d) under %v: %v", n, cost, rule, o.Allowed())
		case op < 75 && len(open) > 0: // a take settled, any time later, under its own rule
			i := rng.IntN(len(open))
			pd := open[i]
			open = append(open[:i], open[i+1:]...)
			touch(models[pd.key])
			settle := core.Request{Key: pd.key, N: pd.n - pd.cost, Spec: core.WithOp(specs[pd.rule], core.OpRefund), Receipt: pd.receipt}
			if pd.cost > pd.n {
				settle = core.Request{Key: pd.key, N: pd.cost - pd.n, Spec: core.WithOp(specs[pd.rule], core.OpDebit)}
			}
			if _, err := store.Apply(ctx, settle); err != nil {
				fail("settling at %d: %v", pd.cost, err)
			}
			under(pd.key, pd.rule)
			what = fmt.Sprintf("settle %s's take of step %d at %d", pd.key, pd.step, pd.cost)
		case op < 86 && lends: // a partial take, counted at the key's latest instant or now
			want := 1 + rng.Int64N(2*limit)
			got, _, err := l.AllowAtMost(ctx, key, want)
			handover()
			if err != nil {
				fail("AllowAtMost(%d): %v", want, err)
			}
			under(key, ri)
			if got > 0 { // where it was counted is not known for sure: an era of its own
				m.era++
				m.admit(max(m.latest, clk.Now().UnixMicro()), got, 0)
				m.era++
			}
			what = fmt.Sprintf("at most %d under %v: %d", want, rule, got)
		case op < 92 && debits: // a debit: a cost, admitted nowhere
			debt := 1 + rng.Int64N(2*limit)
			if _, err := l.Debit(ctx, key, debt); err != nil {
				fail("Debit(%d): %v", debt, err)
			}
			under(key, ri)
			what = fmt.Sprintf("debit %d", debt)
		case op < 94: // a reset: the reference starts anew, as the key does
			if err := l.Reset(ctx, key); err != nil {
				fail("Reset: %v", err)
			}
			m.restart()
			what = "reset"
		default: // a peek, which changes nothing
			if _, err := l.PeekN(ctx, key, n); err != nil && !errors.Is(err, ratelimit.ErrInvalidN) {
				fail("PeekN(%d): %v", n, err)
			}
			what = fmt.Sprintf("peek %d", n)
		}
		log = append(log, fmt.Sprintf("  %3d at %v, key %s: %s", step, clk.Now().Sub(Start), key, what))
		for _, key := range keys {
			if msg := checkAllowance(k.Name, rules, models[key]); msg != "" {
				fail("key %s: %s", key, msg)
			}
		}
	}
}

// checkAllowance is what m's admissions break of the bounds of their segments' rules, or
// "".
func checkAllowance(name string, rules [2]ratelimit.Rule, m *keyModel) string {
	p := rules[0].Period.Microseconds()
	for s, sg := range m.segments {
		if msg := checkWindows(name, p, rules[sg.rule], sg.as, sg.carry); msg != "" {
			return fmt.Sprintf("segment %d: %s", s, msg)
		}
		if name != "tokenbucket" && name != "leakybucket" {
			continue
		}
		seg, rule := slices.Clone(sg.as), rules[sg.rule]
		limit, capacity := rule.Limit, core.Capacity(core.Rule(rule))
		// the buckets: their capacity, and their rate over any interval
		slices.SortStableFunc(seg, func(a, b admission) int { return cmp.Compare(a.at, b.at) })
		for i := range seg {
			for j := i; j < len(seg); j++ {
				in := seg[i : j+1]
				span := seg[j].at - seg[i].at
				sum, extra := total(in), slack(in, capacity)
				if sum*p > (capacity+extra)*p+limit*span {
					return fmt.Sprintf("segment %d: %d admitted from %v to %v; at most %d and %d per %v over it", s, sum,
						time.Duration(seg[i].at)*time.Microsecond, time.Duration(seg[j].at)*time.Microsecond, capacity+extra, limit, rule.Period)
				}
			}
		}
	}
	return ""
}

// checkWindows is what the admissions of one segment under rule (of period p, in
// microseconds) break of the windowed algorithms' bounds (a fixed window's count, the
// sliding window counter's estimate at each admission, the sliding log's any period), by
// more than their slack and carry, or "" (and "" for the buckets).
func checkWindows(name string, p int64, rule ratelimit.Rule, seg []admission, carry int64) string {
	limit := rule.Limit
	slack := func(as []admission, size int64) int64 { return slack(as, size) + carry }
	switch name {
	case "fixedwindow", "slidingwindow":
		windows := map[int64][]admission{}
		for _, a := range seg {
			w := mathx.FloorDiv(a.at, p)
			windows[w] = append(windows[w], a)
		}
		for w, as := range windows {
			if sum, allowed := total(as), limit+slack(as, limit); sum > allowed {
				return fmt.Sprintf("%d admitted in the window starting at %v; at most %d", sum, time.Duration(w*p)*time.Microsecond, allowed)
			}
			if name != "slidingwindow" {
				continue
			}
			// the estimate at each admission, of the true costs: the previous window's
			// weighed by what is left of it, in the store's ticks
			tick := int64(1)
			if p%1000 == 0 {
				tick = 1000
			}
			ticks, prev := p/tick, windows[w-1]
			sofar := int64(0)
			for _, a := range as {
				sofar += a.cost
				e := (a.at - w*p) / tick
				both := append(append([]admission{}, prev...), as...)
				if est, bound := sofar*ticks+total(prev)*(ticks-e), (limit+slack(both, limit))*ticks; est > bound {
					return fmt.Sprintf("an estimate of %d/%d at %v; at most %d", est, ticks,
						time.Duration(a.at)*time.Microsecond, limit+slack(both, limit))
				}
			}
		}
	case "slidinglog":
		for _, a := range seg {
			var in []admission
			for _, b := range seg {
				if b.at <= a.at && a.at-b.at < p {
					in = append(in, b)
				}
			}
			if sum, allowed := total(in), limit+slack(in, limit); sum > allowed {
				return fmt.Sprintf("%d admitted in the period up to %v; at most %d", sum, time.Duration(a.at)*time.Microsecond, allowed)
			}
		}
	}
	return ""
}

// total is the true cost of as.
func total(as []admission) int64 {
	var sum int64
	for _, a := range as {
		sum += a.cost
	}
	return sum
}

// slack is the documented excess of as: the debts of its requests, and one allowance
// (of size) per era of the key past the first among them.
func slack(as []admission, size int64) int64 {
	var over int64
	eras := map[int]bool{}
	for _, a := range as {
		over += a.over
		eras[a.era] = true
	}
	return over + int64(max(0, len(eras)-1))*size
}

func joinLines(lines []string) string {
	if len(lines) > 60 {
		lines = append([]string{"  ..."}, lines[len(lines)-60:]...)
	}
	out := ""
	for _, l := range lines {
		out += l + "\n"
	}
	return out
}

// runInFlightAllowance: an in-flight limit of 3 leases of 10s, acquired, released and
// extended at random while the clock moves forward and back, never holds more leases
// than 3 at once, as a model of their expiries counts them (each lost when it expires,
// none outliving its duration from now).
func runInFlightAllowance(t *testing.T, newStore NewStore, seed uint64) {
	const limit, duration = 3, 10 * time.Second
	clk := clock.NewFake(Start)
	store := newStore(t, clk)
	l, err := ratelimit.NewInFlight(store, limit, duration, ratelimit.WithNamespace("allowance"))
	if err != nil {
		t.Fatal(err)
	}
	handovers := func() int64 { return 0 }
	if h, ok := store.(Handovers); ok {
		handovers = h.Handovers
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	ctx := context.Background()
	held := map[*ratelimit.Lease]int64{}  // expiry, in microseconds
	since := map[*ratelimit.Lease]int64{} // the handovers before each was acquired
	for step := range 300 {
		switch r := rng.IntN(10); {
		case r < 6:
			clk.Advance(time.Duration(rng.Int64N(int64(4 * time.Second))))
		case r < 7:
			clk.Advance(-time.Duration(rng.Int64N(int64(6 * time.Second))))
		}
		now, d := clk.Now().UnixMicro(), duration.Microseconds()
		for x, exp := range held {
			if exp <= now {
				delete(held, x)
				delete(since, x)
			} else {
				held[x] = min(exp, now+d)
			}
		}
		var some *ratelimit.Lease
		for x := range held {
			some = x
			break
		}
		switch op := rng.IntN(10); {
		case op < 6:
			before := handovers()
			x, dec, err := l.Acquire(ctx, "k")
			if err != nil {
				t.Fatalf("seed %d, step %d: Acquire: %v", seed, step, err)
			}
			if x != nil {
				held[x], since[x] = now+d, before
			}
			// a store that changed hands while leases were held holds at most the limit
			// on each side of each handover
			first := handovers()
			for _, h := range since {
				first = min(first, h)
			}
			if allowed := limit * (1 + handovers() - first); int64(len(held)) > allowed {
				t.Fatalf("seed %d, step %d: %d leases held at once (%+v); at most %d", seed, step, len(held), dec, allowed)
			}
		case op < 8 && some != nil:
			if err := some.Release(ctx); err != nil {
				t.Fatalf("seed %d, step %d: Release: %v", seed, step, err)
			}
			delete(held, some)
			delete(since, some)
		case some != nil:
			ok, err := some.Extend(ctx)
			if err != nil {
				t.Fatalf("seed %d, step %d: Extend: %v", seed, step, err)
			}
			if ok {
				held[some] = now + d
			}
		}
	}
}
