// Package lend is how a store decides a core.Loan on a key's state and the key's
// record of loans: in Go (Decide, which localstore runs) and in Redis (lend.lua, beside
// it: Script, which redisstore sends, with the places of a loan's arguments in it). A
// test holds the two the same (internal/testkit/redissuite's LendParity).
package lend

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Record is what one holder has out of a key.
type Record struct {
	Holder int64
	Out    int64 // events lent and not given back: at most what the holder still has
	Until  int64 // when the record ends, in microseconds since the Unix epoch
	Limit  int64 // the Args.Limit and Period of the rule the events were lent under
	Period int64
	// Back is how many of the events out the key would still hold were they given back
	// as of Since, the instant of the holder's latest loan (or give): what it gives back
	// goes back no further, and Refund, as of Since (core.Receipt), bounds it by
	// what the key lacked since. At each loan Back is brought up to date, and Since to now.
	Back  int64
	Since int64
	Seq   int64 // the latest Loan.Seq of the holder's the record saw
}

// MaxTTL is the longest a loan stays on record: a hundred years.
const MaxTTL = 100 * 365 * 24 * time.Hour

// Check is the error of a loan no store decides: its key's algorithm does not lend, it
// names no holder, or asks a negative number.
func Check(l core.Loan) error {
	switch {
	case l.Spec == nil || l.Spec.Algorithm == nil:
		return errors.New("ratelimit: a loan without an algorithm")
	case !l.Spec.Algorithm.Lendable:
		return fmt.Errorf("ratelimit: %s does not lend", l.Spec.Algorithm.Name)
	case l.Spec.Op == core.OpDebit && (l.Holder != 0 || l.Spec.Algorithm.Debit == nil || l.Want < 1 || l.Want > mathx.MaxExact):
		return fmt.Errorf("ratelimit: a debit of %d of %s by a loan: want a partial take (no holder) of 1 to %d, of an algorithm that takes debts",
			l.Want, l.Spec.Algorithm.Name, int64(mathx.MaxExact))
	case l.Spec.Op != core.OpTake && l.Spec.Op != core.OpDebit || l.Spec.Reserve != 0 && l.Holder != 0:
		return fmt.Errorf("ratelimit: a loan of %s with an op %q, or a reserve and a holder", l.Spec.Algorithm.Name, l.Spec.Op)
	case l.Holder == 0 && (l.Give != 0 || l.Revoke || l.End || l.Seq != 0 || l.Out != 0 || l.Receipt != nil):
		return errors.New("ratelimit: a partial take (a loan without a holder) that gives back, revokes, ends, is numbered or asks a receipt")
	case l.End && (l.Want != 0 || l.Revoke || l.Receipt != nil):
		return errors.New("ratelimit: a loan that ends its record, and wants, revokes or asks a receipt")
	case l.Give < 0 || l.Want < 0 || l.Share < 0 || l.TTL < 0 || l.Seq < 0 || l.Out < 0 ||
		max(l.Give, l.Want, l.Share, l.Seq, l.Out) > mathx.MaxExact || l.TTL > MaxTTL:
		return fmt.Errorf("ratelimit: a loan giving %d, wanting %d of %d shares, for %v, numbered %d with %d out: want 0 to %d, for %v at most",
			l.Give, l.Want, l.Share, l.TTL, l.Seq, l.Out, int64(mathx.MaxExact), MaxTTL)
	}
	return nil
}

// Debits reports whether every loan is a partial take's debit: no holder, no record,
// what it wants taken whatever the key has left.
func Debits(loans []core.Loan) bool {
	for _, l := range loans {
		if l.Holder != 0 || l.Spec == nil || l.Spec.Op != core.OpDebit {
			return false
		}
	}
	return true
}

// Args are the Args of a loan's take (N 1), and the error of its rule; Check first.
func Args(l core.Loan) (core.Args, error) {
	return core.Request{N: 1, Spec: l.Spec}.Args()
}

// Decide decides l on st and recs at now, a its Args: it drops the records that have
// ended or that were lent under another rule, takes back the holder's Give (no more than
// its record holds out; for a numbered loan, also what the record holds beyond l.Out),
// drops every record for a Revoke, and lends what
// l wants of what the key has left, divided by l.Share or by the holders with events
// out, whichever is more (by l.Share alone in the last quarter of a window); then it renews the holder's record (or drops it, if nothing is
// out; for an End, drops it). A numbered loan no later than the record's latest changes
// nothing. It returns
// the Lent and the records after, in recs' array.
func Decide(alg *core.Algorithm, st *core.State, recs []Record, now int64, a core.Args, l core.Loan) (core.Lent, []Record) {
	a.Lease = 0
	if l.Holder == 0 { // a partial take: no record, and what its reserve keeps back kept
		return partial(alg, st, now, a, l), recs
	}
	a.Keep = 0
	mine := Record{Holder: l.Holder, Limit: a.Limit, Period: a.Period}
	var kept bool
	if n, share := int64(len(recs)), max(1, l.Share); l.Revoke || n > share || n == share && !holds(recs, l.Holder) {
		kept, recs = take(recs, &mine, now, a)
	} else { // no more holders than shares: lent by its shares whatever the others hold
		kept, recs = takeOwn(recs, &mine, now, a)
	}
	if kept && l.Seq > 0 && l.Seq <= mine.Seq { // late: its holder settled it by a later loan
		_, o := takeUpTo(alg, st, now, a, 0, 1)
		var held time.Duration
		if mine.Out > 0 {
			held = time.Duration(mine.Until-now) * time.Microsecond
		}
		return core.Lent{Outcome: o, For: held, Kept: true, Out: mine.Out}, append(recs, mine)
	}
	if kept {
		mine.Back = refundable(alg, st, now, a, mine)
		give := min(l.Give, mine.Out)
		if l.Seq > 0 { // what a loan whose answer was lost lent, or what one gave that did not land
			give = min(mine.Out, give+max(0, mine.Out-l.Out))
		}
		if give > 0 {
			if back := min(give, mine.Back); back > 0 {
				g := a
				g.N, g.Taken = back, mine.Since
				alg.Refund(st, now, g)
				mine.Back -= back
			}
			mine.Out -= give
		}
	}
	if l.Revoke { // every record, this holder's too: what it holds was lent before
		recs, mine.Out = recs[:0], 0
	}
	holders := int64(1)
	for _, r := range recs {
		if r.Out > 0 {
			holders++
		}
	}
	if closing(alg, now, a.Period) { // what the holders leave unlent now ends with the window
		holders = 1
	}
	if l.End { // the record ends: what it holds out was spent
		_, o := takeUpTo(alg, st, now, a, 0, 1)
		return core.Lent{Outcome: o, Kept: kept}, recs
	}
	a.Taken = core.TakenNow // a loan may be given back
	lent, o := takeUpTo(alg, st, now, a, l.Want, max(l.Share, holders))
	mine.Out += lent
	mine.Back = min(mine.Back+lent, mine.Out)
	if lent > 0 || !kept {
		mine.Since = st.Time // the loan's instant, after all the key has seen before it
	}
	if lent > 0 && l.Receipt != nil {
		l.Receipt.At = mine.Since
	}
	mine.Seq = max(mine.Seq, l.Seq)
	var until int64
	if mine.Out > 0 || l.Seq > 0 { // a numbered loan's record outlives its events: a loan arriving late finds it
		mine.Until = End(alg, now, a.Period, l.TTL)
		recs = append(recs, mine)
		if mine.Out > 0 {
			until = mine.Until
		}
	}
	return core.Lent{Outcome: o, N: lent, For: time.Duration(max(0, until-now)) * time.Microsecond, Kept: kept, Out: mine.Out}, recs
}

// refundable is how many of r's events out st would still hold now, were they given
// back: r.Back, as far as a refund of them as of r.Since gives back (a refund on a copy).
func refundable(alg *core.Algorithm, st *core.State, now int64, a core.Args, r Record) int64 {
	if r.Back <= 0 {
		return 0
	}
	probe := core.Clone(*st)
	g := a
	g.N, g.Taken = r.Back, r.Since
	return alg.Refund(&probe, now, g)
}

// partial takes what l wants of what the key has left, at most, as a take would (keeping
// its reserve), or all of it for a debit, and keeps no record.
func partial(alg *core.Algorithm, st *core.State, now int64, a core.Args, l core.Loan) core.Lent {
	if l.Spec != nil && l.Spec.Op == core.OpDebit { // then a peek of 1 at the reserve, as Apply answers a debit
		d := a
		d.N, d.Taken = l.Want, 0
		alg.Debit(st, now, d)
		peek := core.Clone(*st)
		a.N, a.Taken = 1, 0
		return core.Lent{Outcome: alg.Step(&peek, now, a), N: l.Want}
	}
	lent, o := takeUpTo(alg, st, now, a, l.Want, max(l.Share, 1))
	return core.Lent{Outcome: o, N: lent}
}

// takeUpTo takes from st at most want events, and at most a share of what it has left
// (as a take of a would leave it, keeping its reserve), but one when that share is none, and returns how many with the
// Outcome: the take's, or a peek's of 1 when it took none.
func takeUpTo(alg *core.Algorithm, st *core.State, now int64, a core.Args, want, share int64) (int64, core.Outcome) {
	peek := core.Clone(*st)
	one := a
	one.N, one.Taken = 1, 0
	o := alg.Step(&peek, now, one)
	var lent int64
	if want > 0 && o.Allowed() { // the last few events too, one to each asker
		lent = min(want, max(1, (o.Remaining+1)/share))
	}
	if lent > 0 {
		take := a
		take.N = lent
		if o = alg.Step(st, now, take); !o.Allowed() { // cannot be: no more is taken than is left
			lent = 0
		}
	}
	return lent, o
}

// holds reports whether recs has a record of holder's.
func holds(recs []Record, holder int64) bool {
	return slices.ContainsFunc(recs, func(r Record) bool { return r.Holder == holder })
}

// takeOwn removes the holder's own record from recs, and copies it into mine unless it
// ended by now or was lent under a rule other than a's; it reports whether it did. The
// others stay, ended or not, until a loan reads them all (take): a key whose holders,
// with the asker, are no more than its loan's shares lends by the shares, whatever the
// others hold, and lend.lua then reads one record, not every instance's.
func takeOwn(recs []Record, mine *Record, now int64, a core.Args) (bool, []Record) {
	for i, r := range recs {
		if r.Holder != mine.Holder {
			continue
		}
		recs = slices.Delete(recs, i, i+1)
		if r.Until <= now || r.Limit != a.Limit || r.Period != a.Period {
			return false, recs
		}
		mine.Out, mine.Until, mine.Back, mine.Since, mine.Seq = r.Out, r.Until, r.Back, r.Since, r.Seq
		return true, recs
	}
	return false, recs
}

// take removes from recs the records that ended by now or were lent under a rule other
// than a's, and the holder's own, which it copies into mine; it reports whether the
// holder's was there.
func take(recs []Record, mine *Record, now int64, a core.Args) (bool, []Record) {
	kept := false
	live := recs[:0]
	for _, r := range recs {
		switch {
		case r.Until <= now || r.Limit != a.Limit || r.Period != a.Period:
		case r.Holder == mine.Holder:
			mine.Out, mine.Until, mine.Back, mine.Since, mine.Seq, kept = r.Out, r.Until, r.Back, r.Since, r.Seq, true
		default:
			live = append(live, r)
		}
	}
	return kept, live
}

// closing reports whether now is in the last quarter of its window, for a Windowed
// algorithm (its Period-aligned window, or its calendar window). A loan there is divided
// by its Share alone, not by the holders. Each loan of a key asked beyond its rule took a
// holder's part of what was left; the rest stayed unlent, ending with a fixed window. A
// sliding window so admitted 0.72 of its rule, four instances asking four times it.
func closing(alg *core.Algorithm, now, period int64) bool {
	start, end, ok := Window(alg, now, period)
	return ok && (end-now)*4 <= end-start
}

// Window is the window that holds now, [start, end) in microseconds, of a Windowed
// algorithm whose rule's Period is period (microseconds): Period-aligned, or its calendar
// window. ok is false for an algorithm without windows.
func Window(alg *core.Algorithm, now, period int64) (start, end int64, ok bool) {
	switch {
	case !alg.Windowed:
		return 0, 0, false
	case alg.Window != nil:
		w := alg.Window(now)
		return w.Start, w.End, w.End > w.Start
	case period > 0:
		start = mathx.FloorDiv(now, period) * period
		return start, start + period, true
	}
	return 0, 0, false
}

// End is when a loan made at now for ttl ends: ttl from now, and for a Windowed
// algorithm no later than the end of the window of now (Period-aligned, or its calendar
// window).
func End(alg *core.Algorithm, now, period int64, ttl time.Duration) int64 {
	end := now + max(1, ttl.Microseconds())
	if end < now { // a TTL of centuries
		end = math.MaxInt64
	}
	switch {
	case !alg.Windowed:
	case alg.Window != nil:
		end = min(end, alg.Window(now).End)
	case period > 0:
		end = min(end, (now/period+1)*period)
	}
	return end
}
