// Package members counts the live instances of a fleet through Redis (see Members).
// A fallback.Store divides its rules among them while Redis is down.
package members

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// Members counts the live instances of a group, such as the gateways of one fleet,
// through Redis. A fallback.Store then divides its rules by the number of instances
// actually running. Nobody has to keep that number true by hand.
//
//	fleet := members.New(client, "gateway")
//	go fleet.Run(ctx)
//	store := fallback.New(redisstore.New(client), localstore.New(),
//		fallback.WithInstanceCount(fleet.Count))
//
// Each instance beats once every interval (WithBeat, 2s by default). A beat renews the
// instance's membership for three intervals, and learns how many members are live.
// An instance that stops beating leaves the count within three intervals. It may have
// crashed, or been scaled away.
//
// Count is the last number learned, at least 1. While Redis cannot be reached, it stays
// what it was. A fallback that decides during an outage so divides by the fleet as it
// was just before.
//
// The members are a sorted set in one Redis key, "<prefix>:members:{<group>}". The
// prefix is "rl" unless WithPrefix says otherwise. The key has a TTL.
type Members struct {
	client  redis.Scripter
	key     string
	id      string
	every   time.Duration
	clock   clock.Clock // nil: Redis TIME
	count   atomic.Int64
	onError func(error) // Run's errors (WithOnError); nil: none
}

// Option configures Members.
type Option interface{ apply(*Members) }

type optionFunc func(*Members)

func (f optionFunc) apply(m *Members) { f(m) }

// WithBeat sets how often an instance announces itself, 2s by default. A member that
// has not announced itself for three intervals is gone. 0 or less means the default.
func WithBeat(d time.Duration) Option {
	return optionFunc(func(m *Members) {
		if d > 0 {
			m.every = d
		}
	})
}

// WithID names this instance in the set. The default is 16 random hex digits.
// Two instances with one name count as one.
func WithID(id string) Option {
	return optionFunc(func(m *Members) {
		if id != "" {
			m.id = id
		}
	})
}

// WithOnError has f called with each error of a beat of Run, for logs and metrics.
// Run goes on whatever f does. Nil means none.
func WithOnError(f func(error)) Option {
	return optionFunc(func(m *Members) { m.onError = f })
}

// WithClock sends c's time instead of using Redis TIME, for tests. Nil means Redis
// TIME.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(m *Members) { m.clock = c })
}

// WithPrefix starts the set's key with prefix (redisstore.DefaultPrefix by default).
func WithPrefix(prefix string) Option {
	return optionFunc(func(m *Members) {
		if prefix != "" {
			m.key = redisx.Prefix(prefix)
		}
	})
}

// New returns the Members of group on client, counting 1 until its first beat.
// It makes no call to Redis; Run or Beat does. It panics for a nil client or option.
func New(client redis.Scripter, group string, opts ...Option) *Members {
	if core.IsNil(client) {
		panic("members: New with a nil client")
	}
	var b [8]byte
	rand.Read(b[:])
	m := &Members{client: client, key: redisx.DefaultPrefix, id: hex.EncodeToString(b[:]), every: 2 * time.Second}
	for _, o := range opts {
		if o == nil {
			panic("members: New with a nil option")
		}
		o.apply(m)
	}
	m.key = redisx.Members(m.key, group)
	m.count.Store(1)
	return m
}

// The scripts of members (its client runs scripts only: redis.Scripter). A beat is one
// script: it adds the instance to the sorted set, scored by the instant its membership
// expires (three intervals later). It drops the members whose instant has passed, gives
// the set a TTL and returns how many are left.
var (
	//go:embed beat.lua
	beatSource string
	beatScript = redis.NewScript(beatSource)
	//go:embed leave.lua
	leaveSource string
	leaveScript = redis.NewScript(leaveSource)
)

// Beat announces this instance once and learns how many are alive. On an error the
// count stays what it was.
func (m *Members) Beat(ctx context.Context) (int, error) {
	now := any("")
	if m.clock != nil {
		now = m.clock.Now().UnixMicro()
	}
	n, err := beatScript.Run(ctx, m.client, []string{m.key}, m.id, now, (3 * m.every).Microseconds()).Int64()
	if err != nil {
		return int(m.count.Load()), redisx.Failed("members", "", err)
	}
	if n < 1 {
		return int(m.count.Load()), fmt.Errorf("%w: members counted %d", redisstore.ErrUnexpectedReply, n)
	}
	m.count.Store(n)
	return int(n), nil
}

// Run beats every interval until ctx ends, and returns ctx's error. A beat may fail,
// as when Redis is down. The count then stays as it was, and the error goes to
// WithOnError's function. The next beat tries again.
func (m *Members) Run(ctx context.Context) error {
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		beat, cancel := context.WithTimeout(ctx, m.every)
		if _, err := m.Beat(beat); err != nil && m.onError != nil {
			m.onError(err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Leave takes this instance out of the set at once. Call it on a clean shutdown.
// The others then count without it before its membership expires.
func (m *Members) Leave(ctx context.Context) error {
	err := leaveScript.Run(ctx, m.client, []string{m.key}, m.id).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("members: %w", err)
	}
	return nil
}

// Count is the number of live instances last learned, at least 1.
func (m *Members) Count() int { return int(m.count.Load()) }
