// Package redisstore is the ratelimit.Store on Redis. Every instance of an application
// shares one limit, with one atomic round trip per decision.
//
//	client := redis.NewClient(redisstore.Recommended(&redis.Options{Addr: "localhost:6379"}))
//	store := redisstore.New(client)
//	err := store.LoadScripts(ctx) // optional: the scripts loaded, connections warm
//	limiter, err := tokenbucket.New(store, ratelimit.PerSecond(100), ratelimit.WithNamespace("api"))
//
// A decision is one EVALSHA of the algorithm's Lua script. The script reads the key's
// state, decides exactly as the in-memory step does, writes the state back and sets its
// TTL, all atomically. Peeks, refunds, resets and the leases of an in-flight limit are
// one script each too. So is a decision under several limits (ratelimit.AllowAll), when
// the keys share a hash tag (see TaggedKey).
//
// Time is the Redis server's (TIME). Instances whose clocks disagree so still agree on
// every decision. WithClock sends the caller's clock instead.
//
// Decisions that arrive while calls to the same server are in flight ride the next call
// together. A decision whose reply is lost is never counted twice (see Store).
//
// The store runs on a single server, behind Sentinel, on Redis Cluster, behind a Ring or
// behind an AutoPipeliner. See New for what each gives. Every key has a TTL and one hash
// slot (see WithPrefix).
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

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

// ErrUnexpectedReply means the server answered a script with a reply the script does not
// return. A server that is not Redis might do that, or a different script under the
// same SHA.
var ErrUnexpectedReply = errors.New("redisstore: unexpected reply")

// Store is a ratelimit.Store on Redis. It is safe for concurrent use.
//
// # Never counted twice
//
// go-redis retries a command whose reply timed out (MaxRetries, 3 by default). A script
// that ran but whose reply was lost would then count twice. This store sends its scripts
// as commands that go-redis never retries, whatever the client's options. A decision
// whose reply is lost is an error, and counts once at most.
//
// That holds for the clients with a Process method: *redis.Client, *redis.ClusterClient,
// *redis.Ring and *redis.AutoPipeliner. Any other Scripter is called through
// redis.Script.Run, and its own retry policy applies.
//
// # Coalescing
//
// A decision that finds no call in flight to its server goes out at once, alone. No
// latency is added when the store is idle. Decisions that arrive while calls are in
// flight wait for the next call. That call decides up to WithMaxBatch (128) of them in
// one script. Each decision of a batch is decided independently and in order, exactly
// as alone, with its own algorithm, rule, n and op. Redis and go-redis then pay their
// cost per command once per batch, not once per decision.
//
// Each caller waits no longer than its context allows. A caller that gives up before its
// batch goes out is left out of it. A batch whose reply is lost is an error for each of
// its decisions, and is never sent again.
//
// *redis.Client and *redis.ClusterClient coalesce. A Ring, an AutoPipeliner (which
// pipelines by itself) or another Scripter sends one call per decision. WithMaxBatch(1)
// turns coalescing off.
//
// On Redis Cluster, the batches are per master. They need Redis 7's allow-cross-slot-keys
// script flag: on a server without script flags, the store decides one by one. A key
// that moved fails its batch before anything is written. Its decisions are then retried
// alone.
//
// The store keeps two calls in flight to a server. The masters of a cluster share those
// two, each with one at least. The store keeps more while none of those in flight is
// expected to land within half a millisecond, by the round trip it measures. It then
// keeps up to 16, and no more than half of the client's pool. Near, decisions ride
// together in the next batch. Far, decisions that arrive together go out at once, not a
// round trip later.
//
// A first decision warms the connections its calls will use, with PINGs in the
// background. LoadScripts does it before it returns. A decision so never pays for a new
// connection's handshake while other connections are warm.
//
// # Deadlines
//
// A call returns by the end of its context, whatever the client's options. The caller
// waits for its reply only that long. A script whose caller has given up before it is
// handed to the client is not sent. A script already on its way when the caller gives
// up runs, and counts once.
//
// A call that goes out alone, with a context that has no deadline, is the one exception.
// It is sent on its caller's goroutine. A cancellation then ends its wait only when the
// reply comes, within the client's ReadTimeout, as go-redis's own calls do.
//
// The store still reads a late reply, within the client's ReadTimeout, and keeps its
// connection. ReadTimeout is 3s by default, and the fallback package suggests a second.
// With ContextTimeoutEnabled, go-redis would otherwise close the connection. The next
// decision would then pay a new dial and handshake inside its own deadline.
type Store struct {
	// A call goes out on the caller's context without its deadline, from a goroutine of
	// the store's (see noDeadline and await). A lone call of a context without a deadline
	// goes out on its caller's goroutine instead, which spares it two goroutine switches
	// (see patient and flyHere). How batches are formed and how many calls fly at once is
	// the node's, mayFly's and maxFlights' to tell.
	client  redis.Scripter
	process processor // the client's Process, nil if it has none
	prefix  string
	clock   clock.Clock // nil: Redis TIME
	minTTL  int64       // the least TTL of a key written, in milliseconds (WithMinTTL); 0: none
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

// WithPrefix starts every key's name with prefix and a colon. The default is
// DefaultPrefix, and an empty prefix means the default. Braces in prefix would pin every
// key to one hash slot, so they are replaced with parentheses.
//
// # Keys
//
// The state of limiter key k for an algorithm, in a limiter's namespace, lives in Redis
// keys named
//
//	<prefix>:<algorithm>:<part>:<namespace>:<form of k>
//
// The parts of a name are these:
//   - prefix is "rl" by default (WithPrefix).
//   - algorithm is the algorithm's Name, such as "tokenbucket".
//   - part names one of its keys. It is "state", "log" for the sliding log, "leases" for
//     the in-flight limit, or "loans" for a key's record of loans.
//   - namespace is the limiter's. It is its rule's, such as "100/1s", unless
//     ratelimit.WithNamespace names it. It escapes "%", ":", "{" and "}" as
//     ratelimit.Key does.
//   - The form of k keeps every key distinct. It keeps all parts of one key in one Redis
//     Cluster hash slot, whatever the namespace.
//
// The form of k depends on k:
//   - k carries a hash tag: the form is "t:" + k, and the tag is kept. A hash tag is a
//     "{...}" with something inside, by Redis's own rule. Put a tenant's keys on one
//     node on purpose with keys like "{shop-a}:create-order".
//   - k is not empty and has no braces: the form is "{" + k + "}". Each key so hashes on
//     its own: "rl:tokenbucket:state:100/1s:{tenant-42}".
//   - k is empty, or has stray braces: the form is "{" + 16 hex digits of k's 64-bit
//     FNV-1a hash + "}:" + k. No brace a user puts in a key can so steer its slot.
//
// Build keys from untrusted input with care: a key that carries a hash tag keeps it.
//
// A key's state is a string "T:L:A" in decimal. T is the latest instant the key has
// seen, in microseconds since the Unix epoch. L and A are the algorithm's Level and Aux
// (see each algorithm's package doc). The sliding log keeps its events in a list beside
// the state, as pairs (instant, count), oldest first.
//
// An in-flight limit's key is a sorted set alone. It holds each lease's id, scored by
// its expiry in microseconds, with the TTL of the latest lease.
//
// A key's record of loans (Store.Lend) is a hash beside its state. It maps each holder's
// id to "out:until:limit:period". The first field is the events lent and not given back.
// The second is when the loan ends, in microseconds. The last two are the Limit and
// Period of the loan's rule. The hash has the TTL of the latest loan.
//
// Every write sets a TTL: the time until the key is back to its full allowance. The TTL
// is rounded up to a whole millisecond, and is never 0. Idle keys vanish and come back
// full. A key found without a TTL gets one on its next decision.
func WithPrefix(prefix string) Option {
	return optionFunc(func(s *Store) {
		if prefix != "" {
			s.prefix = redisx.Prefix(prefix)
		}
	})
}

// WithClock makes decisions on c's time instead of the Redis server's. Use it for tests,
// or for applications whose clocks are known to agree. Nil means the server's time.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) { s.clock = c })
}

// WithMinTTL keeps every key the store writes for at least d. Use it in tests whose fake
// clock (WithClock) stands still. Redis expires keys in its own time, which passes
// meanwhile, so a key could vanish before the fake clock says it is full again. The
// default, 0, writes each key's TTL as the time until it is full.
func WithMinTTL(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.minTTL = max(1, d.Milliseconds())
		}
	})
}

// WithCalendarClock sets the application's clock. It places the calendar windows of a
// quota (fixedwindow.Quota) around its time. The server's time then chooses among them.
// The default is WithClock's clock, else time.Now. A test that drives the server's TIME
// with a fake clock (miniredis) should give it the same clock.
func WithCalendarClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) { s.places = c })
}

// New returns a Store on client: a *redis.Client, *redis.ClusterClient, *redis.Ring,
// *redis.AutoPipeliner, or any redis.Scripter. It makes no call to Redis.
//
// New panics for a nil client or a nil option, with a message that says so, as net/http
// does for a nil handler. A store without Redis would fail every decision, and only once
// traffic came.
//
// # What each client gives
//
//   - *redis.Client, one server: decisions coalesce. ApplyAll (AllowAll) is one atomic
//     script, whatever its keys.
//   - Sentinel (redis.NewFailoverClient, a *redis.Client to the master the sentinels
//     name): the same. When the master dies, decisions fail with ErrUnavailable until
//     the sentinels promote a replica. A fallback.Store decides them meanwhile.
//     Decisions then go to the new master, about 3s after a kill with
//     down-after-milliseconds 1000 (BENCHMARKS.md). Replication is asynchronous. What the old master counted and had
//     not yet sent is lost, so a key may admit a little more right after.
//   - *redis.ClusterClient: decisions coalesce per master. ApplyAll is one script when
//     its keys share a hash tag (see below).
//   - *redis.Ring, its keys sharded by their hash tag: one call per decision, with no
//     coalescing. ApplyAll is one script when its keys share a hash tag. Otherwise it
//     returns errors.ErrUnsupported, and AllowAll takes the keys one by one with refunds.
//     That is all or none in the end, but not atomic. A shard that goes down fails its
//     keys' decisions until the ring's heartbeat drops it. Its keys then start full on
//     another shard.
//   - *redis.AutoPipeliner: one call per decision, pipelined by go-redis.
//
// # Redis Cluster
//
// On a *redis.ClusterClient, every key of one decision sits in one hash slot (see
// WithPrefix). A decision is so one call to one master.
//
// When a master fails, its slots' decisions are errors wrapping ratelimit.ErrUnavailable
// until a replica takes over. A fallback.Store decides them meanwhile. The cluster's
// cluster-node-timeout (15s by default in Redis) and the failover election set how long
// that takes. Each such error makes the store ask the client to reload its slot map.
// Decisions so move to the new master as soon as it serves the slots, not at go-redis's
// next periodic reload.
//
// Set on the client:
//   - ContextTimeoutEnabled: true, so that the caller's deadline bounds each call at the
//     socket (see Store, "Deadlines").
//   - DialTimeout well under a second (5s by default). A call to a dead master's address
//     waits for the dial.
//   - ClusterStateReloadInterval of a few seconds (60s by default), for the slot moves
//     that no error announces.
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

// Apply runs req's algorithm on Redis. It takes, peeks, refunds or resets, as req.Op
// says, each in one script.
//
// Its errors are these:
//   - ctx.Err() if ctx has ended.
//   - The error of req.Algorithm.Prepare for an invalid rule or n, before any call to
//     Redis.
//   - The client's error, wrapped. It is also wrapped with ratelimit.ErrUnavailable when
//     Redis cannot decide now: a timeout, a lost connection, BUSY, OOM, LOADING or a
//     failover.
//   - ErrUnexpectedReply.
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
// tag + "}:" + Key(parts...). All the keys of one tag, such as a tenant's limits, then
// sit on one Redis Cluster node. Several of them can be decided there in one script
// (ratelimit.AllowAll). Since tag and parts are escaped, none of them can close the tag
// early.
func TaggedKey(tag string, parts ...string) string {
	return redisx.Tagged(tag, parts...)
}
