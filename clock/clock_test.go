package clock_test

import (
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit/clock"
)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestFake(t *testing.T) {
	f := clock.NewFake(start)
	if !f.Now().Equal(start) {
		t.Fatalf("Now = %v; want %v", f.Now(), start)
	}
	f.Advance(1500 * time.Millisecond)
	if want := start.Add(1500 * time.Millisecond); !f.Now().Equal(want) {
		t.Errorf("after Advance, Now = %v; want %v", f.Now(), want)
	}
	f.Advance(-time.Hour)
	if want := start.Add(1500*time.Millisecond - time.Hour); !f.Now().Equal(want) {
		t.Errorf("after a negative Advance, Now = %v; want %v", f.Now(), want)
	}
	f.Set(start)
	if !f.Now().Equal(start) {
		t.Errorf("after Set, Now = %v; want %v", f.Now(), start)
	}
}

func TestFakeConcurrent(t *testing.T) {
	f := clock.NewFake(start)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				f.Advance(time.Microsecond)
				_ = f.Now()
			}
		})
	}
	wg.Wait()
	if want := start.Add(8000 * time.Microsecond); !f.Now().Equal(want) {
		t.Errorf("Now = %v; want %v", f.Now(), want)
	}
}

func TestCoarse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := clock.NewCoarse(time.Millisecond)
		defer c.Stop()
		t0 := time.Now()
		if !c.Now().Equal(t0) {
			t.Errorf("Now = %v; want %v", c.Now(), t0)
		}
		time.Sleep(5*time.Millisecond + 500*time.Microsecond)
		synctest.Wait()
		if got, want := c.Now().Sub(t0), 5*time.Millisecond; got != want {
			t.Errorf("5.5ms later Now is %v on; want %v (the last tick)", got, want)
		}
		c.Stop()
		c.Stop() // twice is fine
		time.Sleep(time.Second)
		if got, want := c.Now().Sub(t0), 5*time.Millisecond; got != want {
			t.Errorf("after Stop Now is %v on; want it frozen at %v", got, want)
		}
	})
}

func TestMonotonic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := clock.NewMonotonic()
		t0 := time.Now()
		time.Sleep(1500 * time.Millisecond)
		if got := m.Now().Sub(t0); got != 1500*time.Millisecond {
			t.Errorf("Now moved %v in 1.5s", got)
		}
		if got := m.Now(); !got.Equal(time.Now()) {
			t.Errorf("Now = %v; want %v", got, time.Now())
		}
		if got, want := m.UnixNano(), time.Now().UnixNano(); got != want {
			t.Errorf("UnixNano = %d; want %d", got, want)
		}
		if got, want := clock.UnixNano(m), time.Now().UnixNano(); got != want {
			t.Errorf("clock.UnixNano = %d; want %d", got, want)
		}
	})
}

// TestMonotonicIgnoresWallSteps: the clock keeps the monotonic reading of its start, so
// it moves with elapsed time only (a wall-clock step cannot be made in a test; this checks
// that the reading is there, which is what makes steps invisible).
func TestMonotonicIgnoresWallSteps(t *testing.T) {
	m := clock.NewMonotonic()
	if s := m.Now().String(); !strings.Contains(s, "m=+") {
		t.Errorf("Now() = %s: no monotonic reading, so time.Since reads the wall clock", s)
	}
}

func TestReal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		if got := (clock.Real{}).Now(); !got.Equal(time.Now()) {
			t.Errorf("Real.Now = %v; want time.Now", got)
		}
	})
}
