package main

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-go/ratelimit"
)

// The rate limit's interceptors: ratelimit.ContextLimiter decides each call before its
// handler runs. (It is also the Limiter of go-grpc-middleware's interceptors/ratelimit,
// but that interceptor answers every error of Limit ResourceExhausted with a text of its
// own: a call without a key included, and no retry delay a client could act on.)

func limitUnary(c *ratelimit.ContextLimiter) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		if err := c.Limit(ctx); err != nil {
			return nil, refusal(err, func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) })
		}
		return next(ctx, req)
	}
}

func limitStream(c *ratelimit.ContextLimiter) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		if err := c.Limit(ss.Context()); err != nil {
			return refusal(err, ss.SetTrailer)
		}
		return next(srv, ss)
	}
}

// The in-flight interceptors: a call holds one of its key's leases from before its
// handler runs until the handler returns (a stream's, when the stream ends); a call that
// finds every lease held is refused as the rate limit's are.

func inFlightUnary(f *ratelimit.ContextInFlight) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		release, err := f.Acquire(ctx)
		if err != nil {
			return nil, refusal(err, func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) })
		}
		defer release()
		return next(ctx, req)
	}
}

func inFlightStream(f *ratelimit.ContextInFlight) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		release, err := f.Acquire(ss.Context())
		if err != nil {
			return refusal(err, ss.SetTrailer)
		}
		defer release()
		return next(srv, ss)
	}
}

// pushbackTrailer is gRFC A6's trailer: the milliseconds after which a client's retry
// policy may try the call again.
const pushbackTrailer = "grpc-retry-pushback-ms"

// refusal is the status of a call a limit refused, or could not decide, as gRPC's
// conventions answer it:
//   - a denial (*ratelimit.DeniedError): ResourceExhausted, its wait in the status
//     details (google.rpc.RetryInfo's retry_delay) and in the grpc-retry-pushback-ms
//     trailer, set with setTrailer;
//   - no valid key (ratelimit.ErrInvalidKey): Unauthenticated, for it is no rate limit;
//   - the call's context ended: its status;
//   - anything else (the store failed, and an Error hook refused the call): Unavailable.
func refusal(err error, setTrailer func(metadata.MD)) error {
	var denied *ratelimit.DeniedError
	switch {
	case errors.As(err, &denied):
		wait := denied.RetryAfter()
		setTrailer(metadata.Pairs(pushbackTrailer, strconv.FormatInt(wait.Milliseconds(), 10)))
		st, derr := status.New(codes.ResourceExhausted, err.Error()).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
		if derr != nil {
			return status.Error(codes.ResourceExhausted, err.Error())
		}
		return st.Err()
	case errors.Is(err, ratelimit.ErrInvalidKey):
		return status.Error(codes.Unauthenticated, err.Error())
	}
	if st := status.FromContextError(err); st.Code() != codes.Unknown {
		return st.Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}
