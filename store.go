package ratelimit

import (
	"context"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Store keeps the state of every key. It decides each request of a limiter atomically.
// The store of localstore.New keeps it in memory, and that of redisstore.New in Redis.
// The fallback and hotkey packages wrap one Store in another.
//
// Limiters of different algorithms and namespaces may share one Store. Implementations
// are safe for concurrent use. Apply is the contract between the stores and the
// limiters. Only this module's packages implement it.
type Store interface {
	Apply(ctx context.Context, req core.Request) (core.Outcome, error)
}

// Algorithm is one rate-limiting algorithm, as a store runs it. Each algorithm package
// exports its own, such as tokenbucket.Algorithm(). Hand them to redisstore's
// LoadScripts.
type Algorithm = core.Algorithm

// decisionOf is the Decision o stands for.
func decisionOf(o core.Outcome) Decision {
	var d Decision
	d.Allowed, d.Limit, d.Remaining, d.Delay, d.RetryAfter, d.ResetAfter = o.Split()
	return d
}
