package limitertest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

type multiParts struct {
	tb *tokenbucket.Limiter
	fw *fixedwindow.Limiter
	sl *slidinglog.Limiter
	m  *ratelimit.Multi
}

// newMulti is a tenant's limits over one store: a token bucket of 100 an hour, a fixed
// window of 50 an hour (the tightest) and a sliding log of 70 an hour.
func newMulti(t *testing.T, store ratelimit.Store) multiParts {
	t.Helper()
	var p multiParts
	var err error
	if p.tb, err = tokenbucket.New(store, ratelimit.PerHour(100)); err != nil {
		t.Fatal(err)
	}
	if p.fw, err = fixedwindow.New(store, ratelimit.PerHour(50)); err != nil {
		t.Fatal(err)
	}
	if p.sl, err = slidinglog.New(store, ratelimit.PerHour(70)); err != nil {
		t.Fatal(err)
	}
	if p.m, err = ratelimit.NewMulti(p.tb, p.fw, p.sl); err != nil {
		t.Fatal(err)
	}
	return p
}

// taken checks how much each part has counted for key, by peeking at its own key.
func (p multiParts) taken(t *testing.T, key string, want int64) {
	t.Helper()
	ctx := context.Background()
	for i, l := range []interface {
		Peek(context.Context, string) (ratelimit.Decision, error)
	}{p.tb, p.fw, p.sl} {
		d, err := l.Peek(ctx, ratelimit.TaggedKey(key, []string{"0", "1", "2"}[i]))
		if err != nil {
			t.Fatal(err)
		}
		if limit := []int64{100, 50, 70}[i]; d.Remaining != max(0, limit-want-1) {
			t.Errorf("part %d has counted %d; want %d", i, limit-d.Remaining-1, want)
		}
	}
}

// testMulti: a decision under several limits admits only what every one allows, and a
// denial counts nothing anywhere.
func testMulti(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	p := newMulti(t, newStore(t, clk))
	ctx := context.Background()
	for i := range 60 {
		d, err := p.m.Allow(ctx, "tenant")
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 50; d.Allowed != want {
			t.Fatalf("request %d: %+v; want allowed %v", i, d, want)
		}
		if i == 59 && (d.Limit != 50 || d.Remaining != 0 || d.RetryAfter != time.Hour) {
			t.Errorf("a denial: %+v; want the fixed window's limit, 0 left, retry after the hour", d)
		}
	}
	p.taken(t, "tenant", 50)

	// AllowAll over explicit pairs, with a key named twice
	part := ratelimit.Part{Limiter: p.tb, Key: "x"}
	if _, err := ratelimit.AllowAll(ctx, 1, part, part); !errors.Is(err, ratelimit.ErrDuplicateKey) {
		t.Errorf("a key twice: %v; want ErrDuplicateKey", err)
	}
}

// testMultiConcurrent: 1000 concurrent decisions under three limits admit exactly the
// tightest, and the others count exactly that many.
func testMultiConcurrent(t *testing.T, newStore NewStore) {
	p := newMulti(t, newStore(t, clock.NewFake(Start)))
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 1000 {
		wg.Go(func() {
			d, err := p.m.Allow(context.Background(), "hot")
			if err != nil {
				t.Error(err)
			} else if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 50 {
		t.Errorf("admitted %d; want exactly the tightest limit, 50", admitted.Load())
	}
	p.taken(t, "hot", 50)
}
