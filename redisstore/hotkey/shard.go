package hotkey

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
)

// Shard splits one limit over shards keys, each with 1/shards of the rule (Limit and
// Burst divided, rounded down; a Limit below shards is 1 per a Period stretched to
// fit). Requests go to the shards in turn, and a denied one tries up to
// WithRetries (2) more before the answer is "denied", so a key under its total limit is
// not denied by an uneven spread. Each shard's key has a hash tag of its own, so on Redis
// Cluster the shards of one key sit on different nodes.
//
// Decisions report the whole rule's Limit, and Remaining as the shard's times shards (an
// estimate). A request for more than one shard's capacity is an error wrapping
// ratelimit.ErrInvalidN. A peek, a refund or a debit goes to the next shard in turn; a
// reset to every shard.
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
func (s *Shard) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	if !s.cfg.handles(req) {
		return s.next.Apply(ctx, req)
	}
	n := req.N
	if req.Spec.Op == "debit" { // a cost of any size, taken on one shard
		n = 1
	}
	whole, err := req.Spec.Algorithm.Prepare(req.Spec.Rule, n)
	if err != nil {
		return ratelimit.Outcome{}, err
	}
	share := core.Share(req.Spec.Rule, s.shards)
	one, err := req.Spec.Algorithm.Prepare(share, 1)
	if err != nil {
		return ratelimit.Outcome{}, fmt.Errorf("hotkey: shard: %v over %d shards is %v each: %w", req.Spec.Rule, s.shards, share, err)
	}
	if n > one.Limit {
		return ratelimit.Outcome{}, fmt.Errorf("hotkey: shard: n = %d, one of %d shards holds %d: %w",
			req.N, s.shards, one.Limit, ratelimit.ErrInvalidN)
	}
	shareSpec := core.WithRule(req.Spec, share)
	if req.Spec.Op == "reset" { // every shard
		var d ratelimit.Outcome
		for i := range uint64(s.shards) {
			sub := req
			sub.Key, sub.Spec = shardKey(req.Key, i), shareSpec
			if d, err = s.next.Apply(ctx, sub); err != nil {
				return ratelimit.Outcome{}, err
			}
		}
		return whole.Outcome(d.Allowed(), min(whole.Limit, d.Remaining*s.shards), d.Wait, d.Reset), nil
	}
	first := s.turn.Add(1) // a take, or a peek or refund of the next shard in turn
	var best ratelimit.Outcome
	for i := range min(int64(s.cfg.retries)+1, s.shards) {
		sub := req
		sub.Key, sub.Spec = shardKey(req.Key, (first+uint64(i))%uint64(s.shards)), shareSpec
		d, err := s.next.Apply(ctx, sub)
		if err != nil {
			return ratelimit.Outcome{}, err
		}
		if d.Allowed() || i == 0 || d.Wait < best.Wait {
			best = d
		}
		if d.Allowed() || req.Spec.Op != "" {
			break
		}
	}
	return whole.Outcome(best.Allowed(), min(whole.Limit, best.Remaining*s.shards), best.Wait, best.Reset), nil
}

// shardKey is the key of shard i of key: a hash tag of its own (the key's digest and
// the shard), so that redisstore keeps it and the cluster spreads the shards; then the
// key itself, so that distinct keys stay distinct.
func shardKey(key string, i uint64) string {
	return redisx.Shard(key, i)
}
