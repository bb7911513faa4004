package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
	"github.com/ratelimit-go/ratelimit/internal/script"
)

var _ core.BatchStore = (*Store)(nil)

// MaxApplyAll is the most requests ApplyAll decides in one script. A script runs alone on
// its server, and holds every other client of Redis while it runs. A script over 5,000
// keys took 400ms. ApplyAll of more requests returns an error matching
// errors.ErrUnsupported. ratelimit.AllowAll then takes them one by one.
const MaxApplyAll = 100

// ApplyAll takes every request or none. It is one atomic script, in one round trip, in
// two cases. Either the client is a single *redis.Client, or all the keys share one hash
// tag. They do when they are one limiter key, or keys of one TaggedKey tag.
//
// Otherwise, as for keys on a Redis Cluster that may sit on different nodes, ApplyAll
// counts nothing. It returns an error matching errors.ErrUnsupported, never a CROSSSLOT
// error. ratelimit.AllowAll then takes the requests one by one.
//
// Its other errors are Apply's. A key named twice is an error wrapping
// ratelimit.ErrDuplicateKey.
func (s *Store) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(reqs) > MaxApplyAll {
		return nil, fmt.Errorf("redisstore: ApplyAll of %d requests, more than %d in one script: %w", len(reqs), MaxApplyAll, errors.ErrUnsupported)
	}
	names, algs, limits, tail, err := s.encodeAll(reqs)
	if err != nil {
		return nil, err
	}
	if err := core.CheckDistinct("redisstore", reqs); err != nil {
		return nil, err
	}
	if !s.oneSlot(names) {
		return nil, fmt.Errorf("redisstore: the keys of a batch may sit on different cluster nodes: %w", errors.ErrUnsupported)
	}
	sc, index := s.all.of(s, algs, "batch", script.AllOrNone)
	for i, alg := range algs {
		tail[(2+int(script.Fields))*i] = index[s.scriptOf(alg).hash.(string)]
	}
	args := make([]any, 0, 3+len(names)+len(tail))
	args = append(args, "evalsha", sc.hash, len(names))
	for _, n := range names {
		args = append(args, n)
	}
	reply, err := s.run(ctx, sc, append(args, tail...))
	if err != nil {
		return nil, s.failed("batch", err)
	}
	const each = script.Outcome + 1 // and the instant of the take
	vals, ok := reply.([]any)
	if !ok || len(vals) != each*len(reqs) {
		return nil, fmt.Errorf("%w: %v", ErrUnexpectedReply, reply)
	}
	ds := make([]core.Outcome, len(reqs))
	for i, r := range reqs {
		if ds[i], err = decodeVals(vals[each*i:each*i+script.Outcome], limits[i]); err != nil {
			return nil, err
		}
		if err := writeReceipt(r, ds[i], vals[each*i+script.Outcome]); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

// writeReceipt writes into req's Receipt, if it carries one, the instant its script
// decided its take at, when it was admitted.
func writeReceipt(req core.Request, o core.Outcome, at any) error {
	r := req.Receipt
	if r == nil || (req.Spec.Op != core.OpTake || !o.Allowed()) && req.Spec.Op != core.OpDebit { // a debit takes whatever the key has
		return nil
	}
	v, ok := at.(int64)
	if !ok || v <= 0 {
		return fmt.Errorf("%w: the instant of a take: %v", ErrUnexpectedReply, at)
	}
	r.At = v
	return nil
}

// encodeAll is the keys, the algorithms, the Limits and the arguments (but each step's
// index, which follows from all the algorithms: see applyAllScript) of reqs in
// ApplyAll's script: per request, its step's index and its number of keys, then its
// arguments (script.Values), the time one instant for all.
func (s *Store) encodeAll(reqs []core.Request) (names []string, algs []*core.Algorithm, limits []int64, tail []any, err error) {
	algs, limits = make([]*core.Algorithm, len(reqs)), make([]int64, len(reqs))
	now := s.now()
	for i, r := range reqs {
		if r.Spec == nil || r.Spec.Algorithm == nil || r.Spec.Algorithm.Script == "" || len(r.Spec.Algorithm.ScriptKeys) == 0 {
			return nil, nil, nil, nil, errors.New("redisstore: request has no algorithm with a script")
		}
		alg := r.Spec.Algorithm
		if r.Spec.Op != core.OpTake || core.OfLeases(alg) {
			return nil, nil, nil, nil, errors.New("redisstore: ApplyAll only takes, and no leases")
		}
		a, err := r.Args()
		if err != nil {
			return nil, nil, nil, nil, err
		}
		k := redisx.NewKey(redisx.Namespace(r.Spec.Namespace), r.Key)
		for _, part := range s.scriptOf(alg).names {
			names = append(names, k.Name(part))
		}
		algs[i], limits[i] = alg, a.Limit
		w := s.window(alg)
		v := script.Values{script.N: a.N, script.Limit: a.Limit, script.Period: a.Period, script.Unit: a.Unit,
			script.Rate: a.Rate, script.Now: now, script.Op: script.Take, script.Lease: 0, script.Keep: a.Keep,
			script.WindowStart: w[0], script.WindowEnd: w[1], script.WindowNext: w[2], script.Taken: a.Taken}
		tail = append(tail, 0, len(alg.ScriptKeys)) // the index of its step, filled in later
		tail = append(tail, v[:]...)
	}
	return names, algs, limits, tail, nil
}

// window is the calendar window of alg around the store's time, and the next, as a
// step's arguments hold them (script.WindowStart...); "" for an algorithm without windows.
func (s *Store) window(alg *core.Algorithm) [3]any {
	if alg.Window == nil {
		return [3]any{"", "", ""}
	}
	w := alg.Window(s.localNow())
	return [3]any{w.Start, w.End, w.Next}
}

// localNow is the time a windowed algorithm's window is placed by: WithCalendarClock's,
// or the store's clock, or the application's (time.Now) when the scripts read Redis TIME.
func (s *Store) localNow() int64 {
	switch {
	case s.places != nil:
		return s.places.Now().UnixMicro()
	case s.clock != nil:
		return s.clock.Now().UnixMicro()
	}
	return time.Now().UnixMicro()
}

// now is the time the scripts are given: the store's clock, or empty for Redis TIME.
func (s *Store) now() any {
	if s.clock == nil {
		return ""
	}
	return s.clock.Now().UnixMicro()
}

// oneSlot reports whether one script may touch all of names: on a single server always;
// elsewhere when they share a hash tag.
func (s *Store) oneSlot(names []string) bool {
	if _, single := s.client.(*redis.Client); single {
		return true
	}
	tag := redisx.HashTag(names[0])
	for _, n := range names[1:] {
		if redisx.HashTag(n) != tag || tag == "" {
			return false
		}
	}
	return true
}

// stepSet is a script made of the steps of every algorithm a store has used it with so
// far, once each whatever the requests of a call (a new algorithm makes a new script,
// with its step and all the earlier ones): so a store loads into Redis (which never
// drops a script) at most one such script per algorithm, not one per list of requests.
// ApplyAll's is one, Lend's another.
type stepSet struct {
	cur atomic.Pointer[steps]
	mu  sync.Mutex // held to make a new one
}

// steps is a script of a stepSet, the algorithms whose steps it holds, in order, and the
// index of each one's step by its script's SHA; never changed once made.
type steps struct {
	script *luaScript
	algs   []*core.Algorithm
	index  map[string]int
}

// of is set's script for algs, made by compose (named what), and the index of each
// algorithm's step in it, by its script's SHA.
func (set *stepSet) of(s *Store, algs []*core.Algorithm, what string, compose func([]*core.Algorithm) string) (*luaScript, map[string]int) {
	if cur := set.cur.Load(); cur != nil && cur.holds(s, algs) {
		return cur.script, cur.index
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	old := set.cur.Load()
	if old != nil && old.holds(s, algs) {
		return old.script, old.index
	}
	next := &steps{index: map[string]int{}}
	if old != nil {
		next.algs = slices.Clone(old.algs)
		maps.Copy(next.index, old.index)
	}
	hash := func(a *core.Algorithm) string { return s.scriptOf(a).hash.(string) }
	for _, a := range algs {
		if _, ok := next.index[hash(a)]; !ok {
			next.algs = append(next.algs, a)
			next.index[hash(a)] = 0
		}
	}
	// in the order of their SHAs: instances that have seen the same algorithms share one
	// script in Redis, whatever order they saw them in
	slices.SortFunc(next.algs, func(a, b *core.Algorithm) int { return strings.Compare(hash(a), hash(b)) })
	for i, a := range next.algs {
		next.index[hash(a)] = i + 1
	}
	next.script = s.newLuaScript(what, compose(next.algs))
	set.cur.Store(next)
	return next.script, next.index
}

// holds reports whether st has a step for each of algs.
func (st *steps) holds(s *Store, algs []*core.Algorithm) bool {
	for _, alg := range algs {
		if _, ok := st.index[s.scriptOf(alg).hash.(string)]; !ok {
			return false
		}
	}
	return true
}
