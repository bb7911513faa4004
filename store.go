package ratelimit

import (
	"context"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Store keeps the state of every key, and decides each request of a limiter atomically.
// localstore.New keeps it in memory; redisstore.New keeps it in Redis. The fallback and
// hotkey packages wrap a Store in another.
//
// Limiters of different algorithms and namespaces may share one Store. Implementations
// are safe for concurrent use. The method is the stores' contract with the limiters;
// this module's packages implement it.
type Store interface {
	Apply(ctx context.Context, req core.Request) (core.Outcome, error)
}

// Algorithm is one rate-limiting algorithm as a store runs it. Each algorithm package
// exports its own (tokenbucket.Algorithm()); hand them to redisstore's LoadScripts.
type Algorithm = core.Algorithm

// decisionOf is the Decision o stands for.
func decisionOf(o core.Outcome) Decision {
	var d Decision
	d.Allowed, d.Limit, d.Remaining, d.Delay, d.RetryAfter, d.ResetAfter = o.Split()
	return d
}
