package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

type keyCtx struct{}

func ctxKey(ctx context.Context) (string, error) {
	if k, ok := ctx.Value(keyCtx{}).(string); ok {
		return k, nil
	}
	return "", errors.New("no key")
}

func withKey(k string) context.Context { return context.WithValue(context.Background(), keyCtx{}, k) }

func TestContextLimiter(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	l, _ := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerSecond(2), ratelimit.WithNamespace("grpc"))
	var log eventLog
	c := &ratelimit.ContextLimiter{Limiter: l, Key: ctxKey, OnDecision: log.hook, Policy: "calls"}
	for i := range 2 {
		if err := c.Limit(withKey("a")); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	err := c.Limit(withKey("a"))
	var denied *ratelimit.DeniedError
	if !errors.As(err, &denied) || denied.Decision.RetryAfter != 500*time.Millisecond || denied.RetryAfter() != 500*time.Millisecond ||
		err.Error() != "rate limit exceeded; retry after 1s" {
		t.Fatalf("the third call: %v", err)
	}
	if err := c.Limit(withKey("b")); err != nil {
		t.Errorf("another key: %v", err)
	}
	// a key that cannot be found is no rate limit: ErrInvalidKey, with the Key function's error
	if err := c.Limit(context.Background()); !errors.Is(err, ratelimit.ErrInvalidKey) || errors.As(err, &denied) ||
		err.Error() != "ratelimit: no valid key: no key" {
		t.Errorf("no key: %v; want ErrInvalidKey, no DeniedError", err)
	}
	if err := c.Limit(withKey(strings.Repeat("k", 300))); !errors.Is(err, ratelimit.ErrInvalidKey) {
		t.Errorf("a key of 300 bytes: %v; want ErrInvalidKey", err)
	}
	events := log.take()
	if len(events) != 4 || events[2].Decision.Allowed || events[2].Policy != "calls" || events[3].Key != "b" {
		t.Errorf("events: %+v", events)
	}
	c.Shadow = true
	if err := c.Limit(withKey("a")); err != nil {
		t.Errorf("shadowed: %v", err)
	}
	if e := log.take(); len(e) != 1 || !e[0].Shadowed || e[0].Decision.Allowed {
		t.Errorf("a shadowed denial's event: %+v", e)
	}
}

// A failed limiter lets the call go on, unless Error says otherwise.
func TestContextLimiterFails(t *testing.T) {
	l, _ := tokenbucket.New(downStore{}, ratelimit.PerSecond(2), ratelimit.WithNamespace("grpc"))
	c := &ratelimit.ContextLimiter{Limiter: l, Key: ctxKey}
	if err := c.Limit(withKey("a")); err != nil {
		t.Errorf("fail open: %v", err)
	}
	closed := errors.New("closed")
	c.Error = func(ctx context.Context, err error) error {
		if !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Errorf("Error got %v", err)
		}
		return closed
	}
	if err := c.Limit(withKey("a")); err != closed {
		t.Errorf("fail closed: %v", err)
	}
	if err := (&ratelimit.ContextLimiter{Key: ctxKey}).Limit(withKey("a")); err == nil {
		t.Error("no Limiter: no error")
	}
}

// A shaping algorithm's Delay holds the call, within its context.
func TestContextLimiterDelay(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	l, _ := leakybucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.Rule{Limit: 1, Period: time.Hour, Burst: 5}, ratelimit.WithNamespace("q"))
	c := &ratelimit.ContextLimiter{Limiter: l, Key: ctxKey}
	if err := c.Limit(withKey("a")); err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(withKey("a"), time.Second)
		defer cancel()
		// the second call is admitted to wait an hour: its context ends first
		if err := c.Limit(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a delayed call whose context ended: %v", err)
		}
	})
	ctx, cancel := context.WithCancel(withKey("a"))
	cancel()
	if err := c.Limit(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("a call whose context had ended: %v", err)
	}
}

// TestContextKeysBounded: ContextLimiter and ContextInFlight refuse a key longer than 256
// bytes, as Middleware does, or one of control characters, before the limiter is asked;
// MaxKeyLength moves the bound.
func TestContextKeysBounded(t *testing.T) {
	store := localstore.New()
	l, _ := tokenbucket.New(store, ratelimit.PerSecond(100), ratelimit.WithNamespace("keys"))
	in, _ := ratelimit.NewInFlight(store, 10, time.Minute, ratelimit.WithNamespace("keys-in-flight"))
	c := &ratelimit.ContextLimiter{Limiter: l, Key: ctxKey}
	f := &ratelimit.ContextInFlight{InFlight: in, Key: ctxKey}
	for _, key := range []string{strings.Repeat("k", 257), "a\nb", strings.Repeat("k", 15<<20)} {
		if err := c.Limit(withKey(key)); err == nil || errors.As(err, new(*ratelimit.DeniedError)) {
			t.Errorf("ContextLimiter, a key of %d bytes: %v; want an error", len(key), err)
		}
		if _, err := f.Acquire(withKey(key)); err == nil {
			t.Errorf("ContextInFlight, a key of %d bytes: %v; want an error", len(key), err)
		}
	}
	if store.Len() != 0 {
		t.Errorf("the store holds %d keys; the refused ones reached it", store.Len())
	}
	if err := c.Limit(withKey(strings.Repeat("k", 256))); err != nil {
		t.Errorf("a key of 256 bytes: %v", err)
	}
	c.MaxKeyLength, f.MaxKeyLength = 1024, 1024
	if err := c.Limit(withKey(strings.Repeat("k", 1024))); err != nil {
		t.Errorf("a key of 1024 bytes under MaxKeyLength 1024: %v", err)
	}
	if release, err := f.Acquire(withKey(strings.Repeat("k", 1024))); err != nil {
		t.Errorf("ContextInFlight, 1024 bytes under MaxKeyLength 1024: %v", err)
	} else {
		release()
	}
}
