package redisstore_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// parity drives the same random traffic through localstore and redis, on one fake
// clock, and requires identical decisions: same algorithm, same time, same answer.
// Each step picks a key, a rule and n; the clock moves forward by a multiple of step.
// With changeRules, a key's rule changes mid-stream, and the state must convert (or
// expire) the same way in Go and in Lua; else key i keeps rule i.
func parity(t *testing.T, redisStore func(*clock.Fake) ratelimit.Store, rules []ratelimit.Rule, changeRules bool, step time.Duration, steps int) {
	for _, k := range limitertest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(k.Name))))
			clk := clock.NewFake(limitertest.Start)
			stores := []ratelimit.Store{localstore.New(localstore.WithClock(clk)), redisStore(clk)}
			ctx := context.Background()
			for i := range steps {
				if rng.IntN(3) > 0 {
					clk.Advance(time.Duration(rng.IntN(40)) * step)
				}
				key := rng.IntN(len(rules))
				rule := rules[key]
				if changeRules {
					rule = rules[rng.IntN(len(rules))]
				}
				a, err := k.Algorithm.Prepare(rule, 1)
				if err != nil {
					t.Fatal(err)
				}
				req := ratelimit.Request{
					Algorithm: k.Algorithm,
					Key:       "key" + strconv.Itoa(key),
					Rule:      rule,
					N:         1 + rng.Int64N(a.Limit),
				}
				if rng.IntN(2) == 0 {
					req.N = 1
				}
				local, err := stores[0].Apply(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				remote, err := stores[1].Apply(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if local != remote {
					t.Fatalf("step %d, %s %v n %d at %v:\n localstore %+v\n     redis %+v",
						i, req.Key, rule, req.N, clk.Now().Sub(limitertest.Start), local, remote)
				}
			}
		})
	}
}

// On miniredis TTLs move only when told: here with the fake clock, so both stores forget
// a key at the same instant, and rules may change under any time step.
func TestParityMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	rules := []ratelimit.Rule{
		ratelimit.PerSecond(3),
		{Limit: 7, Period: 1500*time.Millisecond + 3*time.Microsecond, Burst: 11},
		ratelimit.PerMinute(100),
		{Limit: 5, Period: 7 * time.Millisecond, Burst: 2},
		ratelimit.PerDay(1000),
	}
	parity(t, func(clk *clock.Fake) ratelimit.Store {
		return &ttlClock{redisstore.New(client, redisstore.WithClock(clk), freshPrefix()), mr, clk, clk.Now()}
	}, rules, true, 997*time.Microsecond, 3000)
}

// On a real Redis, TTLs run on the server's real clock while the test's clock is fake: a
// key may outlive its fake reset, so each key keeps its rule (a state past its reset then
// decides as a fresh one), and every time step and every event's share of a period is a
// multiple of 100ms, so that no TTL is shorter than the real time between two steps.
func TestParity(t *testing.T) {
	client := redistest.Start(t).Client()
	rules := []ratelimit.Rule{
		ratelimit.PerSecond(5),
		{Limit: 10, Period: 2 * time.Second, Burst: 7},
		ratelimit.PerMinute(60),
		{Limit: 36, Period: time.Hour, Burst: 50},
	}
	parity(t, func(clk *clock.Fake) ratelimit.Store {
		return redisstore.New(client, redisstore.WithClock(clk), freshPrefix())
	}, rules, false, 100*time.Millisecond, 1500)
}

// ttlClock moves miniredis's TTLs with the fake clock before each decision.
type ttlClock struct {
	*redisstore.Store
	mr   *miniredis.Miniredis
	clk  *clock.Fake
	last time.Time
}

func (s *ttlClock) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	now := s.clk.Now()
	s.mr.FastForward(now.Sub(s.last))
	s.last = now
	return s.Store.Apply(ctx, req)
}
