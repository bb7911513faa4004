package eventlog

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// check fails t unless l holds exactly want, in order, in a ring of a power-of-two length.
func check(t *testing.T, step int, l *Log, want []Event) {
	t.Helper()
	if n := len(l.buf); n != 0 && n&(n-1) != 0 {
		t.Fatalf("step %d: a ring of %d entries; want a power of two", step, n)
	}
	got := make([]Event, l.Len())
	for i := range got {
		got[i] = l.At(i)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("step %d: the log holds %v; want %v", step, got, want)
	}
	if k := len(want); k > 0 && (l.Oldest() != want[0] || l.NewestAt() != want[k-1].At) {
		t.Fatalf("step %d: oldest %v and newest at %d; want %v and %d", step, l.Oldest(), l.NewestAt(), want[0], want[k-1].At)
	}
}

// FuzzLog drives a Log and a plain slice through the same operations, wrapping the ring
// around and growing it, and requires the same entries after each.
func FuzzLog(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(7), uint64(7))
	f.Add(uint64(42), uint64(3))
	f.Fuzz(func(t *testing.T, s1, s2 uint64) {
		rng := rand.New(rand.NewPCG(s1, s2))
		var l Log
		var want []Event
		at := int64(0)
		for step := range 400 {
			switch op := rng.IntN(10); {
			case op < 4: // Push, merged with the newest at the same instant
				at += rng.Int64N(2)
				n := 1 + rng.Int64N(3)
				l.Push(at, n)
				if k := len(want); k > 0 && want[k-1].At == at {
					want[k-1].N += n
				} else {
					want = append(want, Event{At: at, N: n})
				}
			case op == 4:
				e := Event{At: rng.Int64N(100), N: rng.Int64N(100)}
				l.Append(e)
				want = append(want, e)
			case op < 7 && len(want) > 0:
				if e := l.Pop(); e != want[0] {
					t.Fatalf("step %d: Pop gives %v; want %v", step, e, want[0])
				}
				want = want[1:]
			case op == 7 && len(want) > 0:
				i := rng.IntN(len(want))
				if rng.IntN(2) == 0 {
					l.Remove(i)
					want = slices.Delete(want, i, i+1)
				} else {
					e := Event{At: rng.Int64N(100), N: 1}
					l.Set(i, e)
					want[i] = e
				}
			case op == 8:
				n := rng.Int64N(6)
				removed := int64(0)
				for removed < n && len(want) > 0 {
					k := len(want) - 1
					take := min(n-removed, want[k].N)
					want[k].N -= take
					removed += take
					if want[k].N == 0 {
						want = want[:k]
					}
				}
				if got := l.TrimNewest(n); got != removed {
					t.Fatalf("step %d: TrimNewest(%d) removed %d; want %d", step, n, got, removed)
				}
			case op == 9:
				switch rng.IntN(3) {
				case 0:
					c := l.Clone()
					check(t, step, c, want)
					var scratch Log
					scratch.CopyFrom(&l)
					check(t, step, &scratch, want)
					scratch.Push(at+1, 1) // shares no memory with l
				case 1:
					cut := rng.Int64N(at + 1)
					l.Expire(cut)
					want = slices.DeleteFunc(want, func(e Event) bool { return e.At <= cut })
				default:
					if rng.IntN(8) == 0 {
						l.Clear()
						want = want[:0]
					}
				}
			}
			check(t, step, &l, want)
		}
	})
}
