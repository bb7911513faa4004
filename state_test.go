package ratelimit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/slidinglog"
)

// bytesStore is a store written on the contract of internal/core alone:
// every state lives as the bytes of MarshalBinary in a map, as it would in a database or
// a cache server, under one lock. It runs every algorithm, and the in-flight limit.
type bytesStore struct {
	clk    clock.Clock
	mu     sync.Mutex
	states map[string]stored
}

// stored is a state's bytes, and when they are worth no more than a fresh key's.
type stored struct {
	b       []byte
	expires int64
}

func newBytesStore(clk clock.Clock) *bytesStore {
	return &bytesStore{clk: clk, states: map[string]stored{}}
}

func (s *bytesStore) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return core.Outcome{}, err
	}
	alg := req.Spec.Algorithm
	if alg == nil {
		return core.Outcome{}, errors.New("bytesStore: no algorithm")
	}
	a, err := req.Args()
	if err != nil {
		return core.Outcome{}, err
	}
	if req.Spec.Op == core.OpExtend && alg.Extend == nil {
		return core.Outcome{}, fmt.Errorf("bytesStore: %s has no leases", alg.Name)
	}
	id := ratelimit.Key(alg.Name, req.Spec.Namespace, req.Key)
	now := s.clk.Now().UnixMicro()

	s.mu.Lock()
	defer s.mu.Unlock()
	var st core.State
	if v, ok := s.states[id]; ok && v.expires > now {
		if err := st.UnmarshalBinary(v.b); err != nil {
			return core.Outcome{}, err
		}
	}
	keep := int64(0) // what a reset leaves must be kept that long (Algorithm.Void)
	save := func(d core.Outcome) error {
		b, err := st.MarshalBinary()
		s.states[id] = stored{b: b, expires: now + max(d.Reset.Microseconds(), keep)}
		return err
	}
	after := a
	after.N, after.Lease, after.Keep = 1, 0, 0
	peek := func() core.Outcome { // on a copy, through the bytes again
		var c core.State
		b, _ := st.MarshalBinary()
		if err := c.UnmarshalBinary(b); err != nil {
			panic(err)
		}
		return alg.Step(&c, now, after)
	}
	switch req.Spec.Op {
	case core.OpTake:
		d := alg.Step(&st, now, a)
		if r := req.Receipt; r != nil && d.Allowed() {
			r.At = st.Time
		}
		return d, save(d)
	case core.OpPeek:
		after.N, after.Lease, after.Keep = a.N, a.Lease, a.Keep
		return peek(), nil
	case core.OpRefund:
		alg.Refund(&st, now, a)
	case core.OpDebit:
		if alg.Debit == nil {
			return core.Outcome{}, fmt.Errorf("bytesStore: %s takes no debts", alg.Name)
		}
		alg.Debit(&st, now, a)
		if r := req.Receipt; r != nil && a.Taken == -1 { // a take whatever the key has: its receipt
			r.At = st.Time
		}
		after.Keep = a.Keep // whether the debit left the key in debt, or in the reserve
	case core.OpReset:
		if _, held := s.states[id]; held && alg.Void != nil {
			keep = alg.Void(&st, now, a)
		} else {
			st = core.State{}
		}
	case core.OpExtend:
		held := alg.Extend(&st, now, a)
		d := peek()
		d = a.Outcome(held, d.Remaining, d.Wait, d.Reset)
		return d, save(d)
	default:
		return core.Outcome{}, fmt.Errorf("bytesStore: unknown op %q", req.Spec.Op)
	}
	d := peek()
	return d, save(d)
}

// The contract is enough for a store outside this module: one that keeps its states as
// bytes passes the whole conformance suite, sliding logs and leases included.
func TestBytesStore(t *testing.T) {
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store { return newBytesStore(clk) })
}

// A state survives MarshalBinary and UnmarshalBinary whole: a sliding log's, taken from
// localstore's own run of it, decides the same after the trip.
func TestStateRoundTrip(t *testing.T) {
	for _, st := range []core.State{
		{},
		{Time: -1, Level: 1 << 52, Aux: -(1 << 52)},
		{Time: 1767225600000000, Level: 3, Aux: 7},
	} {
		b, err := st.MarshalBinary()
		var got core.State
		if err != nil || got.UnmarshalBinary(b) != nil || got != st {
			t.Errorf("%+v: %v, back %+v", st, err, got)
		}
	}
	alg := slidinglog.Algorithm()
	a, err := alg.Prepare(core.Rule(ratelimit.PerSecond(100)), 3)
	if err != nil {
		t.Fatal(err)
	}
	var st core.State
	now := int64(1767225600000000)
	for i := range 20 {
		alg.Step(&st, now+int64(i)*7000, a)
	}
	b, _ := st.MarshalBinary()
	var back core.State
	if err := back.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if back.Log.Len() != st.Log.Len() || back.Log.Len() == 0 {
		t.Fatalf("%d events back of %d", back.Log.Len(), st.Log.Len())
	}
	for i := range st.Log.Len() {
		if back.Log.At(i) != st.Log.At(i) {
			t.Fatalf("event %d: %+v back as %+v", i, st.Log.At(i), back.Log.At(i))
		}
	}
	for _, dt := range []int64{0, 500, 80_000, 2_000_000} {
		if d1, d2 := alg.Step(&st, now+150_000+dt, a), alg.Step(&back, now+150_000+dt, a); d1 != d2 {
			t.Fatalf("at +%dµs: %+v, after the trip %+v", dt, d1, d2)
		}
	}
}

// Bad bytes are an error, never a panic, and leave the state as it was.
func TestStateUnmarshalBad(t *testing.T) {
	good, _ := core.State{Time: 5, Level: 6, Aux: 7}.MarshalBinary()
	for _, b := range [][]byte{
		nil, {}, {0}, {2, 0, 0, 0, 0}, good[:len(good)-1], append(bytes.Clone(good), 0),
		{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // 2^64-1 events
		{1, 0, 0, 0, 3, 2, 2}, // three events promised, half of one given
		{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, // a varint too long
	} {
		st := core.State{Time: 1, Level: 2}
		if err := st.UnmarshalBinary(b); err == nil || st != (core.State{Time: 1, Level: 2}) {
			t.Errorf("UnmarshalBinary(%x) = %v and %+v; want an error and the state unchanged", b, err, st)
		}
	}
}

// FuzzStateUnmarshal: any bytes either fail to decode or decode to a state that encodes
// back to the same bytes; nothing panics.
func FuzzStateUnmarshal(f *testing.F) {
	for _, st := range []core.State{{}, {Time: 9, Level: -3, Aux: 1 << 40}} {
		b, _ := st.MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{1, 2, 4, 6, 2, 10, 2, 12, 4})
	f.Fuzz(func(t *testing.T, b []byte) {
		var st core.State
		if st.UnmarshalBinary(b) != nil {
			return
		}
		again, _ := st.MarshalBinary()
		var st2 core.State
		if err := st2.UnmarshalBinary(again); err != nil {
			t.Fatalf("%x decodes, and its encoding %x does not: %v", b, again, err)
		}
		again2, _ := st2.MarshalBinary()
		if !bytes.Equal(again, again2) {
			t.Fatalf("%x: encodings %x and %x differ", b, again, again2)
		}
	})
}

// The bytes store and localstore decide alike on the same traffic (the conformance suite
// holds both to the same numbers; this is a spot check of a mixed sequence).
func TestBytesStoreAsLocalstore(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	ctx := context.Background()
	stores := []ratelimit.Store{newBytesStore(clk), localstore.New(localstore.WithClock(clk))}
	for _, k := range limitertest.Kinds {
		var ls [2]ratelimit.Limiter
		for i, s := range stores {
			l, err := k.New(s, ratelimit.Rule{Limit: 5, Period: time.Second, Burst: 8})
			if err != nil {
				t.Fatal(err)
			}
			ls[i] = l
		}
		for i := range 60 {
			clk.Advance(time.Duration(i%7) * 37 * time.Millisecond)
			n := int64(1 + i%3)
			d0, err0 := ls[0].AllowN(ctx, "k", n)
			d1, err1 := ls[1].AllowN(ctx, "k", n)
			if d0 != d1 || (err0 == nil) != (err1 == nil) {
				t.Fatalf("%s step %d: bytes store %+v, %v; localstore %+v, %v", k.Name, i, d0, err0, d1, err1)
			}
		}
	}
}

// TestOutcome: an Outcome made under Args keeps its Limit and whether it allowed, the
// zero Outcome included (a denial under a Limit of 0); its Wait is a delay when allowed
// and a retry when denied.
func TestOutcome(t *testing.T) {
	for _, limit := range []int64{0, 1, 10, math.MaxInt64} {
		for _, allowed := range []bool{false, true} {
			o := core.Args{Limit: limit}.Outcome(allowed, 3, time.Second, 2*time.Second)
			if o.Allowed() != allowed || o.Limit() != limit || o.Remaining != 3 || o.Wait != time.Second || o.Reset != 2*time.Second {
				t.Errorf("Outcome(%v) under %d: allowed %v, limit %d, %+v", allowed, limit, o.Allowed(), o.Limit(), o)
			}
		}
	}
	if o := (core.Outcome{}); o.Allowed() || o.Limit() != 0 {
		t.Errorf("the zero Outcome: allowed %v, limit %d; want a denial under 0", o.Allowed(), o.Limit())
	}
}
