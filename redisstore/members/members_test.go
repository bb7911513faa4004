package members_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore/members"
)

// TestMembers: instances joining and leaving change the count learned, within three
// beats of an instance's last; Redis down leaves the count as it was.
func TestMembers(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	clk := clock.NewFake(limitertest.Start)
	ctx := context.Background()
	member := func(id string) *members.Members {
		return members.New(client, "fleet", members.WithID(id), members.WithBeat(time.Second),
			members.WithClock(clk))
	}
	a, b, c := member("a"), member("b"), member("c")
	if a.Count() != 1 {
		t.Fatalf("before any beat: %d; want 1", a.Count())
	}
	beat := func(m *members.Members, want int) {
		t.Helper()
		if n, err := m.Beat(ctx); err != nil || n != want || m.Count() != want {
			t.Fatalf("at +%v: Beat = %d, %v, Count %d; want %d", clk.Now().Sub(limitertest.Start), n, err, m.Count(), want)
		}
	}
	beat(a, 1)
	beat(b, 2)
	beat(c, 3)
	clk.Advance(2500 * time.Millisecond) // a, b and c beat last 2.5s ago: alive for 0.5s more
	beat(a, 3)
	beat(b, 3)
	clk.Advance(time.Second) // c has not beaten for 3.5s: gone
	beat(a, 2)
	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	beat(a, 1)
	if ttl := client.PTTL(ctx, "rl:members:{fleet}").Val(); ttl <= 0 || ttl > 3*time.Second+time.Second {
		t.Errorf("the set's TTL: %v; want about three beats", ttl)
	}
	beat(b, 2) // back
	srv.Kill()
	if n, err := a.Beat(ctx); !errors.Is(err, ratelimit.ErrUnavailable) || n != 1 || a.Count() != 1 {
		t.Errorf("Redis down: Beat = %d, %v, Count %d; want the last count kept (1 for a), ErrUnavailable", n, err, a.Count())
	}
	if b.Count() != 2 {
		t.Errorf("Redis down: b counts %d; want its last, 2", b.Count())
	}
}

// TestMembersRun: Run beats at once and then every interval, until its context ends.
func TestMembersRun(t *testing.T) {
	client := redistest.Start(t).Client()
	other := members.New(client, "fleet", members.WithID("other"))
	if _, err := other.Beat(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := members.New(client, "fleet", members.WithBeat(50*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for m.Count() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("Run has not learned the other member: %d", m.Count())
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run after its context ended: %v", err)
	}
}

// TestRunReportsErrors: Run hands each failed beat to WithOnError's function and goes
// on, and returns its context's error when it ends.
func TestRunReportsErrors(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(func(o *redis.Options) { o.MaxRetries = -1; o.DialerRetries = 1 })
	srv.Kill()
	errs := make(chan error, 100)
	m := members.New(client, "fleet", members.WithBeat(10*time.Millisecond),
		members.WithOnError(func(err error) { errs <- err }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	for range 2 { // two failed beats: Run went on after the first
		if err := <-errs; !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Errorf("a beat on a dead Redis: %v; want ErrUnavailable", err)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v; want its context's error", err)
	}
}
