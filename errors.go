package ratelimit

import (
	"errors"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Errors are for the caller's mistakes and for backend failures. A denial is never an
// error. The errors returned wrap these with details: match them with errors.Is.
var (
	// ErrInvalidRule reports a Rule that no algorithm can enforce, or that this algorithm
	// cannot compute exactly. Every number in a rule must be at most 2^52.
	ErrInvalidRule = core.ErrInvalidRule

	// ErrInvalidN reports that n is less than 1, or more than the rule can ever allow at once
	// (Decision.Limit). Waiting would never help. The error says which.
	ErrInvalidN = core.ErrInvalidN

	// ErrDuplicateKey reports that one decision under several limits names the same
	// algorithm, namespace and key twice. AllowAll and a store's ApplyAll return it. Each key is
	// decided once. Merge the parts, or give one of them another namespace.
	ErrDuplicateKey = core.ErrDuplicateKey

	// ErrUnavailable reports that the store's backend cannot decide now. It may be down,
	// unreachable, too slow, overloaded, out of memory, loading or failing over. Stores
	// wrap their backend's error with it, and the fallback store trips its breaker on it.
	// Other backend errors are not wrapped with it: a misconfiguration, say, or a reply
	// of the wrong shape.
	ErrUnavailable = errors.New("ratelimit: store unavailable")

	// ErrInvalidKey reports that a request or call has no key to limit it by, or that its
	// key is refused. The Key function may have failed (no API key, say). Or the key may be too
	// long, or hold control characters. It is not a rate limit. Answer it as the missing
	// credential it usually is: 401, or gRPC's Unauthenticated, not 429 or
	// ResourceExhausted. ContextLimiter and ContextInFlight wrap the Key function's error
	// with it. Middleware hands KeyError such an error.
	ErrInvalidKey = errors.New("ratelimit: no valid key")
)
