package redisx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/ratelimit-go/ratelimit"
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

// Undelivered reports whether err means that the call never reached Redis: no
// connection could be dialled, or had from the pool in time.
func Undelivered(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || errors.Is(err, redis.ErrPoolTimeout)
}

// Failed wraps err, an error of the client in pkg's call (pkg "redisstore", call
// "tokenbucket"; "" for none), for the caller and its logs: with ratelimit.ErrUnavailable when Redis
// cannot decide now, and said for what it is when Redis refuses this client (Redis asks
// an unauthenticated client's command to be sent after AUTH, and answers a large one with
// "ERR Protocol error: unauthenticated multibulk length", which says nothing of a
// password to whoever reads it in a log).
func Failed(pkg, call string, err error) error {
	what := pkg
	if call != "" {
		what += ": " + call
	}
	switch {
	case redis.IsAuthError(err):
		return fmt.Errorf("%s: %w: Redis refuses this client: it asks for a password, or the client's is wrong (the client's Password and Username, or Redis's requirepass and ACL): %w", what, ratelimit.ErrUnavailable, err)
	case redis.IsPermissionError(err):
		return fmt.Errorf("%s: %w: Redis refuses this client the call: its ACL user lacks the permission (EVALSHA, EVAL, SCRIPT LOAD and the keys' pattern): %w", what, ratelimit.ErrUnavailable, err)
	case Unavailable(err):
		return fmt.Errorf("%s: %w: %w", what, ratelimit.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
