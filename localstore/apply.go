package localstore

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Apply decides req against the key's state in memory. It takes, peeks, refunds, resets
// or extends, as req.Op says.
//
// It returns ctx.Err() if ctx has ended. It returns the error of req.Algorithm.Prepare
// for an invalid rule or n.
func (s *Store) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	// A take of an existing key finds it without the shard's lock, and decides holding
	// only the key's. A new key, or a sweep due, takes the shard's lock. The step gets the
	// caller's now, and the key's own latest instant in its state. A clock that stepped
	// back is so held per key, and durations count from the caller's clock.
	if err := ctx.Err(); err != nil {
		return core.Outcome{}, err
	}
	if req.Spec != nil && req.Spec.Op != core.OpTake {
		return s.applyOp(req)
	}
	k := s.specs.find(req.Spec)
	if k == nil {
		var err error
		if k, err = s.know(req.Spec); err != nil {
			return core.Outcome{}, err
		}
	}
	if req.N != 1 { // 1 is valid for any rule: know prepared it
		if _, err := req.Args(); err != nil {
			return core.Outcome{}, err
		}
	}
	var now int64 // s.now(), written out: too large to be inlined
	if s.isMono {
		now = (s.monoNano + int64(time.Since(s.monoStart))) / 1000
	} else {
		now = s.otherNow()
	}
	h := s.hash.sum(req.Key) // chooses the shard, and finds the key in it
	sh := &s.shards[h&s.mask]
	sp := k.space
	if sp.ord < fewSpaces && sh.sweptBy(now, s.sweepEvery) { // without the shard's lock
		if t := sh.tables[sp.ord].Load(); t != nil {
			e := t.keys.atHome(h, req.Key)
			if e == nil {
				e = t.keys.get(h, req.Key)
			}
			if e != nil {
				if o, ok := e.take(sp.alg, now, &k.args, req.N, req.Spec.Lease, req.Receipt); ok {
					return o, nil
				}
			}
		}
	}
	return s.takeLocked(sh, k, h, req.Key, req.N, req.Spec.Lease, req.Receipt, now)
}

// take decides args with n and lease on e, unless e was removed since it was found (ok
// false: look again under the shard's lock); an admitted take writes the instant it was
// decided at (the key's, after it) into its receipt, when it carries one.
func (e *entry) take(alg *core.Algorithm, now int64, args *core.Args, n, lease int64, receipt *core.Receipt) (o core.Outcome, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock() // deferred: a third party's Step may panic
	if e.expires == dead {
		return o, false
	}
	if e.expires <= now {
		e.reset()
	}
	a := *args
	a.N, a.Lease = n, lease
	if receipt != nil {
		a.Taken = core.TakenNow
	}
	o = alg.Step(&e.state, now, a)
	e.keep(alg, now, o.Reset)
	if receipt != nil && o.Allowed() {
		receipt.At = e.state.Time
	}
	return o, true
}

// keep sets when e expires after a decision at now whose Outcome's Reset was reset: then,
// or, for an algorithm of leases, no sooner than before (the releases it remembers
// outlive its leases: see internal/concurrency).
func (e *entry) keep(alg *core.Algorithm, now int64, reset time.Duration) {
	until := now + expiry(reset)
	if alg.Extend != nil {
		until = max(until, e.expires)
	}
	e.expires = until
}

// takeLocked is a take under the shard's lock: for a new key, a sweep due, or a key
// removed while Apply looked for it.
func (s *Store) takeLocked(sh *shard, k *known, h uint64, key string, n, lease int64, receipt *core.Receipt, now int64) (core.Outcome, error) {
	sh.mu.Lock()
	defer sh.mu.Unlock() // deferred: a third party's Step that panics must not leave the shard locked
	t := sh.table(k.space)
	sh.sweepIfDue(now, s.sweepEvery)
	e := t.keys.get(h, key)
	if e == nil {
		e = s.add(sh, &t.keys, h, key, now, &entry{})
	}
	o, _ := e.take(k.space.alg, now, &k.args, n, lease, receipt) // an entry in the index under its shard's lock is not dead
	return o, nil
}

// applyOp is Apply for a peek, a refund, a reset, an extension or a debit: each request
// validated whole (a refund's receipt too), without the cache of a Spec's Args that
// takes use.
func (s *Store) applyOp(req core.Request) (core.Outcome, error) {
	a, err := req.Args()
	if err != nil {
		return core.Outcome{}, err
	}
	sp, err := s.space(req.Spec.Algorithm, req.Spec.Namespace)
	if err != nil {
		return core.Outcome{}, err
	}
	h := s.hash.sum(req.Key)
	return s.other(&s.shards[h&s.mask], sp, h, &req, a, s.now())
}

// other is Apply for a peek, a refund, a reset, an extension or a debit, under the
// shard's lock: only a debit adds a key, and a release of a lease (remembered when it was
// not held).
func (s *Store) other(sh *shard, sp *space, h uint64, req *core.Request, args core.Args, now int64) (core.Outcome, error) {
	alg := sp.alg
	switch req.Spec.Op {
	case core.OpPeek, core.OpRefund, core.OpReset:
	case core.OpDebit:
		if alg.Debit == nil {
			return core.Outcome{}, fmt.Errorf("localstore: %s takes no debts", alg.Name)
		}
	case core.OpExtend:
		if alg.Extend == nil {
			return core.Outcome{}, fmt.Errorf("localstore: %s has no leases to extend", alg.Name)
		}
	default:
		return core.Outcome{}, fmt.Errorf("localstore: unknown op %q", req.Spec.Op)
	}
	args.N, args.Lease = req.N, req.Spec.Lease
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.table(sp)
	sh.sweepIfDue(now, s.sweepEvery)
	e := t.keys.get(h, req.Key)
	if e == nil && (req.Spec.Op == core.OpDebit || req.Spec.Op == core.OpRefund && alg.Extend != nil && args.Lease > 0) {
		e = s.add(sh, &t.keys, h, req.Key, now, &entry{}) // a debt, or a lease released before its acquire ran
	}
	if e != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.expires <= now {
			e.reset()
		}
	}
	switch req.Spec.Op {
	case core.OpPeek:
		return sh.peek(alg, e, now, args, false), nil
	case core.OpRefund:
		if e != nil {
			alg.Refund(&e.state, now, args) // the key is full no later than before: expires stays
			if alg.Extend != nil {          // but a lease released while not held is remembered a lease's duration
				e.expires = max(e.expires, now+expiry(time.Duration(args.Period)*time.Microsecond))
			}
		}
	case core.OpReset:
		if e != nil && alg.Void != nil { // forgotten, but for what voids the receipts of its takes
			if keep := alg.Void(&e.state, now, args); keep > 0 {
				e.expires = now + expiry(time.Duration(keep)*time.Microsecond) // as Redis keeps it
				break
			}
		}
		if e != nil {
			e.expires = dead
			t.keys.del(h, req.Key)
			sh.forget(req.Key)
			e = nil
		}
	case core.OpDebit: // then a peek of 1 at the request's reserve
		e.expires = now + expiry(time.Duration(alg.Debit(&e.state, now, args))*time.Microsecond)
		if args.Taken == core.TakenNow { // a take whatever the key has, with its receipt
			req.Receipt.At = e.state.Time
		}
		args.N, args.Lease, args.Taken = 1, 0, 0
		return sh.peek(alg, e, now, args, false), nil
	case core.OpExtend:
		held := e != nil && alg.Extend(&e.state, now, args)
		o := sh.peek(alg, e, now, args, true)
		if !held {
			return args.Outcome(false, o.Remaining, o.Wait, o.Reset), nil
		}
		e.expires = max(e.expires, now+expiry(o.Reset))
		return args.Outcome(true, o.Remaining, 0, o.Reset), nil // held, a lease waits for nothing, whatever a new one would
	}
	return sh.peek(alg, e, now, args, true), nil
}

// peek is the Outcome of a take of args on e's state (a fresh state when e is nil),
// changing nothing, on the shard's scratch copy; sh.mu is held. After a refund, a reset
// or an extension (after) it is the answer, as a peek of 1, of a new lease.
func (sh *shard) peek(alg *core.Algorithm, e *entry, now int64, args core.Args, after bool) core.Outcome {
	if after {
		args.N, args.Lease, args.Keep = 1, 0, 0
	}
	st := &sh.scratch
	*st = core.State{}
	if e != nil {
		*st = e.state
	}
	if st.Log != nil {
		sh.scratchLog.CopyFrom(st.Log)
	} else {
		sh.scratchLog.Clear() // for an algorithm that keeps a log, a fresh one
	}
	st.Log = &sh.scratchLog
	return alg.Step(st, now, args)
}
