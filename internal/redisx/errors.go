package redisx

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Unavailable reports whether err means that Redis cannot decide now: a timeout, a
// connection that failed or closed, a server that is busy (BUSY: a script runs too
// long), out of memory, loading its data, or in a failover, or one that refuses this
// client (NOAUTH, WRONGPASS, NOPERM: a password changed, an ACL). The caller's own cancellation
// is not: a caller that gave up says nothing about Redis.
func Unavailable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) ||
		redis.IsOOMError(err) || redis.IsLoadingError(err) || redis.IsMasterDownError(err) ||
		redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsReadOnlyError(err) ||
		redis.IsMaxClientsError(err) || redis.HasErrorPrefix(err, "BUSY") ||
		redis.IsAuthError(err) || redis.IsPermissionError(err)
}
