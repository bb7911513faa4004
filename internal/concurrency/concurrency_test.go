package concurrency

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// FuzzInFlight checks the in-flight steps against a model, a map from lease id to
// expiry, on any sequence of acquires, releases, extensions and peeks at times that
// move forward (and sometimes back): never more leases alive than the limit; a lease
// alive until its expiry, and not after; a release or an extension renewing or dropping
// its own lease only; a lease released while not held refused to an acquire for a lease
// duration; and every Decision's numbers. After a clock step back, every operation
// brings each lease's expiry to at most a lease duration from now (the root doc's Time:
// a lease never lasts more than its duration from now), an extension that finds its
// lease gone included, and so the record of a release too.
func FuzzInFlight(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, uint8(3), uint8(10))
	f.Add([]byte{0, 0, 0, 0, 0x41, 0x81, 0xc1, 0x20, 0x20, 0x02}, uint8(1), uint8(2))
	f.Add([]byte("A\x9f0"), uint8(0), uint8(2)) // an extension of a lease not held, after a step back
	f.Fuzz(func(t *testing.T, ops []byte, limit, period uint8) {
		a := core.Args{N: 1, Limit: int64(limit%8) + 1, Period: (int64(period%50) + 1) * 1000}
		var st core.State
		model := map[int64]int64{}    // id -> expiry
		released := map[int64]int64{} // id of a lease released while not held -> when that is forgotten
		now := int64(1_000_000)
		for i, op := range ops {
			now += int64(op>>5) * 700 // 0 to 4.9ms forward
			if op&0x1f == 0x1f {
				now -= 3000 // a clock that steps back
			}
			a.Lease = int64(op&7) + 1
			for _, m := range []map[int64]int64{model, released} { // the model's expiry, and the clock rule
				for id, exp := range m {
					if exp <= now {
						delete(m, id)
					} else {
						m[id] = min(exp, now+a.Period)
					}
				}
			}
			_, held := model[a.Lease]
			_, gone := released[a.Lease]
			switch (op >> 3) & 3 {
			case 0, 1: // acquire
				d := decisionOf(acquireLease(&st, now, a))
				want := held || !gone && int64(len(model)) < a.Limit
				if d.Allowed != want {
					t.Fatalf("op %d: acquire of %d allowed %v, want %v (%d of %d held)", i, a.Lease, d.Allowed, want, len(model), a.Limit)
				}
				if want {
					model[a.Lease] = max(model[a.Lease], now+a.Period)
				}
				check(t, i, d, model, now, a)
				if !held && gone {
					if w := time.Duration(released[a.Lease]-now) * time.Microsecond; d.RetryAfter != w {
						t.Fatalf("op %d: an acquire of %d, released: RetryAfter %v; want %v, until that is forgotten", i, a.Lease, d.RetryAfter, w)
					}
				}
			case 2: // release
				if got := releaseLease(&st, now, a); got != map[bool]int64{true: 1}[held] {
					t.Fatalf("op %d: release of %d released %d; want %v", i, a.Lease, got, held)
				}
				if !held && !gone {
					released[a.Lease] = now + a.Period
				}
				delete(model, a.Lease)
			case 3: // extend
				if got := extendLease(&st, now, a); got != held {
					t.Fatalf("op %d: extend of %d held %v, want %v", i, a.Lease, got, held)
				}
				if held {
					model[a.Lease] = max(model[a.Lease], now+a.Period)
				}
			}
			if st.Level != int64(len(model)) || st.Log.Len() != len(model)+len(released) {
				t.Fatalf("op %d: %d leases and releases, Level %d; the model holds %d and %d", i, st.Log.Len(), st.Level, len(model), len(released))
			}
			for j := 0; j < st.Log.Len(); j++ {
				e := st.Log.At(j)
				if e.N > 0 && model[e.N] != e.At || e.N < 0 && released[-e.N] != e.At {
					t.Fatalf("op %d: lease %d expires (or is forgotten) at %d; the model says %d, %d", i, e.N, e.At, model[e.N], released[-e.N])
				}
			}
		}
	})
}

// check compares an acquire's Decision with the model after it.
func check(t *testing.T, i int, d decision, model map[int64]int64, now int64, a core.Args) {
	t.Helper()
	first, last := int64(-1), int64(-1)
	for _, exp := range model {
		if first < 0 || exp < first {
			first = exp
		}
		last = max(last, exp)
	}
	want := decision{Allowed: d.Allowed, Limit: a.Limit, Remaining: max(0, a.Limit-int64(len(model)))}
	if last >= 0 {
		want.ResetAfter = time.Duration(last-now) * time.Microsecond
	}
	if !d.Allowed {
		want.RetryAfter = time.Duration(first-now) * time.Microsecond
	}
	if !d.Allowed && d.RetryAfter != want.RetryAfter { // refused as released: its wait is checked apart
		want.RetryAfter = d.RetryAfter
	}
	if d != want {
		t.Fatalf("op %d: %+v, want %+v", i, d, want)
	}
}

// decision is ratelimit.Decision, which this package cannot import.
type decision struct {
	Allowed                       bool
	Limit, Remaining              int64
	Delay, RetryAfter, ResetAfter time.Duration
}

func decisionOf(o core.Outcome) decision {
	var d decision
	d.Allowed, d.Limit, d.Remaining, d.Delay, d.RetryAfter, d.ResetAfter = o.Split()
	return d
}
