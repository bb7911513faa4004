package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
	"github.com/ratelimit-go/ratelimit/internal/script"
)

// DefaultMaxBatch is how many decisions one call of the batch script decides at most,
// unless WithMaxBatch says otherwise.
const DefaultMaxBatch = 128

// maxFlights is how many calls one store keeps in flight at once to a server whose
// calls are expected to land soon (see mayFly): more than one, so that a node has the
// next batch to run while the reply of one travels back and its callers queue their
// next decisions. On loopback, with 2 CPUs shared with the server, two decided more than
// three at 32 and at 256 callers, and one less than two. A cluster's masters share them,
// each with one at least.
const maxFlights = 2

// maxFlightsFar bounds the calls in flight at once to a server whose calls take long:
// at most this many, and half of the client's pool, so that the store's flights never
// wait for a connection of its own pool and leave room for the application's commands.
const maxFlightsFar = 16

// maxWait is the longest a decision waits for a flight to land before it takes one of
// its own (while the store has fewer than maxFlightsFar in flight): on loopback a flight
// lands within it and decisions ride together; to a server a few milliseconds away,
// decisions that arrive together go out at once, not a round trip later behind the
// calls in flight.
const maxWait = 500 * time.Microsecond

// MaxBatch is the most decisions WithMaxBatch allows in one call.
const MaxBatch = 1000

// WithMaxBatch sets how many waiting decisions one script call decides at most. It is
// DefaultMaxBatch by default, and MaxBatch at most. Less than 1 means the default. 1
// turns coalescing off: one call per decision.
func WithMaxBatch(n int) Option {
	// MaxBatch bounds it because a batch script unpacks its calls' keys and its reply's
	// values onto Lua's stack, which holds 8000 values at most.
	return optionFunc(func(s *Store) {
		if n >= 1 {
			s.maxBatch = min(n, MaxBatch)
		}
	})
}

// call is one decision on its way to Redis.
type call struct {
	ctx    context.Context
	alg    *core.Algorithm
	sc     *luaScript
	ra     *ruleArgs
	a      core.Args
	op     int // script.OpCode's
	now    any // the store's clock in microseconds, or "" for Redis's (see Store.now)
	key    redisx.Key
	window [3]any // a windowed algorithm's window (Store.window); "" for others

	d    core.Outcome
	at   int64 // the instant a take with a receipt was decided at (Receipt.At)
	err  error
	done chan struct{} // gets a value when d and err are set (a call that waits for a batch)
}

// waitingCalls recycles the calls that wait for a batch, with their channels.
var waitingCalls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// values are the call's arguments, as its step reads them (script.Values).
func (c *call) values() script.Values {
	var v script.Values
	v[script.N], v[script.Limit], v[script.Period], v[script.Unit], v[script.Rate] = c.a.N, c.ra.limit, c.ra.period, c.ra.unit, c.ra.rate
	v[script.Now], v[script.Op], v[script.Lease], v[script.Keep] = c.now, c.op, c.a.Lease, c.a.Keep
	v[script.WindowStart], v[script.WindowEnd], v[script.WindowNext] = c.window[0], c.window[1], c.window[2]
	v[script.Taken] = c.a.Taken
	return v
}

// receipt reports whether c is a take with a receipt, whose answer carries the instant
// it was decided at.
func (c *call) receipt() bool { return c.a.Taken == script.TakenNow }

// errAlone marks a batch that must be decided one by one: a key moved, a node without
// script flags.
var errAlone = errors.New("redisstore: decide alone")

// errGaveUp marks a call whose caller has given up: its context ended before its batch
// went out, or its batch waited for a connection until the latest of its callers'
// deadlines (and so past its own). Its caller returns its context's error, never this.
var errGaveUp = errors.New("redisstore: the caller gave up")

// node is the coalescing queue of one Redis server (the store's client, or one master
// of a cluster; see Store, "Coalescing"). A batch saves Redis its cost per command
// (parsing, the script's lookup, the reply), and go-redis its pool and round trip, once
// for each decision but one. A decision that finds its node idle (no call in
// flight) goes out alone; the others wait in the node's queue. The first to wait while a
// flight is free (mayFly) yields once, so that the callers on their way join it, and
// sends the batch; when a call lands with decisions waiting, the next batch goes out, and
// so on until none is left. A batch goes out from a goroutine of the store's (fly), never
// on a caller's deadline: it ends at the latest of its callers' deadlines; only a lone
// call of a caller without a deadline goes out on the caller's goroutine (flyHere). On a
// cluster the batch script declares one key, for the routing, reads the others' names
// from its arguments (the allow-cross-slot-keys flag allows keys of other slots on the
// same node) and touches every key before it writes any, so that a key the node does
// not hold fails it before any write. A server without script flags (Redis 6) makes the
// store decide one by one from then on.
type node struct {
	to      processor // where its batches go
	cluster bool
	mu      sync.Mutex
	flights int
	waiting []*call
	// when each flight's call went out (UnixNano), by the flight's slot; 0 for a free one
	sent [maxFlightsFar]int64
	// how many connections of the client's pool its flights have been warmed to (see
	// warm), whether a warming runs now, when one may next be tried after one failed
	// (UnixNano), and how many failed in a row
	warmed       atomic.Int32
	warming      atomic.Bool
	warmAfter    atomic.Int64
	warmFailures atomic.Int32 // warmings that failed in a row
}

// coalescing reports whether decisions may ride together: a *redis.Client, or a
// *redis.ClusterClient on servers with script flags, and WithMaxBatch above 1.
func (s *Store) coalescing() bool {
	if s.maxBatch < 2 || s.process == nil {
		return false
	}
	switch s.client.(type) {
	case *redis.Client:
		return true
	case *redis.ClusterClient:
		return !s.noFlags.Load()
	}
	return false
}

// coalesce decides c alone if its node is idle, else with the next batch to its node.
// A lone call whose caller waits for its reply whatever comes (see patient) goes out on
// the caller's goroutine (flyHere); any other from a goroutine of the store's (see fly),
// and the caller waits for it only as long as its context allows: a reply that comes
// after the caller has given up is still read, and its connection kept.
func (s *Store) coalesce(ctx context.Context, c *call) (core.Outcome, error) {
	n, err := s.node(ctx, c)
	if err != nil {
		return s.single(ctx, c) // the cluster client says why, or routes it
	}
	if limit := s.warmTarget(); n.warmed.Load() < int32(limit) {
		s.warm(n, limit)
	}
	w := waitingCalls.Get().(*call)
	done := w.done
	*w = *c
	w.ctx, w.done = ctx, done
	n.mu.Lock()
	if n.flights == 0 && patient(ctx) {
		s.flyHere(n, s.reserve(n), w) // unlocks n.mu
		return s.answered(ctx, c, w)
	}
	n.waiting = append(n.waiting, w)
	switch {
	case n.flights == 0: // an idle node: at once, alone
		s.launch(n, s.reserve(n), 1)
	case s.mayFly(n):
		slot := s.reserve(n)
		if len(n.waiting) == 1 {
			// the first to wait while other flights are out: the callers that a landing
			// flight just answered are likely runnable on this P, on their way here, and
			// would otherwise each take a flight of its own
			n.mu.Unlock()
			runtime.Gosched()
			n.mu.Lock()
		}
		s.launch(n, slot, s.maxBatch)
	default:
		n.mu.Unlock()
	}
	select {
	case <-w.done:
	case <-ctx.Done(): // w is left to its flight, not recycled
		return core.Outcome{}, s.ended(ctx, c)
	}
	return s.answered(ctx, c, w)
}

// answered is the answer of c from w, its call that has landed, which goes back to
// waitingCalls.
func (s *Store) answered(ctx context.Context, c, w *call) (core.Outcome, error) {
	d, err := w.d, w.err
	c.at = w.at
	*w = call{done: w.done}
	waitingCalls.Put(w)
	if errors.Is(err, errAlone) {
		return s.single(ctx, c)
	}
	if errors.Is(err, errGaveUp) {
		// this caller's context ended before its batch went out, or ends now
		return core.Outcome{}, s.ended(ctx, c)
	}
	return d, err
}

// ended is the error of a call whose context ended before its answer came, as a call
// sent alone gets it: a deadline is Redis not deciding in time (ErrUnavailable, and the
// deadline), a cancellation the caller's own, which says nothing about Redis.
func (s *Store) ended(ctx context.Context, c *call) error {
	<-ctx.Done()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return s.failed(c.sc.alg, ctx.Err())
	}
	return ctx.Err()
}

// mayFly reports whether another call may go out to n now, n.mu held: while n has none
// in flight; while n and the store have fewer than maxFlights; and while they have fewer
// than maxFlightsFar (and half of the client's pool) and none of n's is expected to land
// within maxWait (it went out a round trip ago, as flightTime measures it).
func (s *Store) mayFly(n *node) bool {
	flying := int(s.flying.Load())
	switch {
	case n.flights == 0:
		return true
	case n.flights < maxFlights && flying < maxFlights:
		return true
	case n.flights >= s.maxFlightsFar || flying >= s.maxFlightsFar:
		return false
	}
	first := int64(0) // when the first of n's flights to land went out
	for _, at := range n.sent {
		if at != 0 && (first == 0 || at < first) {
			first = at
		}
	}
	return first+s.flightTime.Load()-time.Now().UnixNano() > int64(maxWait)
}

// reserve takes a free flight slot of n for a call that goes out now; n.mu is held.
func (s *Store) reserve(n *node) int {
	slot := slices.Index(n.sent[:], 0)
	n.sent[slot] = time.Now().UnixNano()
	n.flights++
	s.flying.Add(1)
	return slot
}

// launch sends up to max waiting calls in the flight of slot, reserved, and unlocks
// n.mu; with none left waiting (a landing flight took them), it frees the slot.
func (s *Store) launch(n *node, slot, max int) {
	batch := n.take(max)
	if len(batch) == 0 {
		n.sent[slot] = 0
		n.flights--
		s.flying.Add(-1)
		n.mu.Unlock()
		return
	}
	n.mu.Unlock()
	go s.fly(n, slot, batch)
}

// take removes up to max waiting calls; n.mu is held.
func (n *node) take(max int) []*call {
	k := min(max, len(n.waiting))
	batch := make([]*call, k)
	copy(batch, n.waiting)
	rest := copy(n.waiting, n.waiting[k:])
	clear(n.waiting[rest:])
	n.waiting = n.waiting[:rest]
	return batch
}

// patient reports whether a caller on ctx waits for its call's reply whenever it comes:
// ctx has no deadline and no send-by time, so only a cancellation ends it, and a
// cancelled caller that waits for the reply (at most the client's ReadTimeout, as
// go-redis's callers without ContextTimeoutEnabled do) loses nothing.
func patient(ctx context.Context) bool {
	if ctx.Done() == nil {
		return true
	}
	if _, ok := ctx.Deadline(); ok {
		return false
	}
	_, ok := core.SendBy(ctx)
	return !ok
}

// flyHere sends w alone to n, an idle node, on its caller's goroutine, in the flight of
// slot, reserved, and unlocks n.mu: a lone decision then costs the round trip and no
// goroutine switch (a flight goroutine and the caller's waking cost more than a tenth of
// a loopback round trip on 2 CPUs). The decisions that queued meanwhile go out on a
// goroutine of the store's, as they do after any flight.
func (s *Store) flyHere(n *node, slot int, w *call) {
	n.mu.Unlock()
	s.flyBatch(n, []*call{w})
	<-w.done
	if batch := s.next(n, slot); batch != nil {
		go s.fly(n, slot, batch)
	}
}

// fly sends batches to n, in the flight of its slot, until none is waiting.
func (s *Store) fly(n *node, slot int, batch []*call) {
	for batch != nil {
		s.flyBatch(n, batch)
		// The callers just answered are runnable on this goroutine's P: yielding once
		// lets them run and queue their next decisions before the next batch is taken,
		// rather than leave them for a batch of their own.
		runtime.Gosched()
		batch = s.next(n, slot)
	}
}

// next is the batch that goes out next in the flight of slot, whose call has landed: the
// decisions waiting, or nil when none is, and the slot is freed.
func (s *Store) next(n *node, slot int) []*call {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.waiting) == 0 {
		n.sent[slot] = 0
		n.flights--
		s.flying.Add(-1)
		return nil
	}
	n.sent[slot] = time.Now().UnixNano()
	return n.take(s.maxBatch)
}

// flyBatch decides batch in one call of the batch script (or of the algorithm's own
// script, for a batch of one), and hands each call its answer. Calls whose callers have
// given up are left out. The call is sent on its callers' contexts without their
// deadlines (see noDeadline), so that a reply that comes after they have given up is
// still read and its connection kept.
func (s *Store) flyBatch(n *node, batch []*call) {
	live := batch[:0]
	now := time.Now()
	for _, c := range batch {
		switch {
		case c.ctx.Err() != nil: // its caller has given up (see errGaveUp)
			c.err = errGaveUp
		case core.Unsendable(c.ctx, now): // decided elsewhere by now: counted nowhere here
			c.err = fmt.Errorf("redisstore: %w", core.ErrNotSent)
		default:
			live = append(live, c)
			continue
		}
		c.done <- struct{}{}
	}
	if len(live) == 0 {
		return
	}
	start := time.Now()
	if len(live) == 1 {
		c := live[0]
		sctx, cancel := sendContext(c.ctx)
		c.d, c.err = s.safeSingle(sctx, c) // writes c.at
		cancel()
		if errors.Is(c.err, context.Canceled) && c.ctx.Err() == nil && core.Unsendable(c.ctx, time.Now()) {
			c.err = fmt.Errorf("redisstore: %w", core.ErrNotSent) // it waited for a connection until its send-by time
		}
		if c.err == nil {
			s.timed(time.Since(start))
		}
		c.done <- struct{}{}
		return
	}
	ctx, cancel := batchContext(live)
	ds, err := s.safeDecideBatch(noDeadline{ctx}, n, live)
	waitedOut := err != nil && ctx.Err() != nil // it waited for a connection until the latest of its callers' deadlines
	cancel()
	if err == nil { // a failed call's time says how long a timeout is, not a round trip
		s.timed(time.Since(start))
	}
	now = time.Now()
	for i, c := range live {
		switch {
		case waitedOut && core.Unsendable(c.ctx, now):
			c.err = fmt.Errorf("redisstore: %w", core.ErrNotSent)
		case waitedOut:
			c.err = errGaveUp
		case err != nil:
			c.err = err
		default:
			c.d, c.at, c.err = ds[i].d, ds[i].at, ds[i].err
		}
		c.done <- struct{}{}
	}
}

// safeSingle is single, and safeDecideBatch decideBatch, with a panic of the client
// turned into an error (see clientPanic): they run on a goroutine of the store's.
func (s *Store) safeSingle(ctx context.Context, c *call) (d core.Outcome, err error) {
	defer clientPanic(c.sc.alg, &err)
	return s.single(ctx, c)
}

// batchContext is the context of a batch's call: no caller's cancellation reaches it,
// and it ends at the latest of the callers' deadlines, or send-by times where they have
// one (core.WithSendBy; never, if one has neither). A batch is sent on it without its
// deadline (see noDeadline): go-redis waits for a connection only until it ends, and
// reads the reply whenever it comes.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range batch {
		d, ok := core.SendBy(c.ctx)
		if !ok {
			d, ok = c.ctx.Deadline()
		}
		if !ok {
			return context.Background(), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// node is the queue of c's server: the store's for a single client; on a cluster, the
// master of c's slot.
func (s *Store) node(ctx context.Context, c *call) (*node, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return s.one, nil
	}
	master, err := cc.MasterForKey(ctx, c.key.Name(c.sc.names[0]))
	if err != nil {
		return nil, err
	}
	if n, ok := s.nodes.Load(master); ok {
		return n.(*node), nil
	}
	got, _ := s.nodes.LoadOrStore(master, &node{to: master, cluster: true})
	return got.(*node), nil
}
