package lend_test

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/eventlog"
	"github.com/ratelimit-go/ratelimit/internal/lend"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// FuzzDecide: whatever the loans, gives back, takes and time, a key's state is what its
// algorithm alone makes of the takes the loans lent and the gives back their records
// allowed (nothing else touches it), a holder's record holds what it was lent and has
// not given back, a give never returns more than that, and a loan never lends more than
// it wants, nor more than its share of what is left (one event when that is none). A
// numbered loan also gives back what the record holds beyond its Out, and one numbered
// no later than the record's latest changes nothing. A last loan (End) ends the record.
func FuzzDecide(f *testing.F) {
	f.Add([]byte{0, 5, 1, 2, 3, 40, 7, 1, 9, 200, 3, 3})
	f.Add([]byte{1, 200, 7, 7, 7, 100, 0, 0, 0, 255, 255, 1, 2, 3, 4})
	f.Add([]byte{2, 9, 9, 1, 80, 3, 4, 40, 40, 2, 0, 0, 0})
	algs := []*core.Algorithm{tokenbucket.Algorithm(), fixedwindow.Algorithm(), slidingwindow.Algorithm()}
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int64 {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int64(b)
		}
		alg := algs[next()%3]
		rule := ratelimit.Rule{Limit: 1 + next()%50, Period: time.Duration(1+next()%20) * 100 * time.Millisecond}
		a, err := alg.Prepare(core.Rule(rule), 1)
		if err != nil {
			t.Skip()
		}
		var st, shadow core.State
		var recs []lend.Record
		out := map[int64]int64{}  // what each holder's record holds out
		seqs := map[int64]int64{} // and the latest of its numbered loans
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		for len(data) > 0 {
			op := next() % 4
			now += next() * 7919 // some microseconds, up to about 2s
			if op == 3 {         // a take beside the loans
				ta := a
				o := alg.Step(&st, now, ta)
				if so := alg.Step(&shadow, now, ta); so != o {
					t.Fatalf("a take: %+v, alone %+v", o, so)
				}
				continue
			}
			holder := next() % 4 // 0: a partial take, with no record
			l := core.Loan{Key: "k", Holder: holder, Give: next() % (out[holder] + 1), Want: next() % 60,
				Share: next() % 4, TTL: time.Duration(1+next()%30) * 100 * time.Millisecond, Revoke: next()%17 == 0}
			if holder == 0 {
				l.Give, l.Revoke = 0, false
			} else if !l.Revoke && next()%11 == 0 { // its last loan: the record ends
				l.Want, l.End = 0, true
			}
			if holder != 0 && next()%2 == 1 { // numbered: now and then late, or counting what a lost answer changed
				l.Seq = max(1, seqs[holder]+next()%8-2)
				l.Out = max(0, out[holder]+next()%7-3)
			}
			var mine lend.Record // the holder's record before the loan
			for _, r := range recs {
				if r.Holder == holder {
					mine = r
				}
			}
			got, after := lend.Decide(alg, &st, recs, now, a, l)
			recs = after
			if got.Kept && l.Seq > 0 && l.Seq <= mine.Seq { // late: nothing changes
				for _, r := range recs {
					if r.Holder == holder && r != mine {
						t.Fatalf("a late loan %+v changed the record %+v to %+v", l, mine, r)
					}
				}
				if got.N != 0 || got.Out != out[holder] || st.Time != shadow.Time || st.Level != shadow.Level || st.Aux != shadow.Aux || !sameLog(st.Log, shadow.Log) {
					t.Fatalf("a late loan %+v: %+v, state %+v; before %+v", l, got, st, shadow)
				}
				continue
			}
			seqs[holder] = max(seqs[holder], l.Seq)
			// the shadow: the record's give back, as far as the key would still hold what
			// it has out (a refund of it as of its latest loan, on a copy), then the take of
			// what was lent, with a receipt
			give := l.Give
			if l.Seq > 0 {
				give += max(0, out[holder]-l.Out)
			}
			give = min(give, out[holder])
			if got.Kept {
				if give > 0 && mine.Back > 0 {
					probe := core.Clone(shadow)
					g := a
					g.N, g.Taken = mine.Back, mine.Since
					if back := min(give, alg.Refund(&probe, now, g)); back > 0 {
						g.N = back
						alg.Refund(&shadow, now, g)
					}
				}
				out[holder] -= give
			} else {
				out[holder] = 0
			}
			if l.Revoke { // every record, this holder's too
				for h := range out {
					out[h] = 0
				}
			}
			if l.End { // the record ends: what it held out was spent
				out[holder] = 0
			}
			peek := core.Clone(shadow) // what was left once the give was back
			before := int64(0)
			if o := alg.Step(&peek, now, a); o.Allowed() {
				before = o.Remaining + 1
			}
			if got.N > 0 {
				g := a
				g.N = got.N
				if holder != 0 {
					g.Taken = core.TakenNow
				}
				if so := alg.Step(&shadow, now, g); !so.Allowed() {
					t.Fatalf("lent %d that the key alone would not take: %+v", got.N, so)
				}
				if holder != 0 { // a partial take holds nothing on record
					out[holder] += got.N
				}
			}
			if st.Time != shadow.Time || st.Level != shadow.Level || st.Aux != shadow.Aux || !sameLog(st.Log, shadow.Log) {
				t.Fatalf("after %+v: state %+v; the algorithm alone %+v", l, st, shadow)
			}
			if got.N > l.Want || got.N > max(1, before/max(1, l.Share)) {
				t.Fatalf("lent %d of %d wanted, %d left, share %d", got.N, l.Want, before, l.Share)
			}
			held := int64(0)
			for _, r := range recs {
				if r.Holder == holder {
					held = r.Out
					if r.Until <= now || r.Until > now+l.TTL.Microseconds() {
						t.Fatalf("record until %d at %d, ttl %v", r.Until, now, l.TTL)
					}
				}
			}
			if held != out[holder] || holder != 0 && got.Out != held {
				t.Fatalf("holder %d's record holds %d; it was lent %d it did not give back", holder, held, out[holder])
			}
		}
	})
}

// TestEnd: a loan ends after its TTL, and for a windowed algorithm with its window.
func TestEnd(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 40, 0, time.UTC).UnixMicro()
	minute := time.Minute.Microseconds()
	if got := lend.End(tokenbucket.Algorithm(), now, minute, time.Hour); got != now+time.Hour.Microseconds() {
		t.Errorf("a token bucket's loan for an hour ends at %d; want %d", got, now+time.Hour.Microseconds())
	}
	if got := lend.End(fixedwindow.Algorithm(), now, minute, time.Hour); got != now+20*time.Second.Microseconds() {
		t.Errorf("a fixed window's loan ends at %d; want the window's end, %d", got, now+20*time.Second.Microseconds())
	}
	if got := lend.End(fixedwindow.Algorithm(), now, minute, time.Second); got != now+time.Second.Microseconds() {
		t.Errorf("a fixed window's loan for a second ends at %d; want %d", got, now+time.Second.Microseconds())
	}
}

// sameLog reports whether two logs hold the same entries (nil and empty alike).
func sameLog(a, b *eventlog.Log) bool {
	n := func(l *eventlog.Log) int {
		if l == nil {
			return 0
		}
		return l.Len()
	}
	if n(a) != n(b) {
		return false
	}
	for i := range n(a) {
		if a.At(i) != b.At(i) {
			return false
		}
	}
	return true
}
