// Package trace carries, in a decision's context, which store made the decision: from a
// fallback.Store, which knows it, to the middleware that reports it (a hook of
// ratelimit.Middleware). A context without a Record carries nothing, and setting it costs
// a context lookup.
package trace

import (
	"context"
	"sync/atomic"
)

// Record is where a decision's source is written. It is safe for concurrent use: a
// decorator may hand one context to a call on another goroutine.
type Record struct{ source atomic.Value }

type key struct{}

// With returns ctx carrying a new Record.
func With(ctx context.Context) (context.Context, *Record) {
	r := &Record{}
	return context.WithValue(ctx, key{}, r), r
}

// Set writes source ("primary", "secondary") to ctx's Record, if it has one.
func Set(ctx context.Context, source string) {
	if r, ok := ctx.Value(key{}).(*Record); ok {
		r.source.Store(source)
	}
}

// Source is what was written, or "".
func (r *Record) Source() string {
	if r == nil {
		return ""
	}
	s, _ := r.source.Load().(string)
	return s
}
