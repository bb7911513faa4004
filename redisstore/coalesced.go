package redisstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"strings"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

func (s *Store) safeDecideBatch(ctx context.Context, n *node, calls []*call) (ds []result, err error) {
	defer clientPanic("batch", &err)
	return s.decideBatch(ctx, n, calls)
}

// profile is what calls of a batch may share (see coalesced.lua): their step, their
// number of keys, and their arguments, where the lease is "" for an in-flight limit,
// whose calls each send their own, and the time "*" when each call sends its own.
type profile struct {
	step, nkeys int
	v           script.Values
}

type result struct {
	d   core.Outcome
	at  int64 // a take with a receipt: the instant it was decided at
	err error
}

// decideBatch runs the batch script on n for calls.
func (s *Store) decideBatch(ctx context.Context, n *node, calls []*call) ([]result, error) {
	sc, index := s.batchScriptFor(calls, n.cluster)
	profiles, of := profilesOf(calls, index)
	// EVALSHA hash numkeys [routing key] nprofiles distinct profiles... then per call:
	// [its profile], [its lease], [its time], its keys...
	args := make([]any, 0, 6+len(profiles)*(2+int(script.Fields))+len(calls)*3)
	args = append(args, "evalsha", sc.hash)
	if n.cluster {
		args = append(args, 1, calls[0].key.Name(calls[0].sc.names[0]))
	} else {
		args = append(args, 0)
	}
	args = append(args, len(profiles), 0)
	distinctAt := len(args) - 1
	for _, p := range profiles {
		args = append(args, p.step, p.nkeys)
		args = append(args, p.v[:]...)
	}
	args, distinct := s.appendCalls(args, calls, of, len(profiles) > 1)
	if distinct {
		args[distinctAt] = 1
	}
	reply, err := s.runOn(ctx, n.to, sc, args)
	if err != nil {
		if n.cluster && alone(err) {
			if flagsMissing(err) {
				s.noFlags.Store(true)
			}
			return nil, errAlone
		}
		return nil, s.failed("batch", err)
	}
	// per call, its Outcome, and the instant of a take with a receipt
	size := 0
	for _, c := range calls {
		size += script.Outcome
		if c.receipt() {
			size++
		}
	}
	vals, ok := reply.([]any)
	if !ok || len(vals) != size {
		return nil, fmt.Errorf("%w: %v", ErrUnexpectedReply, reply)
	}
	out := make([]result, len(calls))
	at := 0
	for i, c := range calls {
		out[i].d, out[i].err = decodeVals(vals[at:at+script.Outcome], c.a.Limit)
		at += script.Outcome
		if c.receipt() {
			out[i].at, _ = vals[at].(int64)
			at++
		}
	}
	return out, nil
}

// profilesOf is what calls share (their profiles, in the order they first come) and the
// index of each call's in them; index is the place of each algorithm's step in the batch
// script, nil for a batch of one algorithm.
func profilesOf(calls []*call, index map[*core.Algorithm]int) ([]profile, []int) {
	profiles := make([]profile, 0, 2)
	of := make([]int, len(calls))
	for i, c := range calls {
		step := 1 // a batch of one algorithm
		if index != nil {
			step = index[c.alg]
		}
		p := profile{step, len(c.sc.names), c.values()}
		if c.a.Lease != 0 {
			p.v[script.Lease] = "" // each call sends its own
		}
		if c.now != "" {
			p.v[script.Now] = "*" // the store's clock: each call sends its own
		}
		of[i] = slices.Index(profiles, p)
		if of[i] < 0 {
			of[i] = len(profiles)
			profiles = append(profiles, p)
		}
	}
	return profiles, of
}

// appendCalls appends what each call sends of its own to args: the index of its profile
// (when several), its lease and its time if it has its own, and its keys' names; and
// reports whether the calls' first keys are distinct, as far as their hashes tell.
func (s *Store) appendCalls(args []any, calls []*call, of []int, several bool) ([]any, bool) {
	// the names, cut from one string: one allocation for the batch, not one per name
	var b strings.Builder
	size := 0
	for _, c := range calls {
		for _, name := range c.sc.names {
			size += c.key.Len(name)
		}
	}
	b.Grow(size)
	for _, c := range calls {
		for _, name := range c.sc.names {
			c.key.Write(&b, name)
		}
	}
	names, at := b.String(), 0
	var firsts firstKeys
	for i, c := range calls {
		if several {
			args = append(args, of[i]+1)
		}
		if c.a.Lease != 0 {
			args = append(args, c.a.Lease)
		}
		if c.now != "" {
			args = append(args, c.now)
		}
		for j, name := range c.sc.names {
			end := at + c.key.Len(name)
			key := names[at:end]
			at = end
			if j == 0 {
				firsts.add(s.seed, key)
			}
			args = append(args, key)
		}
	}
	return args, firsts.distinct()
}

// firstKeys tells whether the first keys of a batch's calls are distinct, as far as their
// hashes tell, so that the batch script need not find out with a table of them: a
// batch that names a key twice (or two keys of one hash, or more keys than it holds) is
// "not known distinct", and the script then reads ahead only each key's first call.
type firstKeys struct {
	hashes [2 * DefaultMaxBatch]uint64 // open addressing; 0 is an empty slot
	n      int
	dup    bool
}

func (f *firstKeys) add(seed maphash.Seed, key string) {
	if f.dup {
		return
	}
	if f.n >= len(f.hashes)/2 {
		f.dup = true // too many to tell cheaply
		return
	}
	h := maphash.String(seed, key)
	if h == 0 {
		h = 1
	}
	mask := uint64(len(f.hashes) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch f.hashes[i] {
		case 0:
			f.hashes[i] = h
			f.n++
			return
		case h:
			f.dup = true
			return
		}
	}
}

func (f *firstKeys) distinct() bool { return !f.dup }

// alone reports whether a cluster batch failed before any write because a key is not
// the node's (moved, migrating), or because the server cannot run the script's flags:
// its decisions are retried one by one.
func alone(err error) bool {
	if redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") || redis.IsTryAgainError(err) ||
		redis.HasErrorPrefix(err, "CROSSSLOT") || redis.IsClusterDownError(err) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "non local key") || strings.Contains(msg, "same slot") ||
		strings.Contains(msg, "cluster is down") || flagsMissing(err)
}

// flagsMissing reports whether the server did not understand the script's shebang line:
// a Redis before 7, which reads "#!lua flags=..." as Lua and stops at its first
// character. Any other error compiling a batch script is this store's fault, and is
// returned as one, never taken for an old server (which would turn coalescing off
// without a word).
func flagsMissing(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "shebang") ||
		strings.Contains(msg, "Error compiling script") && strings.Contains(msg, ":1:") && strings.Contains(msg, "'#'")
}

// batchScriptFor is the batch script of the algorithms of calls, and each one's index
// among its steps: one script per set of algorithms (in the order of their names), made
// once, and a variant with script flags for a cluster.
func (s *Store) batchScriptFor(calls []*call, cluster bool) (*luaScript, map[*core.Algorithm]int) {
	same := true
	for _, c := range calls[1:] {
		same = same && c.alg == calls[0].alg
	}
	if same { // the usual batch: one algorithm, its script made once
		sc := calls[0].sc
		p := &sc.batch
		if cluster {
			p = &sc.clusterBatch
		}
		if b := p.Load(); b != nil {
			return b, nil
		}
		b, _ := s.buildBatchScript([]*core.Algorithm{calls[0].alg}, cluster)
		p.Store(b)
		return b, nil
	}
	return s.buildBatchScript(algsOf(calls), cluster)
}

// algsOf is the distinct algorithms of calls.
func algsOf(calls []*call) []*core.Algorithm {
	var algs []*core.Algorithm
	seen := make(map[*core.Algorithm]bool, 2)
	for _, c := range calls {
		if !seen[c.alg] {
			seen[c.alg] = true
			algs = append(algs, c.alg)
		}
	}
	return algs
}

// buildBatchScript is the batch script of algs, and the index of each one's step in it
// (its place among the distinct scripts of algs, sorted, from 1): one step per distinct
// script, so algorithms that share a script (two values of one algorithm) share a step
// and a batch script, made once per set of scripts.
func (s *Store) buildBatchScript(algs []*core.Algorithm, cluster bool) (*luaScript, map[*core.Algorithm]int) {
	hash := func(a *core.Algorithm) string { return s.scriptOf(a).hash.(string) }
	sort.Slice(algs, func(i, j int) bool { return hash(algs[i]) < hash(algs[j]) })
	seen := make(map[*core.Algorithm]int, len(algs))
	var steps []*core.Algorithm
	var id strings.Builder
	if cluster {
		id.WriteString("cluster")
	}
	for _, a := range algs {
		if len(steps) == 0 || hash(steps[len(steps)-1]) != hash(a) {
			steps = append(steps, a)
			id.WriteString(hash(a)) // a SHA: 40 hex digits, with no need of a separator
		}
		seen[a] = len(steps)
	}
	algs = steps
	key := id.String()
	if sc, ok := s.batches.Load(key); ok {
		return sc.(*luaScript), seen
	}
	sc, _ := s.batches.LoadOrStore(key, s.newLuaScript("batch", script.Coalesced(algs, cluster)))
	return sc.(*luaScript), seen
}
