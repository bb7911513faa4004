package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
	"github.com/ratelimit-go/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

// script is what the store keeps of one algorithm, so that a decision allocates little
// more than its key names.
type luaScript struct {
	script    *redis.Script
	alg       string // the algorithm's name, for errors
	source    string
	hash, src any      // the script's SHA and source, boxed once
	names     []string // "<prefix>:<algorithm>:<part>:" for each of its keys
	last      atomic.Pointer[ruleArgs]
	// the batch scripts of this algorithm alone, made once (see coalesce.go)
	batch, clusterBatch atomic.Pointer[luaScript]
	mu                  sync.Mutex
	epoch               atomic.Uint64 // loads that succeeded
	loading             *fetch        // the load in flight, nil if none
}

// ruleArgs are what depends only on the rule and the namespace: the ARGV boxed once, and
// the namespace's form in key names.
type ruleArgs struct {
	rule                      core.Rule
	ns, nsForm                string
	limit, period, unit, rate any
}

// args are the rule's and the namespace's boxed ARGV and key form, made once while they
// stay the same (most scripts see one rule and namespace again and again).
func (sc *luaScript) args(req core.Request, a core.Args) *ruleArgs {
	ra := sc.last.Load()
	if ra == nil || ra.rule != req.Spec.Rule || ra.ns != req.Spec.Namespace {
		ra = &ruleArgs{rule: req.Spec.Rule, ns: req.Spec.Namespace, nsForm: redisx.Namespace(req.Spec.Namespace),
			limit: a.Limit, period: a.Period, unit: a.Unit, rate: a.Rate}
		sc.last.Store(ra)
	}
	return ra
}

// newLuaScript is what the store keeps of the script src, for errors named what, with
// the store's least TTL (WithMinTTL) written into the prelude's.
func (s *Store) newLuaScript(what, src string) *luaScript {
	if s.minTTL > 0 {
		src = strings.Replace(src, "local TTLFLOOR = 0\n", "local TTLFLOOR = "+strconv.FormatInt(s.minTTL, 10)+"\n", 1)
	}
	rs := redis.NewScript(src)
	return &luaScript{script: rs, alg: what, source: src, hash: rs.Hash(), src: src}
}

func (s *Store) scriptOf(alg *core.Algorithm) *luaScript {
	if sc, ok := s.scripts.Load(alg); ok {
		return sc.(*luaScript)
	}
	src := script.Single(alg)
	sc := s.newLuaScript(alg.Name, src)
	for _, part := range alg.ScriptKeys {
		sc.names = append(sc.names, redisx.Part(s.prefix, alg.Name, part))
	}
	// algorithms of one script (a quota of each calendar and zone) share what is known of
	// it: loaded once, by LoadScripts or the first decision of any of them
	shared, _ := s.sources.LoadOrStore(strings.Join(append([]string{alg.Name, src}, sc.names...), "\x00"), sc)
	got, _ := s.scripts.LoadOrStore(alg, shared)
	return got.(*luaScript)
}

// run sends args, an EVALSHA, as a command go-redis never retries. A store's first call
// of a script loads it (SCRIPT LOAD, on every node of a cluster), and a call that meets
// NOSCRIPT (after a restart, a failover, SCRIPT FLUSH) loads it again and resends: one
// load at a time per script, the concurrent callers waiting for it, so that a thousand
// first calls cost one load, not a thousand copies of the source. Where a load cannot
// reach the node (a cluster node down, a Ring shard), the call sends the source itself
// (EVAL). A client without Process gets redis.Script.Run.
func (s *Store) run(ctx context.Context, sc *luaScript, args []any) (any, error) {
	return s.runOn(ctx, s.process, sc, args)
}

// runOn is run on to, the store's client or one node of its cluster.
func (s *Store) runOn(ctx context.Context, to processor, sc *luaScript, args []any) (any, error) {
	if to == nil {
		keys := make([]string, args[2].(int))
		for i := range keys {
			keys[i] = args[3+i].(string)
		}
		return sc.script.Run(ctx, s.client, keys, args[3+len(keys):]...).Result()
	}
	epoch := sc.epoch.Load()
	loaded := epoch > 0
	if !loaded {
		loaded = s.load(ctx, sc, 0)
		epoch = sc.epoch.Load()
	}
	var cmd noRetry
	var err error
	if loaded {
		cmd = noRetryCmd(ctx, args)
		err = s.send(ctx, to, cmd)
		if noScript(err) && s.load(ctx, sc, epoch) { // the script did not run: load it, and again
			cmd = noRetryCmd(ctx, args)
			err = s.send(ctx, to, cmd)
		}
	}
	if !loaded || noScript(err) {
		args[0], args[1] = "eval", sc.src
		cmd = noRetryCmd(ctx, args)
		err = s.send(ctx, to, cmd)
	}
	if err != nil {
		return nil, err
	}
	return cmd.Val(), nil
}

// LoadScripts loads the scripts of algs into Redis now, on every master of a cluster.
// With no algs, it loads those of every algorithm of this module. They are the five, the
// calendar quotas and the in-flight limit.
//
// An application can so check Redis and warm the store before it serves. The first
// decisions then cost one round trip each, not a load too. On a *redis.Client,
// LoadScripts also opens and readies the connections its first calls will take. It times
// the round trip too (see Store, "Coalescing").
//
// It returns the first error, wrapped with ratelimit.ErrUnavailable when Redis cannot be
// reached. Decisions load what they need without it.
func (s *Store) LoadScripts(ctx context.Context, algs ...*ratelimit.Algorithm) error {
	if len(algs) == 0 {
		algs = builtIn()
	}
	for _, alg := range algs {
		if alg == nil || alg.Script == "" {
			return errors.New("redisstore: LoadScripts of an algorithm without a script")
		}
		sc := s.scriptOf(alg)
		if err := s.loadErr(ctx, sc, sc.epoch.Load()); err != nil {
			return s.failed("loading "+alg.Name, err)
		}
	}
	if _, single := s.client.(*redis.Client); single && s.coalescing() {
		for warmed := 0; warmed < s.warmTarget(); { // the first PINGs time the round trip
			warmed = s.warmTarget()
			if err := s.warmNow(ctx, s.one, warmed); err != nil {
				return s.failed("warming", err)
			}
		}
	}
	return nil
}

// noScript reports whether err is NOSCRIPT, the error code of the reply: the script did
// not run. (HasErrorPrefix allocates, even for a nil error: ask only when there is one.)
func noScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// load loads sc's script, unless a load has ended since the caller saw epoch; a load in
// flight is waited for, as long as ctx allows. It reports whether the script is loaded.
func (s *Store) load(ctx context.Context, sc *luaScript, seen uint64) bool {
	return s.loadErr(ctx, sc, seen) == nil
}

// loadErr is load, with the error of the load that failed (or ctx's, for a caller that
// stopped waiting for another's load).
func (s *Store) loadErr(ctx context.Context, sc *luaScript, seen uint64) error {
	sc.mu.Lock()
	if e := sc.epoch.Load(); e != seen {
		sc.mu.Unlock()
		if e == 0 {
			return errors.New("redisstore: script not loaded")
		}
		return nil
	}
	f := sc.loading
	if f == nil { // the first to ask loads it, on a goroutine that outlives a caller who gives up
		f = &fetch{done: make(chan struct{})}
		sc.loading = f
		go func() {
			err := scriptLoad(noDeadline{ctx}, s.client, sc.source)
			sc.mu.Lock()
			f.err = err
			sc.loading = nil
			if err == nil {
				sc.epoch.Add(1)
			}
			close(f.done)
			sc.mu.Unlock()
		}()
	}
	sc.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// scriptLoad is SCRIPT LOAD of source, on a goroutine of the store's (see clientPanic).
func scriptLoad(ctx context.Context, client redis.Scripter, source string) (err error) {
	defer clientPanic("loading a script", &err)
	return client.ScriptLoad(ctx, source).Err()
}

// fetch is a load in flight that others wait for; done is closed when it ends.
type fetch struct {
	done chan struct{}
	err  error
}
