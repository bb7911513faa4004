package localstore

import (
	"context"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/lend"
)

var _ core.Lender = (*Store)(nil)

// Lend decides each loan in turn, atomically on its key, as a take is. A key's record of
// loans is kept apart from its state, as on Redis. It lasts until the key's last loan
// ends, whatever the state's expiry, a reset or an eviction.
//
// It returns ctx.Err() if ctx has ended. An invalid loan is an error, before anything is
// lent: an algorithm that does not lend, no holder, or an invalid rule.
func (s *Store) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	// Each loan is decided under its key's lock, the key found (or added) under its
	// shard's lock, as a take is. The records of loans sit in the shard, apart from the
	// entries, so that the keys never lent carry nothing for them.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	args := make([]core.Args, len(loans))
	spaces := make([]*space, len(loans))
	for i, l := range loans {
		if err := lend.Check(l); err != nil {
			return nil, err
		}
		var err error
		if args[i], err = lend.Args(l); err != nil {
			return nil, err
		}
		if spaces[i], err = s.space(l.Spec.Algorithm, l.Spec.Namespace); err != nil {
			return nil, err
		}
	}
	lent := make([]core.Lent, len(loans))
	now := s.now()
	for i, l := range loans {
		lent[i] = s.lendOne(spaces[i], l, args[i], now)
	}
	return lent, nil
}

// lendOne decides l, of args a, on its key at now.
func (s *Store) lendOne(sp *space, l core.Loan, a core.Args, now int64) core.Lent {
	h := s.hash.sum(l.Key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.table(sp)
	sh.sweepIfDue(now, s.sweepEvery)
	e := t.keys.get(h, l.Key)
	if e == nil {
		e = s.add(sh, &t.keys, h, l.Key, now, &entry{})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.expires <= now {
		e.reset()
	}
	k := loanKey{sp, l.Key}
	out, recs := lend.Decide(sp.alg, &e.state, sh.loans[k], now, a, l)
	e.expires = now + expiry(out.Reset)
	if len(recs) == 0 {
		delete(sh.loans, k)
		return out
	}
	if sh.loans == nil {
		sh.loans = map[loanKey][]lend.Record{}
	}
	sh.loans[k] = recs
	return out
}

// ended reports whether every record of recs ended by now.
func ended(recs []lend.Record, now int64) bool {
	for _, r := range recs {
		if r.Until > now {
			return false
		}
	}
	return true
}
