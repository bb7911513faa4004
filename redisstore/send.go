package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/redis/go-redis/v9"
)

type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// clientPanic, deferred, turns a panic of the client into *err, an error wrapping
// ratelimit.ErrUnavailable: the store calls the client on goroutines of its own, where a
// panic would end the process.
func clientPanic(what string, err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("redisstore: %s: the client panicked: %v: %w", what, p, ratelimit.ErrUnavailable)
	}
}

// send processes cmd, and returns when it is done or when ctx ends, whichever comes
// first (see await). An AutoPipeliner sends it with its next pipeline, as a future the
// caller stops waiting for when ctx ends.
func (s *Store) send(ctx context.Context, to processor, cmd noRetry) error {
	if ap, ok := to.(*redis.AutoPipeliner); ok && !ap.IsBlocking() {
		return ap.Submit(ctx, cmd).WaitContext(ctx) // its Process would not wait for the reply
	}
	return s.await(ctx, func(cctx context.Context) error { return to.Process(cctx, cmd) })
}

// await calls f, a blocking call to the client, and returns when it does or when ctx
// ends, whichever comes first. f runs in a goroutine of its own when ctx can end, on ctx
// without its deadline (see noDeadline): the reply of a command already written is read
// even after the caller has given up, and its connection kept. The command may still run
// after the caller has gone: it counts at most once (see Store, "Never counted twice").
func (s *Store) await(ctx context.Context, f func(context.Context) error) error {
	if _, detached := ctx.(noDeadline); detached || ctx.Done() == nil {
		return f(ctx) // on a goroutine of the store's already (a flight), or one that cannot end
	}
	done := make(chan error, 1)
	go func() {
		if err := ctx.Err(); err != nil { // the caller gave up while this waited for a thread
			done <- err
			return
		}
		if core.Unsendable(ctx, time.Now()) { // decided elsewhere by now (core.WithSendBy)
			done <- fmt.Errorf("redisstore: %w", core.ErrNotSent)
			return
		}
		sctx, cancel := sendContext(ctx)
		defer cancel()
		done <- notSent(ctx, safely(sctx, f))
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// safely is f(ctx), on a goroutine of the store's (see clientPanic).
func safely(ctx context.Context, f func(context.Context) error) (err error) {
	defer clientPanic("a call", &err)
	return f(ctx)
}

// sendContext is ctx as a command of the store's is handed to the client: without its
// deadline (see noDeadline), and ended at its send-by time when it has one
// (core.WithSendBy), so that go-redis stops waiting for a connection, dialling and
// backing off between attempts then, while it still reads the reply of a command it
// wrote (its reads watch the socket's deadline, never the context).
func sendContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if t, ok := core.SendBy(ctx); ok {
		sctx, cancel := context.WithDeadline(ctx, t)
		return noDeadline{sctx}, cancel
	}
	return noDeadline{ctx}, func() {}
}

// notSent is err, or ErrNotSent when err is the end of ctx's send-by time: the command
// never left.
func notSent(ctx context.Context, err error) error {
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() == nil && core.Unsendable(ctx, time.Now()) {
		return fmt.Errorf("redisstore: %w", core.ErrNotSent)
	}
	return err
}

// noDeadline is a context that ends when its parent does but has no deadline, which is
// what a command of the store's is sent on. go-redis waits for a connection (and dials
// one) only until the context ends, so that a decision whose caller has given up by then
// is never sent; but with ContextTimeoutEnabled it also sets a socket's deadlines from
// the context's, and closes a connection whose reply it stopped waiting for. The next
// decision would then pay a new dial and a handshake of several round trips, and on a
// Redis a few milliseconds away time out in turn, for ever. Without a deadline, the
// client's ReadTimeout and WriteTimeout bound the socket, as they do for any client
// without ContextTimeoutEnabled: a late reply is read and its connection kept.
type noDeadline struct{ context.Context }

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// noRetry is a command go-redis must not send again once it may have run.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

func noRetryCmd(ctx context.Context, args []any) noRetry {
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return noRetry{cmd}
}
