package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/lend"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
	"github.com/ratelimit-go/ratelimit/internal/script"
)

var _ core.Lender = (*Store)(nil)

// maxLoans is the most loans one script decides: a script runs alone on its server, and
// one of thousands would hold every other client of Redis for the time it takes (a
// lease's renewal takes Redis about 17 µs, BenchmarkRedisCPU: 20 about a third of a
// millisecond).
const maxLoans = 20

// lanes is how many calls of loans go out at once to one server, and lanesUnrouted how
// many calls of a loan routed by the client (no server known).
const lanes, lanesUnrouted = 2, 4

// Lend decides loans in scripts of up to 20 loans. It sends two calls at a
// time per Redis server, a key's loans in one of the two, in order. A refill so holds
// two connections of the pool per server. No script holds Redis much more than a
// millisecond.
//
// On a *redis.ClusterClient, each master gets its own scripts, the masters in parallel.
// One script then holds the keys of several slots, which needs Redis 7's script flags.
// Elsewhere, Lend sends one call per loan, four at once. That is so on a Ring, an
// AutoPipeliner, or a cluster without script flags.
//
// A key's record of loans is a hash beside its state, in its hash slot (see WithPrefix,
// "Keys"). It has the TTL of its latest loan.
//
// A call of partial debits alone is decided as those debits, up to WithMaxBatch a
// script. Partial debits are OpDebit loans without a holder. hotkey.Leases charges them
// for events admitted on trust. Redis then spends 3.5-3.8 µs of CPU a debit
// (BENCHMARKS.md).
//
// ctx alone bounds the calls. A refill of loans is not a decision, and no decision's
// timeout applies. As with every call of the store, a loan is never sent twice.
//
// An error means nothing is known of what the loans lent or gave back. The holder's next
// numbered loan of each key settles it (Loan.Seq). Otherwise the key's record ends with
// its TTL, its events counted as spent.
func (s *Store) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.coalescing() && len(loans) > 0 && lend.Debits(loans) {
		return s.debitAll(ctx, loans)
	}
	calls, err := s.encodeLoans(loans)
	if err != nil {
		return nil, err
	}
	groups, cluster, err := s.groupLoans(ctx, calls)
	if err != nil {
		return nil, s.failed("lend", err)
	}
	out := make([]core.Lent, len(loans))
	errs := make([]error, len(groups))
	// two calls at a time per server (the servers in parallel), so that a refill of
	// thousands of loans holds two connections of the pool per server, and leaves the
	// others to decisions; a key's loans in one lane, in order
	type lane struct {
		to processor
		n  int
	}
	var byLane [][]int
	at := map[lane]int{} // a lane's place in byLane
	for i, g := range groups {
		j, ok := at[lane{g.to, g.lane}]
		if !ok {
			j = len(byLane)
			at[lane{g.to, g.lane}] = j
			byLane = append(byLane, nil)
		}
		byLane[j] = append(byLane[j], i)
	}
	var wg sync.WaitGroup
	for _, gs := range byLane {
		wg.Go(func() {
			for _, i := range gs {
				if errs[i] = s.lendOn(ctx, groups[i], cluster, out); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// loanCall is one loan as lend.lua receives it.
type loanCall struct {
	i       int // its place in the loans
	alg     *core.Algorithm
	limit   int64
	state   string        // the names of its state key and of its record
	receipt *core.Receipt // the loan's, written when it lends
	args    []any         // its arguments but its step's index (lend.lua), then its keys' names
}

// group is loans that go to one server together, in one of its lanes (see laneOf).
type group struct {
	to    processor // nil: the client's own routing, one call per loan
	lane  int
	calls []*loanCall
}

// laneSeed hashes a key's name to its lane.
var laneSeed = maphash.MakeSeed()

// laneOf is the lane of n lanes a key's loans go in, so that they are decided in order.
func laneOf(state string, n int) int { return int(maphash.String(laneSeed, state) % uint64(n)) }

// check is the error of a loan this store does not decide: lend.Check's, or an
// algorithm without a state key to lend from.
func check(l core.Loan) error {
	if err := lend.Check(l); err != nil {
		return err
	}
	if !script.ReadsState(l.Spec.Algorithm) {
		return fmt.Errorf("redisstore: %s lends no state key", l.Spec.Algorithm.Name)
	}
	return nil
}

// encodeLoans checks loans and encodes each as lend.lua reads it.
func (s *Store) encodeLoans(loans []core.Loan) ([]*loanCall, error) {
	calls := make([]*loanCall, len(loans))
	now := s.now()
	for i, l := range loans {
		if err := check(l); err != nil {
			return nil, err
		}
		alg := l.Spec.Algorithm
		a, err := lend.Args(l)
		if err != nil {
			return nil, err
		}
		k := redisx.NewKey(redisx.Namespace(l.Spec.Namespace), l.Key)
		state, book := k.Name(s.scriptOf(alg).names[0]), k.Name(redisx.Loans(s.prefix, alg.Name))
		win := int64(0)
		if alg.Windowed {
			win = a.Period
			if alg.Window != nil {
				win = -1
			}
		}
		w := s.window(alg)
		op := script.Take
		if l.Spec.Op == core.OpDebit { // a partial take's debit (lend.lua)
			op = script.Debit
		}
		v := script.Values{script.N: 1, script.Limit: a.Limit, script.Period: a.Period, script.Unit: a.Unit,
			script.Rate: a.Rate, script.Now: now, script.Op: op, script.Lease: strconv.FormatInt(l.Holder, 10),
			script.Keep: keep(l, a), script.WindowStart: w[0], script.WindowEnd: w[1], script.WindowNext: w[2], script.Taken: 0}
		var extra [lend.ArgFields]any
		extra[lend.ArgGive], extra[lend.ArgWant], extra[lend.ArgShare] = l.Give, l.Want, max(1, l.Share)
		extra[lend.ArgTTL], extra[lend.ArgRevoke], extra[lend.ArgWindow] = l.TTL.Microseconds(), 0, win
		extra[lend.ArgOut], extra[lend.ArgSeq] = l.Out, l.Seq
		if l.Revoke {
			extra[lend.ArgRevoke] = 1
		} else if l.End {
			extra[lend.ArgRevoke] = 2
		}
		extra[lend.ArgState], extra[lend.ArgBook] = state, book
		args := append(v[:], extra[:]...)
		calls[i] = &loanCall{i: i, alg: alg, limit: a.Limit, state: state, args: args, receipt: l.Receipt}
	}
	return calls, nil
}

// keep is what a loan keeps back for more important requests: a partial take's reserve
// (Holder 0); nothing for a holder's loan.
func keep(l core.Loan, a core.Args) int64 {
	if l.Holder == 0 {
		return a.Keep
	}
	return 0
}

// groupLoans groups calls by the server they go to, and says whether those are masters
// of a cluster.
func (s *Store) groupLoans(ctx context.Context, calls []*loanCall) ([]group, bool, error) {
	switch c := s.client.(type) {
	case *redis.Client:
		if s.process != nil {
			return chunks(s.process, calls), false, nil
		}
	case *redis.ClusterClient:
		if s.noFlags.Load() {
			break
		}
		var groups []group
		at := map[*redis.Client]int{}
		var byMaster [][]*loanCall
		for _, lc := range calls {
			m, err := c.MasterForKey(ctx, lc.state)
			if err != nil {
				return nil, false, err
			}
			j, ok := at[m]
			if !ok {
				j = len(byMaster)
				at[m] = j
				byMaster = append(byMaster, nil)
			}
			byMaster[j] = append(byMaster[j], lc)
		}
		for m, j := range at {
			groups = append(groups, chunks(m, byMaster[j])...)
		}
		return groups, true, nil
	}
	groups := make([]group, len(calls)) // one call per loan, routed by its key
	for i, lc := range calls {
		groups[i] = group{lane: laneOf(lc.state, lanesUnrouted), calls: []*loanCall{lc}}
	}
	return groups, false, nil
}

// chunks is calls to one server in groups of at most maxLoans: one, if they fit; else
// in its lanes, a key's calls in one.
func chunks(to processor, calls []*loanCall) []group {
	if len(calls) <= maxLoans {
		return []group{{to: to, calls: calls}}
	}
	var byLane [lanes][]*loanCall
	for _, lc := range calls {
		l := laneOf(lc.state, lanes)
		byLane[l] = append(byLane[l], lc)
	}
	var groups []group
	for l, calls := range byLane {
		for len(calls) > 0 {
			n := min(len(calls), maxLoans)
			groups = append(groups, group{to: to, lane: l, calls: calls[:n]})
			calls = calls[n:]
		}
	}
	return groups
}

// lendOn sends g's loans in one script, and writes what each lent into out.
func (s *Store) lendOn(ctx context.Context, g group, cluster bool, out []core.Lent) (err error) {
	defer clientPanic("lend", &err)
	algs := make([]*core.Algorithm, len(g.calls))
	for i, lc := range g.calls {
		algs[i] = lc.alg
	}
	compose := func(algs []*core.Algorithm) string { return lend.Script(algs, cluster) }
	sc, index := s.lends[boolIndex(cluster)].of(s, algs, "lend", compose)
	args := make([]any, 0, 4+len(g.calls)*(1+len(g.calls[0].args)))
	args = append(args, "evalsha", sc.hash, 1, g.calls[0].state) // the first key routes the call
	for _, lc := range g.calls {
		args = append(args, index[s.scriptOf(lc.alg).hash.(string)])
		args = append(args, lc.args...)
	}
	var reply any
	if g.to != nil {
		reply, err = s.runOn(ctx, g.to, sc, args)
	} else {
		reply, err = s.run(ctx, sc, args)
	}
	if err != nil {
		return s.failed("lend", err)
	}
	vals, ok := reply.([]any)
	if !ok || len(vals) != lend.Reply*len(g.calls) {
		return fmt.Errorf("%w: %v", ErrUnexpectedReply, reply)
	}
	for j, lc := range g.calls {
		var at int64
		if out[lc.i], at, err = decodeLent(vals[lend.Reply*j:lend.Reply*(j+1)], lc.limit); err != nil {
			return err
		}
		if lc.receipt != nil && at > 0 {
			lc.receipt.At = at
		}
	}
	return nil
}

// decodeLent is one loan's reply: a step's five values, then lent, for (us), kept, out,
// and the instant of its take (0: none).
func decodeLent(vals []any, limit int64) (core.Lent, int64, error) {
	o, err := decodeVals(vals[:5], limit)
	if err != nil {
		return core.Lent{}, 0, err
	}
	var n [5]int64
	for i, v := range vals[5:] {
		var ok bool
		if n[i], ok = v.(int64); !ok || n[i] < 0 {
			return core.Lent{}, 0, fmt.Errorf("%w: %v", ErrUnexpectedReply, vals)
		}
	}
	return core.Lent{Outcome: o, N: n[0], For: time.Duration(n[1]) * time.Microsecond, Kept: n[2] == 1, Out: n[3]}, n[4], nil
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// debitAll decides loans, partial debits all, as the debits they are: in the batch script
// of coalesced decisions, up to the store's batch size a call, in order. A debit needs no
// record of loans, and the batch script sends what the loans share once, where lend.lua
// reads 24 arguments a loan: Redis spent 8.3 µs of CPU a debit in lend.lua, against
// 3.5-3.8 µs here. A batch that must be decided one by one (a cluster's key
// moved, a server without script flags) goes to lend.lua.
func (s *Store) debitAll(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	calls := make([]*call, len(loans))
	now := s.now()
	for i, l := range loans {
		if err := check(l); err != nil {
			return nil, err
		}
		alg := l.Spec.Algorithm
		req := core.Request{Key: l.Key, N: l.Want, Spec: l.Spec}
		a, err := req.Args()
		if err != nil {
			return nil, err
		}
		sc := s.scriptOf(alg)
		ra := sc.args(req, a)
		calls[i] = &call{alg: alg, sc: sc, ra: ra, a: a, op: script.Debit, now: now,
			key: redisx.NewKey(ra.nsForm, req.Key), window: s.window(alg)}
	}
	// the calls by server, in order; on a cluster, by master
	var nodes []*node
	byNode := map[*node][]int{}
	for i, c := range calls {
		n, err := s.node(ctx, c)
		if err != nil {
			return nil, s.failed("lend", err)
		}
		if _, ok := byNode[n]; !ok {
			nodes = append(nodes, n)
		}
		byNode[n] = append(byNode[n], i)
	}
	out := make([]core.Lent, len(loans))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for j, n := range nodes {
		wg.Go(func() {
			at := byNode[n]
			for len(at) > 0 {
				chunk := at[:min(len(at), s.maxBatch)]
				at = at[len(chunk):]
				batch := make([]*call, len(chunk))
				for k, i := range chunk {
					batch[k] = calls[i]
				}
				rs, err := s.safeDecideBatch(ctx, n, batch)
				if errors.Is(err, errAlone) {
					if errs[j] = s.lendAlone(ctx, loans, chunk, out); errs[j] != nil {
						return
					}
					continue
				}
				if err != nil {
					errs[j] = err
					return
				}
				for k, i := range chunk {
					if rs[k].err != nil {
						errs[j] = rs[k].err
						return
					}
					out[i] = core.Lent{Outcome: rs[k].d, N: loans[i].Want}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// lendAlone decides the loans at the places at through lend.lua, and writes what each
// lent into out.
func (s *Store) lendAlone(ctx context.Context, loans []core.Loan, at []int, out []core.Lent) error {
	some := make([]core.Loan, len(at))
	for k, i := range at {
		some[k] = loans[i]
	}
	calls, err := s.encodeLoans(some)
	if err != nil {
		return err
	}
	groups, cluster, err := s.groupLoans(ctx, calls)
	if err != nil {
		return s.failed("lend", err)
	}
	got := make([]core.Lent, len(some))
	for _, g := range groups {
		if err := s.lendOn(ctx, g, cluster, got); err != nil {
			return err
		}
	}
	for k, i := range at {
		out[i] = got[k]
	}
	return nil
}
