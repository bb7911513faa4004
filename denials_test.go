package ratelimit_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// TestDenialsFindTheHot: of 100,000 keys denied once or twice each, the ten denied 2,000
// times each are the top ten, with counts within their error of the truth, from a
// sketch of 256 keys a slot; a minute later they are gone.
func TestDenialsFindTheHot(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d := &ratelimit.Denials{Clock: clk}
	var keys []string
	truth := map[string]int64{}
	for i := range 100_000 {
		k := fmt.Sprint("tenant-", i)
		keys = append(keys, k)
		truth[k] = 1 + int64(i%2)
		if i%10_000 == 0 {
			truth[k] = 2000 // ten hot keys: tenant-0, tenant-10000, ...
		}
	}
	var stream []string
	for _, k := range keys {
		for range truth[k] {
			stream = append(stream, k)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	for i, k := range stream {
		d.Record(k, 1)
		if i%20_000 == 0 {
			clk.Advance(time.Second) // 8s in all: one or two slots
		}
	}
	top := d.Top(10)
	if len(top) != 10 {
		t.Fatalf("%d keys; want 10", len(top))
	}
	for _, got := range top {
		if truth[got.Key] != 2000 {
			t.Errorf("%+v is in the top ten; it was denied %d times", got, truth[got.Key])
		}
		if got.Count < 2000 || got.Count-got.Error > 2000 {
			t.Errorf("%+v: the count is not within its error of 2000", got)
		}
	}
	clk.Advance(30 * time.Second)
	if got := d.Top(10); len(got) != 10 {
		t.Errorf("30s later: %d keys; want the ten still", len(got))
	}
	clk.Advance(time.Minute)
	if got := d.Top(10); len(got) != 0 {
		t.Errorf("a minute later: %+v; want none", got)
	}
}

// TestDenialsObserve: as a Middleware's hook, Denials counts the requests denied, by key.
func TestDenialsObserve(t *testing.T) {
	denials := &ratelimit.Denials{}
	limiter, _ := tokenbucket.New(localstore.New(), ratelimit.PerHour(2))
	h := (&ratelimit.Middleware{Limiter: limiter, Key: headerKey, OnDecision: denials.Observe}).Wrap(ok)
	for range 5 {
		serve(h, "a")
		serve(h, "b")
	}
	serve(h, "a")
	if got := denials.Top(5); len(got) != 2 || got[0] != (ratelimit.Denied{Key: "a", Count: 4}) || got[1] != (ratelimit.Denied{Key: "b", Count: 3}) {
		t.Errorf("%+v; want a denied 4 times, b 3", got)
	}
	if got := denials.Top(1); len(got) != 1 || got[0].Key != "a" {
		t.Errorf("the top one: %+v", got)
	}
}

// TestDenialsAnyClock: a clock before 1970, at the zero time or far in the future counts
// as any other (no panic), a minute still forgets, and counts that would overflow stay at
// the largest int64.
func TestDenialsAnyClock(t *testing.T) {
	for _, start := range []time.Time{{}, time.Date(1969, 12, 31, 23, 59, 55, 0, time.UTC),
		time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)} {
		clk := clock.NewFake(start)
		d := &ratelimit.Denials{Clock: clk}
		d.Record("a", 1<<62)
		d.Record("a", 1<<62)
		clk.Advance(10 * time.Second) // the next slot
		d.Record("a", 1<<62)
		d.Record("b", 3)
		top := d.Top(2)
		want := []ratelimit.Denied{{Key: "a", Count: math.MaxInt64}, {Key: "b", Count: 3}}
		if fmt.Sprint(top) != fmt.Sprint(want) {
			t.Errorf("from %v: %+v; want %+v", start, top, want)
		}
		clk.Advance(time.Minute)
		if top := d.Top(2); len(top) != 0 {
			t.Errorf("from %v, a minute later: %+v; want none", start, top)
		}
	}
}
