package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// Inside a synctest bubble time.Now and timers are fake, so localstore's real clock and
// Wait's timers agree, and every wait below is exact.

func TestWaitHonoursRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := tokenbucket.New(localstore.New(), ratelimit.PerSecond(2))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for i, want := range []time.Duration{0, 0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond} {
			if err := ratelimit.Wait(t.Context(), l, "k"); err != nil {
				t.Fatal(err)
			}
			if got := time.Since(start); got != want {
				t.Errorf("Wait %d returned at %v; want %v", i, got, want)
			}
		}
	})
}

func TestWaitHonoursDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := leakybucket.New(localstore.New(), ratelimit.Rule{Limit: 2, Period: time.Second, Burst: 3})
		if err != nil {
			t.Fatal(err)
		}
		// five callers at once leave evenly paced, 500ms apart
		start := time.Now()
		done := make(chan time.Duration, 5)
		for range 5 {
			go func() {
				if err := ratelimit.Wait(t.Context(), l, "k"); err != nil {
					t.Error(err)
				}
				done <- time.Since(start)
			}()
		}
		got := map[time.Duration]int{}
		for range 5 {
			got[<-done]++
		}
		for _, at := range []time.Duration{0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second} {
			if got[at] != 1 {
				t.Errorf("callers leaving at %v: %d; want 1 (all: %v)", at, got[at], got)
			}
		}
	})
}

func TestWaitEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := tokenbucket.New(localstore.New(), ratelimit.PerHour(1))
		if err != nil {
			t.Fatal(err)
		}
		if err := ratelimit.Wait(t.Context(), l, "k"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error)
		go func() { errc <- ratelimit.Wait(ctx, l, "k") }()
		time.Sleep(time.Minute)
		synctest.Wait()
		start := time.Now()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("Wait after cancel = %v; want context.Canceled", err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("Wait returned %v after cancel; want at once", waited)
		}
	})
}

func TestWaitPastDeadlineFailsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := tokenbucket.New(localstore.New(), ratelimit.PerMinute(1))
		if err != nil {
			t.Fatal(err)
		}
		if err := ratelimit.Wait(t.Context(), l, "k"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		start := time.Now()
		if err := ratelimit.Wait(ctx, l, "k"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Wait needing a minute with 10s left = %v; want DeadlineExceeded", err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("Wait took %v; want no wait", waited)
		}
	})
}

func TestWaitNReturnsLimiterErrors(t *testing.T) {
	l, err := tokenbucket.New(localstore.New(), ratelimit.PerSecond(3))
	if err != nil {
		t.Fatal(err)
	}
	if err := ratelimit.WaitN(t.Context(), l, "k", 0); !errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("WaitN(0) = %v; want ErrInvalidN", err)
	}
	if err := ratelimit.WaitN(t.Context(), l, "k", 4); !errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("WaitN(4) = %v; want ErrInvalidN", err)
	}
}

func TestWaitNilLimiter(t *testing.T) {
	if err := ratelimit.Wait(context.Background(), nil, "k"); err == nil {
		t.Error("Wait with a nil Limiter: no error")
	}
}
