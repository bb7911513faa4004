package ratelimit

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"
)

// ContextLimiter limits calls whose key comes from their context alone, as gRPC
// interceptors see a call. Limit decides one call. An interceptor answers its error as
// gRPC's conventions say:
//
//	limit := &ratelimit.ContextLimiter{
//		Limiter: limiter,
//		Key: func(ctx context.Context) (string, error) {
//			md, _ := metadata.FromIncomingContext(ctx)
//			if v := md.Get("x-api-key"); len(v) == 1 {
//				return v[0], nil
//			}
//			return "", errors.New("no x-api-key")
//		},
//	}
//	unary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
//		var denied *ratelimit.DeniedError
//		switch err := limit.Limit(ctx); {
//		case errors.As(err, &denied): // ResourceExhausted, the wait in RetryInfo and the pushback trailer
//			wait := denied.RetryAfter()
//			grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", strconv.FormatInt(wait.Milliseconds(), 10)))
//			st, _ := status.New(codes.ResourceExhausted, err.Error()).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
//			return nil, st.Err()
//		case errors.Is(err, ratelimit.ErrInvalidKey): // no key: not a rate limit
//			return nil, status.Error(codes.Unauthenticated, err.Error())
//		case err != nil:
//			return nil, status.Error(codes.Unavailable, err.Error())
//		}
//		return next(ctx, req)
//	}
//
// Limit can also be the Limiter of go-grpc-middleware's interceptors/ratelimit. That
// interceptor answers every error with ResourceExhausted and a text of its own. A call
// without a key gets that answer too. No answer has a retry delay that a client's retry
// policy could act on.
//
// ContextLimiter needs nothing but the standard library. The module's
// examples/grpcservice has a whole service, with ContextInFlight's interceptors beside
// it. Shadow, OnDecision and Logger are as in Middleware. A ContextLimiter must not be
// changed once in use. It is safe for concurrent use.
type ContextLimiter struct {
	// Limiter decides each call, with n = 1. Required.
	Limiter Limiter
	// Key is a call's limiter key, from its context (gRPC metadata, an authenticated
	// identity). Required. Limit returns its error, and the limiter is not asked.
	Key func(ctx context.Context) (string, error)
	// MaxKeyLength bounds a key's length in bytes: 256 when 0, as in Middleware. A longer
	// key, or one that holds control characters, is refused with an error that wraps
	// ErrInvalidKey. The limiter is then not asked. Keys that callers choose must not use
	// memory without bound.
	MaxKeyLength int
	// Policy names the limit in OnDecision's events: "default" when empty.
	Policy string
	// Priority, when set, is a call's priority (its method's class, say). The limiter
	// decides the call at that priority (see Middleware.Priority). Without Priority, the
	// call has its context's priority.
	Priority func(ctx context.Context) Priority
	// Error is called when the limiter fails, and returns Limit's error. Returning nil
	// lets the call go on (fail open). A nil Error does the same.
	Error func(ctx context.Context, err error) error
	// Shadow decides and counts every call but denies none (see Middleware.Shadow).
	Shadow bool
	// OnDecision, when set, sees every decision (see Middleware.OnDecision).
	OnDecision func(ctx context.Context, e Event)
	// Logger, when set, receives at Warn level a limiter's error after which the call
	// went on.
	Logger *slog.Logger
}

// Limit decides one call. It returns nil when the call may go on. For a shaping
// algorithm, it first waits out the Decision's Delay. It returns a *DeniedError when the
// limit denies the call. Other errors are the Key function's, or Error's for a failed
// limiter. When ctx ends during the Delay, or the limiter fails once ctx is done, the
// error is ctx's.
func (c *ContextLimiter) Limit(ctx context.Context) error {
	if c == nil || c.Limiter == nil || c.Key == nil {
		return errors.New("ratelimit: ContextLimiter without a Limiter or a Key function")
	}
	key, err := c.Key(ctx)
	if err = keyOf(key, err, cmp.Or(max(0, c.MaxKeyLength), defaultMaxKeyLength)); err != nil {
		return err
	}
	if c.Priority != nil {
		ctx = WithPriority(ctx, c.Priority(ctx))
	}
	o := observer{c.OnDecision, c.Logger}
	tctx, rec, start := o.begin(ctx)
	d, err := c.Limiter.Allow(tctx, key)
	policy := c.Policy
	if policy == "" {
		policy = "default"
	}
	o.report(ctx, rec, start, Event{Key: key, Policy: policy, Decision: d, Shadowed: c.Shadow, Err: err})
	switch {
	case err != nil && ctx.Err() != nil: // the caller is gone: that says nothing of the limiter
		return ctx.Err()
	case err != nil:
		if c.Error != nil {
			return c.Error(ctx, err)
		}
		o.warn(ctx, "the limiter failed; the call goes on", key, err)
		return nil
	case !d.Allowed && !c.Shadow:
		return &DeniedError{Decision: d}
	case d.Allowed && d.Delay > 0: // a shaping algorithm's pace (the leaky bucket)
		return sleep(ctx, d.Delay)
	}
	return nil
}

// ContextInFlight bounds the calls of a key in progress at once. It is for interceptors
// that wrap a handler, such as gRPC's unary and stream interceptors. A call's key comes
// from its context. Call Acquire before the handler runs. Call the release it returns
// when the handler returns.
//
// While the call runs, its lease is extended every half lease duration. That way, a call
// that outlives its lease duration keeps its place. The leases of a crashed instance come
// back by themselves. The module's examples/grpcservice has the interceptors.
//
// Shadow, OnDecision and Logger are as in Middleware. A ContextInFlight must not be
// changed once in use. It is safe for concurrent use.
type ContextInFlight struct {
	// InFlight is the limit. Required.
	InFlight *InFlightLimiter
	// Key is a call's limiter key, from its context. Required. Acquire returns its error.
	Key func(ctx context.Context) (string, error)
	// MaxKeyLength bounds a key's length in bytes (see ContextLimiter.MaxKeyLength).
	MaxKeyLength int
	// Limit, when set, is a call's limit (a method's, say), instead of InFlight's own. 0
	// or less means none for this call.
	Limit func(ctx context.Context) int64
	// Priority, when set, is a call's priority. The limit keeps its reserve for more
	// important calls (see ContextLimiter.Priority).
	Priority func(ctx context.Context) Priority
	// Error is called when the limit's store fails, and returns Acquire's error. Returning
	// nil lets the call go on without a lease (fail open). A nil Error does the same.
	Error func(ctx context.Context, err error) error
	// Shadow acquires leases as usual, but denies no call (see Middleware.Shadow).
	Shadow bool
	// OnDecision, when set, sees every decision (see Middleware.OnDecision).
	OnDecision func(ctx context.Context, e Event)
	// Logger, when set, receives at Warn level a store's error after which the call went
	// on. It also receives the failure to release or extend a lease.
	Logger *slog.Logger
}

// Acquire takes one of the leases of the call's key, and returns the function that gives
// it back. Call release once the handler has returned. It never fails, and a second call
// does nothing. When every lease of the key is held, the error is a *DeniedError whose
// InFlight is set. Other errors are the Key function's, or Error's for a failed store.
func (c *ContextInFlight) Acquire(ctx context.Context) (release func(), err error) {
	if c == nil || c.InFlight == nil || c.Key == nil {
		return nil, errors.New("ratelimit: ContextInFlight without an InFlight limiter or a Key function")
	}
	key, err := c.Key(ctx)
	if err = keyOf(key, err, cmp.Or(max(0, c.MaxKeyLength), defaultMaxKeyLength)); err != nil {
		return nil, err
	}
	if c.Priority != nil {
		ctx = WithPriority(ctx, c.Priority(ctx))
	}
	limit := c.InFlight.Rule().Limit
	if c.Limit != nil {
		if limit = c.Limit(ctx); limit <= 0 {
			return func() {}, nil
		}
	}
	o := observer{c.OnDecision, c.Logger}
	release, d, err := o.hold(ctx, c.InFlight, key, limit, c.Shadow)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		if c.Error != nil {
			if err := c.Error(ctx, err); err != nil {
				return nil, err
			}
		} else {
			o.warn(ctx, "the in-flight limit failed; the call goes on", key, err)
		}
		return func() {}, nil
	case release == nil && c.Shadow:
		return func() {}, nil
	case release == nil:
		return nil, &DeniedError{Decision: d, InFlight: true}
	}
	return release, nil
}

// DeniedError is the error of a call that a limit denied. Its Decision says when to
// retry. gRPC's conventions carry that wait in the status details, as
// google.rpc.RetryInfo's retry_delay. They also carry it in the grpc-retry-pushback-ms
// trailer (gRFC A6), which clients with a retry policy honour. RetryAfter is the value for
// both, and the module's examples/grpcservice sets them. A call refused for want of a key
// is not denied: its error wraps ErrInvalidKey.
type DeniedError struct {
	// Decision is the decision that denied the call.
	Decision Decision
	// InFlight reports that the in-flight limit denied the call: every lease of its key
	// is held.
	InFlight bool
}

// RetryAfter is how long to wait before retrying the call. It is the Decision's
// RetryAfter, at least a millisecond. For the in-flight limit it is one second, as a
// lease may come back at any moment.
func (e *DeniedError) RetryAfter() time.Duration {
	if e.InFlight {
		return time.Second
	}
	return max(time.Millisecond, e.Decision.RetryAfter)
}

func (e *DeniedError) Error() string {
	if e.InFlight {
		return strconv.FormatInt(e.Decision.Limit, 10) + " calls of this key are in progress; retry when one ends"
	}
	return "rate limit exceeded; retry after " + strconv.FormatInt(ceilSeconds(e.Decision.RetryAfter), 10) + "s"
}
