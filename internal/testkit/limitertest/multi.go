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
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

type multiParts struct {
	tb *tokenbucket.Limiter
	fw *fixedwindow.Limiter
	sl *slidinglog.Limiter
}

// newMulti is a tenant's limits over one store: a token bucket of 100 an hour, a fixed
// window of 50 an hour (the tightest) and a sliding log of 70 an hour, each in its
// rule's namespace.
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
	return p
}

// allow decides n for key under the three limits at once.
func (p multiParts) allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: p.tb, Key: key},
		ratelimit.Part{Limiter: p.fw, Key: key}, ratelimit.Part{Limiter: p.sl, Key: key})
}

// taken checks how much each part has counted for key, by peeking.
func (p multiParts) taken(t *testing.T, key string, want int64) {
	t.Helper()
	p.takenWithin(t, key, want, 0)
}

// takenWithin is taken, the token bucket's count allowed up to lost more: what refunds
// of takes in flight together may fail to give back (see testMultiConcurrent).
func (p multiParts) takenWithin(t *testing.T, key string, want, lost int64) {
	t.Helper()
	ctx := context.Background()
	for i, l := range []interface {
		PeekN(context.Context, string, int64) (ratelimit.Decision, error)
	}{p.tb, p.fw, p.sl} {
		d, err := l.PeekN(ctx, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		limit := []int64{100, 50, 70}[i]
		if i > 0 {
			lost = 0
		}
		if left := d.Remaining; left > max(0, limit-want-1) || left < max(0, limit-want-lost-1) {
			t.Errorf("part %d has counted %d; want %d", i, limit-left-1, want)
		}
	}
}

// testMulti: a decision under several limits admits only what every one allows, and a
// denial counts nothing anywhere.
func testMulti(t *testing.T, newStore NewStore) {
	clk := clock.NewFake(Start)
	store := newStore(t, clk)
	p := newMulti(t, store)
	ctx := context.Background()
	for i := range 60 {
		d, err := p.allow(ctx, "tenant")
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

	// misuse is an error, never a panic
	same, _ := tokenbucket.New(store, ratelimit.PerHour(100))
	other, _ := tokenbucket.New(newStore(t, clk), ratelimit.PerHour(100), ratelimit.WithNamespace("x"))
	for name, parts := range map[string][]ratelimit.Part{
		"the same key twice":    {{Limiter: p.tb, Key: "x"}, {Limiter: same, Key: "x"}},
		"no parts":              nil,
		"a nil limiter":         {{Limiter: nil, Key: "x"}},
		"two stores":            {{Limiter: p.tb, Key: "x"}, {Limiter: other, Key: "x"}},
		"an uncomparable store": {{Limiter: mustTB(t, uncomparable{store, nil}), Key: "x"}, {Limiter: mustTB(t, uncomparable{store, nil}), Key: "y"}},
	} {
		if d, err := ratelimit.AllowAll(ctx, 1, parts...); err == nil {
			t.Errorf("AllowAll with %s: %+v; want an error", name, d)
		} else if name == "the same key twice" && !errors.Is(err, ratelimit.ErrDuplicateKey) {
			t.Errorf("AllowAll with %s: %v; want ratelimit.ErrDuplicateKey", name, err)
		}
	}
	if bs, ok := store.(core.BatchStore); ok { // the store itself, asked directly
		r := core.Request{Key: "x", N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerHour(100))}}
		if ds, err := bs.ApplyAll(ctx, []core.Request{r, r}); !errors.Is(err, ratelimit.ErrDuplicateKey) {
			t.Errorf("ApplyAll with the same key twice: %+v, %v; want ratelimit.ErrDuplicateKey", ds, err)
		}
	}
}

// uncomparable is a store whose type == cannot compare.
type uncomparable struct {
	ratelimit.Store
	_ []int
}

func mustTB(t *testing.T, s ratelimit.Store) *tokenbucket.Limiter {
	l, err := tokenbucket.New(s, ratelimit.PerHour(100))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testMultiConcurrent: 1000 concurrent decisions under three limits admit exactly the
// tightest, and the others count exactly that many. On a store that is not a BatchStore,
// AllowAll takes the parts one by one and refunds the takes of a denied request; a
// bucket's record of deficits keeps eight (core.DeficitsMax), so with more takes in
// flight at once a refund may give back less: never more, and here at most a quarter.
func testMultiConcurrent(t *testing.T, newStore NewStore) {
	store := newStore(t, clock.NewFake(Start))
	p := newMulti(t, store)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 1000 {
		wg.Go(func() {
			d, err := p.allow(context.Background(), "hot")
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
	lost := int64(0)
	if _, batch := store.(core.BatchStore); !batch {
		lost = 25
	}
	p.takenWithin(t, "hot", 50, lost)
}
