package ratelimit

import (
	"testing"
	"time"
)

// FuzzInFlight checks the in-flight steps against a model, a map from lease id to
// expiry, on any sequence of acquires, releases, extensions and peeks at times that
// move forward (and sometimes back): never more leases alive than the limit; a lease
// alive until its expiry, and not after; a release or an extension renewing or dropping
// its own lease only; and every Decision's numbers. After a clock step back, every
// operation brings each lease's expiry to at most a lease duration from now (the root
// doc's Time: a lease never lasts more than its duration from now), an extension that
// finds its lease gone included.
func FuzzInFlight(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, uint8(3), uint8(10))
	f.Add([]byte{0, 0, 0, 0, 0x41, 0x81, 0xc1, 0x20, 0x20, 0x02}, uint8(1), uint8(2))
	f.Add([]byte("A\x9f0"), uint8(0), uint8(2)) // an extension of a lease not held, after a step back
	f.Fuzz(func(t *testing.T, ops []byte, limit, period uint8) {
		a := Args{N: 1, Limit: int64(limit%8) + 1, Period: (int64(period%50) + 1) * 1000}
		var st State
		model := map[int64]int64{} // id -> expiry
		now := int64(1_000_000)
		for i, op := range ops {
			now += int64(op>>5) * 700 // 0 to 4.9ms forward
			if op&0x1f == 0x1f {
				now -= 3000 // a clock that steps back
			}
			a.Lease = int64(op&7) + 1
			for id, exp := range model { // the model's expiry, and the clock rule
				if exp <= now {
					delete(model, id)
				} else {
					model[id] = min(exp, now+a.Period)
				}
			}
			_, held := model[a.Lease]
			switch (op >> 3) & 3 {
			case 0, 1: // acquire
				d := acquireLease(&st, now, a).Decision()
				want := held || int64(len(model)) < a.Limit
				if d.Allowed != want {
					t.Fatalf("op %d: acquire of %d allowed %v, want %v (%d of %d held)", i, a.Lease, d.Allowed, want, len(model), a.Limit)
				}
				if want {
					model[a.Lease] = max(model[a.Lease], now+a.Period)
				}
				check(t, i, d, model, now, a)
			case 2: // release
				releaseLease(&st, now, a)
				delete(model, a.Lease)
			case 3: // extend
				if got := extendLease(&st, now, a); got != held {
					t.Fatalf("op %d: extend of %d held %v, want %v", i, a.Lease, got, held)
				}
				if held {
					model[a.Lease] = max(model[a.Lease], now+a.Period)
				}
			}
			if st.Level != int64(st.Log.Len()) || st.Log.Len() != len(model) {
				t.Fatalf("op %d: %d leases, Level %d; the model holds %d", i, st.Log.Len(), st.Level, len(model))
			}
			for j := 0; j < st.Log.Len(); j++ {
				e := st.Log.At(j)
				if model[e.N] != e.At {
					t.Fatalf("op %d: lease %d expires at %d; the model says %d", i, e.N, e.At, model[e.N])
				}
			}
		}
	})
}

// check compares an acquire's Decision with the model after it.
func check(t *testing.T, i int, d Decision, model map[int64]int64, now int64, a Args) {
	t.Helper()
	first, last := int64(-1), int64(-1)
	for _, exp := range model {
		if first < 0 || exp < first {
			first = exp
		}
		last = max(last, exp)
	}
	want := Decision{Allowed: d.Allowed, Limit: a.Limit, Remaining: max(0, a.Limit-int64(len(model)))}
	if last >= 0 {
		want.ResetAfter = time.Duration(last-now) * time.Microsecond
	}
	if !d.Allowed {
		want.RetryAfter = time.Duration(first-now) * time.Microsecond
	}
	if d != want {
		t.Fatalf("op %d: %+v, want %+v", i, d, want)
	}
}
