package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// orphans are the leases of in-flight limits that acquires may have taken without their
// callers ever learning it: the caller gave up, or the reply was lost, while the script
// was on its way or queued in a Redis that had stopped (SIGSTOP, a long fork, a network
// that holds packets). Such a lease would hold a slot nobody releases until it expires,
// and turn a short stall into an outage of the lease's duration once Redis answers
// again. Each is released in the background, again and again while Redis does not
// answer, until a release succeeds or the lease would have expired anyway. The release
// may run before its acquire: each goes on a connection of its own (the acquire's was
// closed when its caller gave up), and a Redis that resumes runs the commands waiting in
// its sockets in no order between connections. Either order ends the same: a release of
// a lease not held is remembered for a lease's duration, and the acquire that runs after
// it takes nothing (see internal/concurrency).
type orphans struct {
	mu      sync.Mutex
	pending []orphan
	running bool // a goroutine releases them now
}

type orphan struct {
	req   core.Request
	until time.Time // when the lease expires anyway
}

// orphanTimeout bounds one release; orphanBackoff is the first wait between rounds of
// releases that failed, doubled up to orphanMaxBackoff.
const (
	orphanTimeout    = time.Second
	orphanBackoff    = 10 * time.Millisecond
	orphanMaxBackoff = time.Second
)

// releaseLater releases the lease that acq, an acquire whose caller had no answer, may
// have taken, in the background; lease is its duration in microseconds.
func (s *Store) releaseLater(acq core.Request, lease int64) {
	req := core.Request{Key: acq.Key, N: 1, Spec: core.WithOp(acq.Spec, core.OpRefund)}
	o := &s.orphans
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pending = append(o.pending, orphan{req, time.Now().Add(time.Duration(lease) * time.Microsecond)})
	if !o.running {
		o.running = true
		go s.releaseOrphans()
	}
}

// releaseOrphans releases the pending orphans until none is left.
func (s *Store) releaseOrphans() {
	o := &s.orphans
	backoff := orphanBackoff
	for {
		o.mu.Lock()
		batch := o.pending
		o.pending = nil
		if len(batch) == 0 {
			o.running = false
			o.mu.Unlock()
			return
		}
		o.mu.Unlock()
		var failed []orphan
		for _, x := range batch {
			if time.Now().After(x.until) {
				continue // expired by itself
			}
			ctx, cancel := context.WithTimeout(context.Background(), orphanTimeout)
			_, err := s.Apply(ctx, x.req)
			cancel()
			if err != nil {
				failed = append(failed, x)
			}
		}
		if len(failed) == 0 {
			backoff = orphanBackoff
			continue
		}
		o.mu.Lock()
		o.pending = append(o.pending, failed...)
		o.mu.Unlock()
		time.Sleep(backoff) // Redis does not answer: try again a little later
		backoff = min(2*backoff, orphanMaxBackoff)
	}
}
