package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The errors of the caller's mistakes that the contract checks; the root package exports
// them under the same names.
var (
	ErrInvalidRule  = errors.New("ratelimit: invalid rule")
	ErrInvalidN     = errors.New("ratelimit: invalid n")
	ErrDuplicateKey = errors.New("ratelimit: a key appears twice in one decision")
)

// Rule is ratelimit.Rule as a store sees it: Limit events per Period, with a bucket's
// Burst. The root package's Rule converts to it, field for field.
type Rule struct {
	Limit  int64
	Period time.Duration
	Burst  int64
}

// String is the rule as ratelimit.Rule writes it: "100 per 1s", "100 per 1s, burst 200".
func (r Rule) String() string {
	if r.Burst != 0 {
		return fmt.Sprintf("%d per %v, burst %d", r.Limit, r.Period, r.Burst)
	}
	return fmt.Sprintf("%d per %v", r.Limit, r.Period)
}

// Store is ratelimit.Store. It keeps the state of every key, and applies an Algorithm to
// it one atomic decision at a time. A store knows nothing of any particular algorithm:
// it runs the Algorithm it is handed, in Go (Algorithm.Step, as localstore does) or as a server-side script
// (Algorithm.Script, as redisstore does). Because it sees the Rule of every call, a
// decorator store can change it on the way (fallback divides it across instances), in a
// Spec of its own: a Spec never changes once sent.
//
// A store keeps one state per (Algorithm, Namespace, Key) of a Request, and never lets two
// different triples share state.
//
// Apply validates the request (Request.Args) before it touches any state, so an invalid
// rule or n returns an error wrapping ErrInvalidRule or ErrInvalidN and consumes nothing.
// Any other error is a failure of the store's backend. A denial is an Outcome with
// Allowed() false, never an error.
//
// Implementations are safe for concurrent use.
type Store interface {
	Apply(ctx context.Context, req Request) (Outcome, error)
}
