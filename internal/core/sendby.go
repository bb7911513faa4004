package core

import (
	"context"
	"errors"
	"time"
)

// ErrNotSent is the error of a call a store did not send because its send-by time (see
// WithSendBy) had passed: the decision was made elsewhere, and the call counted nothing.
var ErrNotSent = errors.New("the call was not sent: its decision was made elsewhere by then")

// ErrUndelivered marks the error of a call that never reached its server (no connection
// could be had): it counted nothing. It says nothing else: the server may be down.
var ErrUndelivered = errors.New("the call never reached the server")

// Uncounted reports whether err is the error of a call that counted nothing, for sure.
func Uncounted(err error) bool {
	return errors.Is(err, ErrNotSent) || errors.Is(err, ErrUndelivered)
}

type sendByKey struct{}

// WithSendBy says that a call on ctx is worth sending only until t: a fallback store
// waits for its primary until then and decides elsewhere after, while it still reads an
// answer that comes later for a call already sent. A store that queues calls (redisstore)
// drops one still queued at t with ErrNotSent, rather than count at the primary a
// decision made elsewhere.
func WithSendBy(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, sendByKey{}, t)
}

// SendBy is the send-by time of ctx, if it has one.
func SendBy(ctx context.Context) (time.Time, bool) {
	t, ok := ctx.Value(sendByKey{}).(time.Time)
	return t, ok
}

// Unsendable reports whether a call on ctx is past its send-by time at now.
func Unsendable(ctx context.Context, now time.Time) bool {
	t, ok := SendBy(ctx)
	return ok && now.After(t)
}
