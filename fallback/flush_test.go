package fallback_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// TestFlushWaitsForLateCalls: a take decided on the share while the primary takes 150ms
// is counted on the primary once Flush returns, and not before. A Flush whose context
// ends first says so. An idle store flushes at once.
func TestFlushWaitsForLateCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		s := fallback.New(p, localstore.New(), fallback.WithTimeout(3*time.Millisecond),
			fallback.WithMaxTimeout(3*time.Millisecond), fallback.WithInstances(4))
		if err := s.Flush(t.Context()); err != nil {
			t.Fatalf("Flush of an idle store: %v", err)
		}
		rule := ratelimit.PerHour(400)
		p.slow.Store(int64(150 * time.Millisecond))
		start := time.Now()
		if d, err := s.Apply(t.Context(), req("k", rule)); err != nil || !d.Allowed() {
			t.Fatalf("a take on the share: %+v, %v; want admitted", d, err)
		}
		if c := counted(t, p.local, "k", rule); c != 0 {
			t.Fatalf("the primary counts %d before its late answer; want 0", c)
		}
		short, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		defer cancel()
		if err := s.Flush(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Flush within 10ms of a call of 150ms: %v; want DeadlineExceeded", err)
		}
		if err := s.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 150*time.Millisecond {
			t.Errorf("Flush returned %v after the take; want the primary's 150ms at least", took)
		}
		p.slow.Store(0)
		if c := counted(t, p.local, "k", rule); c != 1 {
			t.Errorf("the primary counts %d of the key after Flush; want the 1 admitted", c)
		}
	})
}
