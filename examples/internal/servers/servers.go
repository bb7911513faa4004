// Package servers runs the examples' gRPC servers beside their HTTP endpoints, and stops
// both the way a deploy expects: the calls in flight end first.
package servers

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
)

// GracePeriod bounds how long each server is given to finish its calls in flight.
const GracePeriod = 10 * time.Second

// GRPCAndHTTP serves g on lis and h on hlis until ctx ends or either server fails, then
// calls stopping (when set: health checks may answer NOT_SERVING from then on) and stops
// both gracefully, each within GracePeriod. It returns the error a server failed with,
// or nil when ctx ended.
func GRPCAndHTTP(ctx context.Context, g *grpc.Server, lis net.Listener, h *http.Server, hlis net.Listener, stopping func()) error {
	errc := make(chan error, 2)
	go func() { errc <- g.Serve(lis) }()
	go func() { errc <- h.Serve(hlis) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	if stopping != nil {
		stopping()
	}
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(GracePeriod):
		g.Stop()
	}
	shutdown, cancel := context.WithTimeout(context.Background(), GracePeriod)
	defer cancel()
	h.Shutdown(shutdown)
	if errors.Is(err, grpc.ErrServerStopped) || errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
