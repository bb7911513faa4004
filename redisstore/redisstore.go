// Package redisstore is the ratelimit.Store on Redis: one limit shared by every instance
// of an application, with one atomic round trip per decision.
//
//	client := redis.NewClient(redisstore.Recommended(&redis.Options{Addr: "localhost:6379"}))
//	store := redisstore.New(client)
//	err := store.LoadScripts(ctx) // optional: the scripts loaded, connections warm
//	limiter, err := tokenbucket.New(store, ratelimit.PerSecond(100), ratelimit.WithNamespace("api"))
//
// A decision is one EVALSHA of the algorithm's Lua script, which reads the key's state,
// decides exactly as the in-memory step does, writes the state back and sets its TTL,
// all atomically; peeks, refunds, resets, the leases of an in-flight limit and a
// decision under several limits (ratelimit.AllowAll, when the keys share a hash tag: see
// TaggedKey) are one script each too. Time is the Redis server's (TIME), so instances
// whose clocks disagree still agree on every decision; WithClock sends the caller's clock
// instead. Decisions that arrive while calls to the same server are in flight ride the
// next call together, and a decision whose reply is lost is never counted twice (see
// Store). It runs on a single server, behind Sentinel, on Redis Cluster, behind a Ring
// or an AutoPipeliner (see New for what each gives); every key has a TTL and one hash
// slot (see WithPrefix).
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
	"github.com/ratelimit-go/ratelimit/internal/script"
)

// DefaultPrefix starts every key's name, unless WithPrefix says otherwise.
const DefaultPrefix = redisx.DefaultPrefix

// ErrUnexpectedReply: the server answered a script with something it does not return, as
// a server that is not Redis, or a different script under the same SHA, might.
var ErrUnexpectedReply = errors.New("redisstore: unexpected reply")

// Store is a ratelimit.Store on Redis. It is safe for concurrent use.
//
// # Never counted twice
//
// go-redis retries a command whose reply timed out (MaxRetries, 3 by default), and a
// script that ran but whose reply was lost would then count twice. This store sends its
// scripts as commands that go-redis never retries, whatever the client's options: a
// decision whose reply is lost is an error (at most one count), never two counts. That
// holds for clients with a Process method (*redis.Client, *redis.ClusterClient,
// *redis.Ring, *redis.AutoPipeliner); any other Scripter is called through
// redis.Script.Run, and its own retry policy applies.
//
// # Coalescing
//
// A decision that finds no call in flight to its server goes out at once, alone: no
// latency is added when the store is idle. Decisions that arrive while calls are in
// flight wait for the next one, which decides up to WithMaxBatch (128) of them in one
// script: as soon as one of the calls a store keeps in flight (two, more to a server far
// away: see Deadlines) is free (the first to wait yields once, for the callers on their
// way to join it), or when one lands. Each
// decision of a batch is decided independently and in order, with its own algorithm,
// rule, n and op, exactly as alone. Redis then pays its per-command cost
// (parsing, the script's lookup, the reply) and go-redis its pool and round trip once per
// batch instead of once per decision. Each caller waits no longer than its context
// allows; one that gives up before its batch goes out is left out of it; a batch whose
// reply is lost is an error for each of its decisions, never sent again. On Redis
// Cluster the batches are per master (Redis 7's allow-cross-slot-keys script flag), and
// the masters share the two calls in flight, each with one at least; a key that moved
// fails its batch before anything is written, and its decisions are retried alone.
// *redis.Client and *redis.ClusterClient coalesce; a Ring, an AutoPipeliner (which
// pipelines by itself) or another Scripter sends one call per decision. WithMaxBatch(1)
// turns it off.
//
// # Deadlines
//
// A call returns by the end of its context, whatever the client's options: the caller
// waits for its reply only that long. (One exception spares a lone decision two goroutine
// switches: a call that goes out alone, with a context that has no deadline, is sent on
// its caller's goroutine, and a cancellation then ends its wait when the reply comes,
// within the client's ReadTimeout, as go-redis's own calls do.) The command itself is
// sent on the caller's context without its deadline, from a goroutine of the store's:
// go-redis waits for a connection (and dials one) only until the context ends, but then
// reads the reply whenever it comes, within its own ReadTimeout, and keeps the
// connection. A client with ContextTimeoutEnabled would otherwise close every connection
// whose reply came after a caller's deadline, and the next decision would pay a new dial
// and a handshake of several round trips inside its own deadline: on a Redis a few
// milliseconds away, with a fallback's timeout of 5ms, every decision would time out
// from then on. The client's ReadTimeout is then how long a late reply is waited for (3s
// by default; the fallback package suggests a second).
//
// A script whose caller has given up before it is handed to the client is not sent:
// the store checks the context before it hands the command over, and go-redis waits
// for a connection only as long as the context allows. A script already on its way when
// the caller gives up runs, and counts once.
//
// The store keeps two calls in flight to a server. It keeps more (up to 16, and half of
// the client's pool) while none of those in flight is expected to land within half a
// millisecond, by the round trip it measures. Near, decisions ride together in the next
// batch; far, decisions that arrive together go out at once, not a round trip later. A
// first decision warms the connections its flights will use, in the background, with
// PINGs; LoadScripts does it before it returns. A decision so never pays for a new
// connection's handshake while other connections are warm.
type Store struct {
	client  redis.Scripter
	process processor // the client's Process, nil if it has none
	prefix  string
	clock   clock.Clock // nil: Redis TIME
	places  clock.Clock // places calendar windows (WithCalendarClock); nil: clock, else time.Now
	scripts sync.Map    // *core.Algorithm -> *luaScript
	sources sync.Map    // a script's name, keys and source -> *luaScript: one for algorithms that share it
	batches sync.Map    // the SHAs of a coalesced batch's steps, in order -> *luaScript

	maxBatch int          // decisions per batch script call; 1: no coalescing
	one      *node        // the coalescing queue of a *redis.Client
	nodes    sync.Map     // a cluster's masters (*redis.Client) -> *node
	noFlags  atomic.Bool  // a cluster without script flags: no coalescing
	flying   atomic.Int32 // calls in flight to all its nodes (see mayFly)
	seed     maphash.Seed // of the hashes that tell a batch's keys apart
	// how long a flight takes (nanoseconds, a moving average; see mayFly), and the
	// most flights the client's pool allows
	flightTime    atomic.Int64
	maxFlightsFar int
	all           stepSet    // ApplyAll's script (see stepSet)
	lends         [2]stepSet // Lend's script, on one server and on a cluster
	orphans       orphans    // leases to release that no caller holds
}

var _ ratelimit.Store = (*Store)(nil)

// Option configures a Store.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithPrefix starts every key's name with prefix and a colon (DefaultPrefix by default; an
// empty prefix means the default). Braces in prefix would pin every key to one hash slot,
// so they are replaced with parentheses.
//
// # Keys
//
// The state of limiter key k for an algorithm, in a limiter's namespace, lives in Redis
// keys named
//
//	<prefix>:<algorithm>:<part>:<namespace>:<form of k>
//
// where prefix is "rl" by default (WithPrefix), algorithm is its Name ("tokenbucket"),
// part names one of its keys ("state", "log" for the sliding log, "leases" for the
// in-flight limit, "loans" for a key's record of loans), and namespace is
// the limiter's (its rule's, "100/1s", unless ratelimit.WithNamespace names it), with "%",
// ":", "{" and "}" escaped as in ratelimit.Key. The form of k keeps every key distinct and
// all parts of one key in one Redis Cluster hash slot, whatever the namespace:
//
//   - k carries a hash tag (a "{...}" with something inside, by Redis's own rule): the
//     form is "t:" + k, and the tag is kept. Put a tenant's keys on one node on purpose
//     with keys like "{shop-a}:create-order".
//   - k is not empty and has no braces: the form is "{" + k + "}", so each key hashes on
//     its own: "rl:tokenbucket:state:100/1s:{tenant-42}".
//   - otherwise (empty, or stray braces): the form is "{" + 16 hex digits of k's 64-bit
//     FNV-1a hash + "}:" + k, so no brace a user puts in a key can steer its slot.
//
// Build keys from untrusted input with care: a key that carries a hash tag keeps it.
//
// A key's state is a string "T:L:A" in decimal: the latest instant the key has seen (in
// microseconds since the Unix epoch), and the algorithm's Level and Aux (see each
// algorithm's package doc); the sliding log keeps its events in a list beside it, as
// pairs (instant, count), oldest first. An in-flight limit's key is a sorted set alone:
// each lease's id, scored by its expiry in microseconds, with the TTL of the latest. A
// key's record of loans (Store.Lend) is a hash beside its state: each holder's id ->
// "out:until:limit:period" (events lent and not given back, when the loan ends in
// microseconds, and the Limit and Period of its rule), with the TTL of the latest.
//
// Every write sets a TTL: the time until the key is back to its full allowance, rounded
// up to a whole millisecond and never 0. Idle keys vanish and come back full, and a key
// found without a TTL gets one on its next decision.
func WithPrefix(prefix string) Option {
	return optionFunc(func(s *Store) {
		if prefix != "" {
			s.prefix = redisx.Prefix(prefix)
		}
	})
}

// WithClock makes decisions on c's time instead of the Redis server's, for tests, or for
// applications whose clocks are known to agree. Nil means the server's time.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) { s.clock = c })
}

// WithCalendarClock sets the application's clock, which places the calendar windows of a
// quota (fixedwindow.Quota) around its time before the server's time chooses among them:
// by default WithClock's clock, else time.Now. For a test that drives the server's TIME
// with a fake clock (miniredis), give it the same clock.
func WithCalendarClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) { s.places = c })
}

// New returns a Store on client: a *redis.Client, *redis.ClusterClient, *redis.Ring,
// *redis.AutoPipeliner, or any redis.Scripter. It makes no call to Redis. It panics with
// a message that says so for a nil client or a nil option, as net/http does for a nil
// handler: a store without Redis would fail every decision, and only once traffic came.
//
// # What each client gives
//
//   - *redis.Client, one server: decisions coalesce, and ApplyAll (AllowAll) is one
//     atomic script whatever its keys.
//   - Sentinel (redis.NewFailoverClient, a *redis.Client to the master the sentinels
//     name): the same. When the master dies, decisions fail with ErrUnavailable (a
//     fallback.Store decides them meanwhile) until the sentinels promote a replica, then
//     go to it: about 3s after a kill with down-after-milliseconds 1000 (BENCHMARKS.md).
//     Replication is asynchronous: what the old master counted and had not yet sent is
//     lost, so a key may admit a little more right after.
//   - *redis.ClusterClient: decisions coalesce per master, and ApplyAll is one script
//     when its keys share a hash tag (see below).
//   - *redis.Ring (keys sharded by their hash tag): one call per decision, no
//     coalescing; ApplyAll is one script when its keys share a hash tag, and otherwise
//     returns errors.ErrUnsupported, so AllowAll takes them one by one with refunds (all
//     or none in the end, not atomic). A shard that goes down fails its keys'
//     decisions until the ring's heartbeat drops it; its keys then start full on another
//     shard.
//   - *redis.AutoPipeliner: one call per decision, pipelined by go-redis.
//
// # Redis Cluster
//
// On a *redis.ClusterClient, every key of one decision sits in one hash slot (see
// WithPrefix), so a decision is one call to one master. When a master fails, its slots'
// decisions are errors wrapping ratelimit.ErrUnavailable (a fallback.Store decides them
// meanwhile) until a replica takes over: the cluster's cluster-node-timeout (Redis's
// default is 15s) and the failover election set how long that takes. Each such error
// makes the store ask the client to reload its slot map, so decisions move to the new
// master as soon as it serves the slots, not at go-redis's next periodic reload. Set on
// the client:
//
//   - ContextTimeoutEnabled: true, so that the caller's deadline bounds each call at the
//     socket (see Store, "Deadlines");
//   - DialTimeout well under a second (5s by default): a call to a dead master's address
//     waits for the dial;
//   - ClusterStateReloadInterval of a few seconds (60s by default), for the slot moves that
//     no error announces.
func New(client redis.Scripter, opts ...Option) *Store {
	if core.IsNil(client) {
		panic("redisstore: New with a nil client")
	}
	s := &Store{client: client, prefix: DefaultPrefix, maxBatch: DefaultMaxBatch, seed: maphash.MakeSeed()}
	s.process, _ = client.(processor)
	s.one = &node{to: s.process}
	s.maxFlightsFar = maxFlightsFar
	switch c := client.(type) {
	case *redis.Client:
		s.maxFlightsFar = min(maxFlightsFar, max(maxFlights, c.Options().PoolSize/2))
	case *redis.ClusterClient:
		s.maxFlightsFar = min(maxFlightsFar, max(maxFlights, c.Options().PoolSize/2))
	}
	for _, o := range opts {
		if o == nil {
			panic("redisstore: New with a nil option")
		}
		o.apply(s)
	}
	return s
}

// Apply runs req's algorithm on Redis: it takes, peeks, refunds or resets (req.Op), each
// in one script. Errors: ctx.Err() if ctx has ended; the error of
// req.Algorithm.Prepare for an invalid rule or n, before any call to Redis; otherwise the
// client's error, wrapped, and wrapped with ratelimit.ErrUnavailable when Redis cannot
// decide now (a timeout, a lost connection, BUSY, OOM, LOADING, a failover); or
// ErrUnexpectedReply.
func (s *Store) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return core.Outcome{}, err
	}
	alg := req.Spec.Algorithm
	if alg == nil || alg.Script == "" || len(alg.ScriptKeys) == 0 {
		return core.Outcome{}, errors.New("redisstore: request has no algorithm with a script")
	}
	a, err := req.Args()
	if err != nil {
		return core.Outcome{}, err
	}
	op, ok := script.Code(req.Spec)
	if !ok {
		return core.Outcome{}, fmt.Errorf("redisstore: unknown op %q", req.Spec.Op)
	}
	if req.Spec.Op == core.OpExtend && alg.Extend == nil {
		return core.Outcome{}, fmt.Errorf("redisstore: %s has no leases to extend", alg.Name)
	}
	if req.Spec.Op == core.OpDebit && alg.Debit == nil {
		return core.Outcome{}, fmt.Errorf("redisstore: %s takes no debts", alg.Name)
	}
	sc := s.scriptOf(alg)
	ra := sc.args(req, a)
	c := call{alg: alg, sc: sc, ra: ra, a: a, op: op, now: s.now(), key: redisx.NewKey(ra.nsForm, req.Key),
		window: s.window(alg)}
	var d core.Outcome
	if s.coalescing() {
		d, err = s.coalesce(ctx, &c)
	} else {
		d, err = s.single(ctx, &c)
	}
	if err != nil && c.a.Lease != 0 && req.Spec.Op == core.OpTake && !errors.Is(err, core.ErrNotSent) {
		s.releaseLater(req, c.a.Period) // it may have taken a lease that nobody holds (see orphans)
	}
	if err == nil && c.receipt() {
		err = writeReceipt(req, d, c.at)
	}
	return d, err
}

// single decides one call with its algorithm's own script.
func (s *Store) single(ctx context.Context, c *call) (core.Outcome, error) {
	// EVALSHA hash numkeys key... then the step's arguments (script.Values)
	args := make([]any, 3, 3+len(c.sc.names)+int(script.Fields))
	args[0], args[1], args[2] = "evalsha", c.sc.hash, len(c.sc.names)
	for _, name := range c.sc.names {
		args = append(args, c.key.Name(name))
	}
	v := c.values()
	args = append(args, v[:]...)
	reply, err := s.run(ctx, c.sc, args)
	if err != nil {
		return core.Outcome{}, s.failed(c.sc.alg, err)
	}
	var d core.Outcome
	d, c.at, err = decode(reply, c.a.Limit)
	return d, err
}

// decode checks the shape of a script's reply (script.Reply): its Outcome (see
// decodeVals), the instant its take was decided at, and what a refund gave back.
func decode(reply any, limit int64) (core.Outcome, int64, error) {
	vals, ok := reply.([]any)
	if !ok || len(vals) != script.Reply {
		return core.Outcome{}, 0, fmt.Errorf("%w: %v", ErrUnexpectedReply, reply)
	}
	at, ok := vals[script.Outcome].(int64)
	if _, ok2 := vals[script.Outcome+1].(int64); !ok || !ok2 {
		return core.Outcome{}, 0, fmt.Errorf("%w: %v", ErrUnexpectedReply, reply)
	}
	d, err := decodeVals(vals[:script.Outcome], limit)
	return d, at, err
}

// failed wraps an error of the client, with ratelimit.ErrUnavailable when Redis cannot
// decide now (and then asks a cluster client to look at its slot map again).
func (s *Store) failed(alg string, err error) error {
	if redisx.Unavailable(err) {
		s.nodeFailed()
	}
	if redisx.Undelivered(err) {
		return fmt.Errorf("%w: %w", core.ErrUndelivered, redisx.Failed("redisstore", alg, err))
	}
	return redisx.Failed("redisstore", alg, err)
}

// nodeFailed asks a cluster client to reload its slot map, once a call has failed as a
// dead or failing-over node fails it. go-redis reloads on MOVED, but a master killed
// outright answers nothing, and its slots' calls would go on failing until the periodic
// reload (ClusterStateReloadInterval, 60s by default) even after a replica took over.
// go-redis runs at most one reload at a time, 200ms apart, so a burst of failures costs
// a reload or two.
func (s *Store) nodeFailed() {
	if c, ok := s.client.(*redis.ClusterClient); ok {
		c.ReloadState(context.Background())
	}
}

// decodeVals checks the shape of a step's reply and decodes its Outcome: five integers,
// durations in microseconds. A batch's replies are cut from one, and passing each as an
// any would cost an allocation per decision.
func decodeVals(vals []any, limit int64) (core.Outcome, error) {
	if len(vals) != 5 {
		return core.Outcome{}, fmt.Errorf("%w: %v", ErrUnexpectedReply, vals)
	}
	var n [5]int64
	var ok bool
	for i, v := range vals {
		if n[i], ok = v.(int64); !ok || n[i] < 0 || (i == 0 && n[i] > 1) {
			return core.Outcome{}, fmt.Errorf("%w: %v", ErrUnexpectedReply, vals)
		}
	}
	wait := n[2]
	if n[0] == 1 {
		wait = n[4] // the delay
	}
	return core.Args{Limit: limit}.Outcome(n[0] == 1, min(n[1], limit), mathx.Micros(wait), mathx.Micros(n[3])), nil
}

// TaggedKey is ratelimit.Key(parts...) under the Redis hash tag of tag: "{" + escaped
// tag + "}:" + Key(parts...). All the keys of one tag (a tenant's limits, say) then sit
// on one Redis Cluster node, where several of them can be decided in one script
// (ratelimit.AllowAll); and, escaped, no tag or part can close the tag early.
func TaggedKey(tag string, parts ...string) string {
	return redisx.Tagged(tag, parts...)
}
