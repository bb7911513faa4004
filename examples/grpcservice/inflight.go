package main

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-go/ratelimit"
)

// The in-flight interceptors: a call holds one of its key's leases from before its
// handler runs until the handler returns (a stream's, when the stream ends); a call that
// finds every lease held is ResourceExhausted, as the rate limit's are.

func inFlightUnary(f *ratelimit.ContextInFlight) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		release, err := f.Acquire(ctx)
		if err != nil {
			return nil, refusal(err)
		}
		defer release()
		return next(ctx, req)
	}
}

func inFlightStream(f *ratelimit.ContextInFlight) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		release, err := f.Acquire(ss.Context())
		if err != nil {
			return refusal(err)
		}
		defer release()
		return next(srv, ss)
	}
}

// refusal is the status of a call Acquire refused.
func refusal(err error) error {
	if _, ok := status.FromError(err); ok {
		return err // the context's end, already a status
	}
	if ctxErr := status.FromContextError(err); ctxErr.Code() != codes.Unknown {
		return ctxErr.Err()
	}
	return status.Error(codes.ResourceExhausted, err.Error())
}
