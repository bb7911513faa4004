package core

import (
	"github.com/ratelimit-go/ratelimit/internal/eventlog"
)

// A refund carries the receipt of its take (ratelimit.Receipt): the instant the store
// decided it at. An algorithm gives back only what the key would still hold had the take
// been smaller from the start, so that a refund never creates allowance:
//
//   - a window, the events of a take of its current window (and a sliding window's of the
//     previous one, off that window's count): those of an older window are history;
//   - a sliding log, the take's own events, while they are in the log;
//   - a bucket, no more than the least it has lacked of full since the take (its deficit:
//     a token bucket's capacity less its tokens, a leaky bucket's queued work). A bucket
//     that was full at any moment since (or whose queue emptied) would hold those events
//     no more: the refill past full was lost. The record of deficits below keeps that
//     least for any take a refund may name.
//
// Receipts of takes at or before a key's floor give back nothing: a reset voids the
// takes before it, and so does a clock stepped back by more than a period (the state
// moves back, and the instants up to its latest before the step name takes of another
// moment of the key: the floor stays there until the clock has passed it). A floor never
// moves back. A bucket's floor is the first entry of its record; a window's is the one
// entry of its Log (none until a reset or a step back); a sliding log's is its Aux.

// TakenNow is Args.Taken of a take that carries a Receipt.
const TakenNow = -1

// DeficitsMax bounds the record of a bucket's deficits; past it, two entries merge, each
// take between them then seeing the smaller deficit of the two: less given back, never
// more.
const DeficitsMax = 8

// The record of a bucket's deficits is kept in State.Log while a take with a receipt may
// still be refunded: entries (At: an instant, N: a deficit), the instants never
// decreasing and the deficits rising, each the least deficit the key has had from its
// instant on; the first entry is the floor (deficit 0), before which nothing is given
// back. An empty or nil Log is no record: nothing is given back.

// ReceiptAt starts the record of st's deficits for a take with a receipt at t, unless it
// runs already (receipts of takes before t then give back nothing), and returns the
// instant the take is decided at: t, or just past t when the record's newest entry is at
// t already (a refund in the same microsecond, say), so that the take's receipt sees
// every entry after it and none before. The key's clock then moves that microsecond
// without refill: less allowance, never more.
func ReceiptAt(st *State, t int64) int64 {
	if st.Log == nil {
		st.Log = &eventlog.Log{}
	}
	if st.Log.Len() == 0 {
		st.Log.Append(eventlog.Event{At: t - 1, N: 0})
	}
	if st.Log.NewestAt() == t {
		return t + 1
	}
	return t // an entry after t (a floor a clock stepped back left): the receipt gives back less, or nothing
}

// Recording reports whether st keeps a record of its deficits.
func Recording(st *State) bool { return st.Log != nil && st.Log.Len() > 0 }

// NoteRise records, for an event at t that raises st's deficit (a take, a debit), the
// deficit it found: the least since the previous event. It is noted just before t, so
// that the receipt of a take at t does not count what that take found.
func NoteRise(st *State, t, deficit int64) {
	if Recording(st) {
		note(st.Log, t-1, deficit)
	}
}

// NoteRefund records a refund at t that gave back give of the take at taken, leaving the
// deficit left. Had that take cost give less from the start, the key would have lacked
// give less at every instant since it: every entry from taken on falls by give, and none
// before stays above the first of them after its fall. A later refund of any take then
// reads the deficits this one left, so two refunds never give back one deficit twice.
func NoteRefund(st *State, taken, t, give, left int64) {
	if !Recording(st) || give <= 0 {
		return
	}
	log := st.Log
	from := log.Len() // the first entry at or after taken (never the floor: taken is past it)
	for i := 1; i < log.Len(); i++ {
		if log.At(i).At >= taken {
			from = i
			break
		}
	}
	ceiling := left // the least deficit from taken on, after the refund
	if from < log.Len() {
		ceiling = log.At(from).N - give
	}
	for i := from; i < log.Len(); i++ {
		e := log.At(i)
		e.N -= give
		log.Set(i, e)
	}
	// the entries before taken above the ceiling now read it: the next entry, or the
	// deficit now, answers for their instants with the same value
	for i := from - 1; i >= 1 && log.At(i).N >= ceiling; i-- {
		log.Remove(i)
	}
	note(log, t, left)
}

// note adds the deficit m seen at t to the record, keeping only what a query may return:
// an entry whose deficit is at least m says nothing once m is seen later.
func note(log *eventlog.Log, t, m int64) {
	t = max(t, log.NewestAt()) // instants never decrease
	for log.Len() > 0 && log.At(log.Len()-1).N >= m {
		log.Remove(log.Len() - 1)
	}
	log.Append(eventlog.Event{At: t, N: m})
	if log.Len() > DeficitsMax {
		merge(log)
	}
}

// merge joins two neighbouring entries, the later instant with the smaller deficit, so
// that the takes between them see the smaller one: the two whose deficits are closest in
// proportion, where the takes between them lose the least part of what they may get
// back (a refund is never more than its take, most often far less than a deficit).
func merge(log *eventlog.Log) {
	at, best := 0, -1.0
	for i := 0; i+1 < log.Len(); i++ {
		if r := float64(log.At(i).N) / float64(log.At(i+1).N); r > best {
			at, best = i, r
		}
	}
	log.Set(at+1, eventlog.Event{At: log.At(at + 1).At, N: log.At(at).N})
	log.Remove(at)
}

// LeastDeficit is the least deficit st has had since a take at taken, now being deficit:
// what a refund of that take may give back, at most. 0 when st keeps no record, or its
// floor comes at or after taken, or taken is not an instant of st's past.
func LeastDeficit(st *State, taken, deficit int64) int64 {
	if !Recording(st) || taken <= 0 || taken <= st.Log.Oldest().At || taken > st.Time {
		return 0
	}
	for i := 1; i < st.Log.Len(); i++ {
		if e := st.Log.At(i); e.At >= taken {
			return min(e.N, deficit)
		}
	}
	return max(0, deficit)
}

// ForgetDeficits drops the record of a bucket that is full (its deficit 0) at t: every
// receipt before gives nothing back now, and the key is as one never seen, which keeps
// no record. A floor at t or later (a reset in this microsecond) stays, alone.
func ForgetDeficits(st *State, t int64) {
	if !Recording(st) {
		return
	}
	if floor := st.Log.Oldest(); floor.At >= t {
		st.Log.Clear()
		st.Log.Append(floor)
		return
	}
	st.Log = nil
}

// VoidDeficits starts st's record of deficits anew with its floor at t, or at its floor
// now if that is later (a floor never moves back): receipts of takes at or before it give
// back nothing (the clock stepped back and the state with it, or the key was reset).
func VoidDeficits(st *State, t int64) {
	if Recording(st) {
		t = max(t, st.Log.Oldest().At)
	}
	if st.Log == nil {
		st.Log = &eventlog.Log{}
	}
	st.Log.Clear()
	st.Log.Append(eventlog.Event{At: t, N: 0})
}

// VoidBucket leaves st, a bucket reset, with its latest instant alone and a record of
// deficits whose floor is there, or at its floor now if that is later: the receipts of
// the takes before give nothing back. Its other fields are the zero State's, which each
// bucket reads as reset: a token bucket full, a leaky bucket's queue empty.
func VoidBucket(st *State) {
	t, log := st.Time, st.Log
	*st = State{Time: t, Log: log}
	VoidDeficits(st, t)
}

// VoidCounts leaves st, a window reset, with its latest instant alone and a floor there,
// or at its floor now if that is later: the receipts of the takes before give nothing
// back.
func VoidCounts(st *State) {
	t, log := st.Time, st.Log
	*st = State{Time: t, Log: log}
	SetFloor(st, t)
}

// Floor is the instant at or before which the receipts of a window's takes give back
// nothing: the one entry of its Log, set by a reset; the smallest instant without one.
func Floor(st *State) int64 {
	if st.Log == nil || st.Log.Len() == 0 {
		return MinInstant
	}
	return st.Log.Oldest().At
}

// MinInstant is before every instant a receipt holds.
const MinInstant = -1 << 62

// SetFloor makes st's receipts of takes at or before t, or before its floor if that is
// later (a floor never moves back), give back nothing (a reset, a clock stepped back).
func SetFloor(st *State, t int64) {
	t = max(t, Floor(st))
	st.Log = &eventlog.Log{}
	st.Log.Append(eventlog.Event{At: t, N: 0})
}

// InnerReceipts is reqs for a decorator store to send on, each request that carries a
// Receipt with one of its own in place of the caller's, for the next store to write.
func InnerReceipts(reqs []Request) []Request {
	out := make([]Request, len(reqs))
	for i, r := range reqs {
		out[i] = r
		if r.Receipt != nil {
			out[i].Receipt = &Receipt{}
		}
	}
	return out
}

// WireReceipts writes into the callers' Receipts of reqs, for the takes admitted, the way
// a decorator sent them (via) and the next store's Receipts (those of sent, from
// InnerReceipts); a take admitted and taken nowhere (no instant written: a fail-open
// store's) gets the instant now, and gives nothing back.
func WireReceipts(reqs, sent []Request, os []Outcome, via, now int64) {
	for i, r := range reqs {
		outer := r.Receipt
		switch {
		case outer == nil || !os[i].Allowed() || r.Spec.Op != OpTake:
		case sent[i].Receipt.At > 0:
			outer.At, outer.Via, outer.Next = sent[i].Receipt.At, via, sent[i].Receipt
		case now > 0:
			outer.At, outer.Via, outer.Next = now, via, nil
		}
	}
}
