package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// warmTarget is how many connections the store keeps warm for its flights to a node:
// maxFlights to a server that answers within maxWait, as many as it may keep in flight
// to one further away.
func (s *Store) warmTarget() int {
	if s.flightTime.Load() > int64(maxWait) {
		return s.maxFlightsFar
	}
	return maxFlights
}

// warm opens and readies limit connections to n in the background, unless a warming
// runs already: limit PINGs at once, so that each needs a connection of its own. go-redis
// dials a connection when a call finds none idle, and readies it (HELLO, CLIENT SETINFO:
// round trips of their own) within that first call; warmed first, a flight never pays for
// a connection inside the decisions it carries, which on a Redis a few milliseconds away
// would take them past a fallback's timeout. The PINGs' round trips are timed too: the
// first decisions then see how far the server is (see mayFly). A warming that fails
// is tried again by a decision a second later or more.
func (s *Store) warm(n *node, limit int) {
	if time.Now().UnixNano() < n.warmAfter.Load() || !n.warming.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer n.warming.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
		defer cancel()
		if s.warmNow(ctx, n, limit) != nil { // a server down: not again at every decision
			wait := min(warmRetry<<min(n.warmFailures.Add(1)-1, 5), warmMaxRetry)
			n.warmAfter.Store(time.Now().Add(wait).UnixNano())
			return
		}
		n.warmFailures.Store(0)
	}()
}

// warmNow is warm's work, done before it returns.
func (s *Store) warmNow(ctx context.Context, n *node, limit int) error {
	errs := make([]error, limit)
	var wg sync.WaitGroup
	for i := range limit {
		wg.Go(func() {
			start := time.Now()
			if errs[i] = ping(noDeadline{ctx}, n.to); errs[i] == nil {
				s.timed(time.Since(start))
			}
		})
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil && n.warmed.Load() < int32(limit) {
		n.warmed.Store(int32(limit))
	}
	return err
}

// ping sends a PING to to, on a goroutine of the store's (see clientPanic).
func ping(ctx context.Context, to processor) (err error) {
	defer clientPanic("warming", &err)
	return to.Process(ctx, redis.NewStatusCmd(ctx, "ping"))
}

// warmTimeout bounds a warming's PINGs; warmRetry is how long after a failed warming the
// next may start, doubled after each further failure up to warmMaxRetry: a server that
// refuses connections (down, or asking for a password the client lacks) is not dialled
// a pool's worth of times a second.
const (
	warmTimeout  = 5 * time.Second
	warmRetry    = time.Second
	warmMaxRetry = 30 * time.Second
)

// timed records how long a flight took: flightTime moves an eighth of the way to it (is
// set to it, the first time).
func (s *Store) timed(d time.Duration) {
	for {
		old, now := s.flightTime.Load(), int64(d)
		if old != 0 {
			now = old + (now-old)/8
		}
		if s.flightTime.CompareAndSwap(old, max(1, now)) {
			return
		}
	}
}
