package ratelimit

import (
	"errors"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Errors are for the caller's mistakes and for backend failures; a denial is never an
// error. Match them with errors.Is: the errors returned wrap these with details.
var (
	// ErrInvalidRule: a Rule that no algorithm can enforce, or that this algorithm cannot
	// compute exactly (every number in it at most 2^52).
	ErrInvalidRule = core.ErrInvalidRule

	// ErrInvalidN: n is less than 1, or more than the rule can ever allow at once
	// (Decision.Limit): waiting would never help. The error says which.
	ErrInvalidN = core.ErrInvalidN

	// ErrDuplicateKey: one decision under several limits (AllowAll, a store's ApplyAll)
	// names the same algorithm, namespace and key twice. Each key is decided once; merge
	// the parts, or give one of them another namespace.
	ErrDuplicateKey = core.ErrDuplicateKey

	// ErrUnavailable: the store's backend cannot decide now (down, unreachable, too slow,
	// overloaded, out of memory, loading, failing over). Stores wrap their backend's error
	// with it; the fallback store trips its breaker on it. Other backend errors (a
	// misconfiguration, a reply of the wrong shape) are not wrapped with it.
	ErrUnavailable = errors.New("ratelimit: store unavailable")

	// ErrInvalidKey: a request or call has no key to limit it by (the Key function
	// failed: no API key, say) or its key is refused (too long, control characters). It
	// is not a rate limit: answer it as the missing credential it usually is (401, gRPC's
	// Unauthenticated), not with 429 or ResourceExhausted. ContextLimiter and
	// ContextInFlight return the Key function's error wrapped with it, and Middleware
	// hands KeyError such an error.
	ErrInvalidKey = errors.New("ratelimit: no valid key")
)
