package hotkey

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/lend"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
)

// Shard splits one limit over shards keys, each with 1/shards of the rule. Limit and
// Burst are divided and rounded down, so the shards together admit at most the rule. A
// Limit below shards becomes 1 per a Period stretched to fit, and a Burst is at least 1.
// Then each shard still holds 1, so up to shards requests may pass at once.
//
// Requests go to the shards in turn. A denied one tries up to WithRetries (2) more
// shards before the answer is "denied". So a key under its total limit is not denied by
// an uneven spread. Each shard's key has a hash tag of its own. So on Redis Cluster the
// shards of one key sit on different nodes.
//
// Decisions report the whole rule's Limit. Their Remaining is the shard's times shards,
// an estimate. A request for more than one shard's capacity is an error wrapping
// ratelimit.ErrInvalidN. A peek goes to the next shard in turn. A refund goes to the
// shard its receipt names, the one that took its events. A debit is spread over every
// shard, and a reset goes to every shard.
type Shard struct {
	next   ratelimit.Store
	shards int64
	cfg    hotConfig
	turn   atomic.Uint64
}

var _ ratelimit.Store = (*Shard)(nil)

// NewShard returns a Shard of shards keys (at least 1) over next. It panics for a nil
// next or a nil option.
func NewShard(next ratelimit.Store, shards int, opts ...ShardOption) *Shard {
	return &Shard{next: next, shards: int64(max(1, shards)),
		cfg: newHotConfig("NewShard", next, opts, ShardOption.applyShard)}
}

// Apply decides on the shards in turn.
func (s *Shard) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if !s.cfg.handles(req) {
		return s.next.Apply(ctx, req)
	}
	n := req.N
	if req.Spec.Op == core.OpDebit { // a cost of any size, spread over every shard
		if _, err := req.Args(); err != nil {
			return core.Outcome{}, err
		}
		n = 1
	}
	whole, shareSpec, err := s.split(req.Spec, n)
	if err != nil {
		return core.Outcome{}, err
	}
	if req.Spec.Op == core.OpRefund && req.Receipt != nil && !core.OfLeases(req.Spec.Algorithm) {
		return s.refund(ctx, req, whole, shareSpec)
	}
	switch req.Spec.Op {
	case core.OpReset: // every shard
		var d core.Outcome
		for i := range uint64(s.shards) {
			sub := req
			sub.Key, sub.Spec = shardKey(req.Key, i), shareSpec
			if d, err = s.next.Apply(ctx, sub); err != nil {
				return core.Outcome{}, err
			}
		}
		return s.whole(whole, d), nil
	case core.OpDebit:
		if r := req.Receipt; r != nil && r.At == 0 { // a take whatever the key has, with its receipt: of the next shard
			shard := s.turn.Add(1) % uint64(s.shards)
			sub := req
			sub.Key, sub.Spec, sub.Receipt = shardKey(req.Key, shard), shareSpec, &core.Receipt{}
			d, err := s.next.Apply(ctx, sub)
			if err != nil {
				return core.Outcome{}, err
			}
			r.At, r.Via, r.Next = sub.Receipt.At, int64(shard), sub.Receipt
			return s.whole(whole, d), nil
		}
		return s.debit(ctx, req, whole, shareSpec)
	}
	first := s.turn.Add(1) // a take, or a peek of the next shard in turn
	var best core.Outcome
	for i := range min(int64(s.cfg.retries)+1, s.shards) {
		shard := (first + uint64(i)) % uint64(s.shards)
		sub := req
		sub.Key, sub.Spec = shardKey(req.Key, shard), shareSpec
		if req.Receipt != nil && req.Spec.Op == core.OpTake { // the receipt says which shard took it, and holds that shard's
			sub.Receipt = &core.Receipt{}
		}
		d, err := s.next.Apply(ctx, sub)
		if err != nil {
			return core.Outcome{}, err
		}
		if d.Allowed() || i == 0 || d.Wait < best.Wait {
			best = d
		}
		if d.Allowed() && req.Receipt != nil && req.Spec.Op == core.OpTake {
			req.Receipt.At, req.Receipt.Via, req.Receipt.Next = sub.Receipt.At, int64(shard), sub.Receipt
		}
		if d.Allowed() || req.Spec.Op != core.OpTake {
			break
		}
	}
	return s.whole(whole, best), nil
}

// refund gives a take's events back to the shard its receipt names, as far as that shard
// would still hold them; a receipt of no shard of this key gives nothing back (a peek).
func (s *Shard) refund(ctx context.Context, req core.Request, whole core.Args, shareSpec *core.Spec) (core.Outcome, error) {
	r := req.Receipt
	sub := req
	sub.Spec, sub.Receipt = shareSpec, r.Next
	if r.Next == nil || r.Via < 0 || r.Via >= s.shards {
		sub.Spec, sub.N, sub.Receipt, r = core.WithOp(shareSpec, core.OpPeek), 1, nil, &core.Receipt{}
	}
	sub.Key = shardKey(req.Key, uint64(r.Via))
	d, err := s.next.Apply(ctx, sub)
	if err != nil {
		return core.Outcome{}, err
	}
	return s.whole(whole, d), nil
}

// whole is a shard's Outcome o as the whole key's, of Args whole: its Limit, and
// Remaining the shard's times shards (an estimate).
func (s *Shard) whole(whole core.Args, o core.Outcome) core.Outcome {
	return whole.Outcome(o.Allowed(), min(whole.Limit, o.Remaining*s.shards), o.Wait, o.Reset)
}

// split is the Args of a request of n under spec's whole rule, and the Spec of each
// shard's part: 1/shards of the rule. The error of a rule the algorithm refuses, or of an
// n more than one shard ever admits.
func (s *Shard) split(spec *core.Spec, n int64) (core.Args, *core.Spec, error) {
	whole, err := spec.Algorithm.Prepare(spec.Rule, n)
	if err != nil {
		return core.Args{}, nil, err
	}
	share := core.Share(spec.Rule, s.shards)
	one, err := spec.Algorithm.Prepare(share, 1)
	if err != nil {
		return core.Args{}, nil, fmt.Errorf("hotkey: shard: %v over %d shards is %v each: %w", spec.Rule, s.shards, share, err)
	}
	if n > one.Limit {
		return core.Args{}, nil, fmt.Errorf("hotkey: shard: n = %d, one of %d shards holds %d: %w",
			n, s.shards, one.Limit, ratelimit.ErrInvalidN)
	}
	return whole, core.WithRule(spec, share), nil
}

// debit spreads a debit of req.N over every shard, as evenly as whole events allow (the
// first N mod shards take one more), so that the key owes it whichever shard its next
// requests reach. The Outcome is the key's after it: allowed if any shard would admit
// a request of 1, Remaining the shards' sum, the shortest wait of a denial and the
// longest reset.
func (s *Shard) debit(ctx context.Context, req core.Request, whole core.Args, shareSpec *core.Spec) (core.Outcome, error) {
	each, extra := req.N/s.shards, req.N%s.shards
	allowed, remaining, wait, reset := false, int64(0), time.Duration(-1), time.Duration(0)
	for i := range s.shards {
		sub := req
		sub.Key, sub.Spec, sub.N = shardKey(req.Key, uint64(i)), shareSpec, each
		if i < extra {
			sub.N++
		}
		if sub.N == 0 { // a debit smaller than the shards: the others owe nothing, and are asked as they stand
			sub.N, sub.Spec = 1, core.WithOp(shareSpec, core.OpPeek)
		}
		d, err := s.next.Apply(ctx, sub)
		if err != nil {
			return core.Outcome{}, err
		}
		allowed = allowed || d.Allowed()
		remaining += d.Remaining
		if !d.Allowed() && (wait < 0 || d.Wait < wait) {
			wait = d.Wait
		}
		reset = max(reset, d.Reset)
	}
	if allowed {
		wait = 0
	}
	return whole.Outcome(allowed, min(whole.Limit, remaining), max(0, wait), reset), nil
}

// shardKey is the key of shard i of key: a hash tag of its own (the key's digest and
// the shard), so that redisstore keeps it and the cluster spreads the shards; then the
// key itself, so that distinct keys stay distinct.
func shardKey(key string, i uint64) string {
	return redisx.Shard(key, i)
}

var _ core.Lender = (*Shard)(nil)

// Lend grants part of a request, a loan without a holder (AlgorithmLimiter.AllowAtMost).
// It tries the shards in turn, as a take does: up to WithRetries more while it has
// granted less than it wants. Its Outcome reports the whole rule's Limit. Its Remaining is the last shard's times
// shards, an estimate. A partial take's debit is spread over the shards, as Apply spreads
// one.
//
// Loans to a holder (Leases) are refused with an error wrapping errors.ErrUnsupported.
// Put Leases under the Shard, or the Shard under Leases' next store. A next store that
// does not lend gives such an error too.
func (s *Shard) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	l, ok := s.next.(core.Lender)
	if !ok {
		return nil, fmt.Errorf("hotkey: Shard over %T, which does not lend: %w", s.next, errors.ErrUnsupported)
	}
	out := make([]core.Lent, len(loans))
	for i, loan := range loans {
		if loan.Spec == nil || loan.Spec.Algorithm == nil {
			return nil, errors.New("hotkey: shard: a loan without an algorithm")
		}
		if !s.cfg.handles(core.Request{Key: loan.Key, N: 1, Spec: loan.Spec}) {
			got, err := l.Lend(ctx, loans[i:i+1])
			if err != nil {
				return nil, err
			}
			out[i] = got[0]
			continue
		}
		if loan.Holder != 0 {
			return nil, fmt.Errorf("hotkey: a Shard lends no leases (holder %d): %w", loan.Holder, errors.ErrUnsupported)
		}
		if loan.Spec.Op == core.OpDebit { // a debit, spread over the shards as Apply spreads it
			if err := lend.Check(loan); err != nil {
				return nil, err
			}
			o, err := s.Apply(ctx, core.Request{Key: loan.Key, N: loan.Want, Spec: loan.Spec})
			if err != nil {
				return nil, err
			}
			out[i] = core.Lent{N: loan.Want, Outcome: o}
			continue
		}
		whole, shareSpec, err := s.split(loan.Spec, 1)
		if err != nil {
			return nil, err
		}
		first := s.turn.Add(1)
		var granted int64
		var last core.Outcome
		for j := range min(int64(s.cfg.retries)+1, s.shards) {
			sub := loan
			sub.Key, sub.Spec, sub.Want = shardKey(loan.Key, (first+uint64(j))%uint64(s.shards)), shareSpec, loan.Want-granted
			got, err := l.Lend(ctx, []core.Loan{sub})
			if err != nil {
				return nil, err
			}
			granted += got[0].N
			if j == 0 || got[0].N > 0 || got[0].Wait < last.Wait {
				last = got[0].Outcome
			}
			if granted >= loan.Want {
				break
			}
		}
		wait := last.Wait
		if granted > 0 {
			wait = 0
		}
		out[i] = core.Lent{N: granted, Outcome: whole.Outcome(granted > 0, min(whole.Limit, last.Remaining*s.shards), wait, last.Reset)}
	}
	return out, nil
}
