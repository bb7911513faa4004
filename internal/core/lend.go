package core

import (
	"context"
	"time"
)

// Lender is a Store that lends a key's events to an instance ahead of its requests, so
// that the instance decides them from memory (hotkey.Leases does). A loan is conserved:
// the store takes the events lent from the key's state, as a take of them would, and
// records what each holder has out and until when; what a holder gives back goes back to
// the key, never more than it has on record. A loan not renewed by its end is dropped
// from the record, its events counted as spent: no event is ever created, and the key
// admits at most what its rule allows, with or without lenders.
//
// Lend decides loans in order, each atomically, and returns what each lent; loans of
// several keys may share one round trip (redisstore sends one call per Redis node). An
// error is the backend's (nothing is known of what was lent: a numbered loan settles
// it), or the caller's for an invalid loan (nothing is lent).
//
// localstore, redisstore and fallback are Lenders.
type Lender interface {
	Store
	Lend(ctx context.Context, loans []Loan) ([]Lent, error)
}

// Loan is what one holder asks of one key: to give back events it has not spent, and to
// borrow more.
type Loan struct {
	// Key and Spec name the key and its rule, as the Request of a take would; Spec's
	// Algorithm is Lendable, its Op OpTake, and its Reserve too but for a partial take.
	// A partial take's Op may be OpDebit (for an algorithm that takes debts): it charges
	// Want whole, whatever the key has left, as a Request of that Op would; its Lent says
	// Want was taken, and its Outcome is the debit's (a peek of 1 after it).
	Key  string
	Spec *Spec

	// Holder names the borrower: the store keeps one record per holder and key, of the
	// events it has out and until when. 0 names none: a partial take (as many as the key
	// has left, up to Want, kept by no record: AlgorithmLimiter.AllowAtMost), which keeps
	// what its Spec's Reserve keeps back, and gives nothing back.
	Holder int64

	// Give is how many events of the holder's loan it gives back first, unspent: never
	// more than the record holds out, and none if the record is gone (ended, revoked).
	Give int64

	// Seq and Out make a loan whose answer was lost safe: the holder's next loan of the
	// key settles it. Seq numbers the holder's loans in the order it sends them; a loan
	// numbered at or below its record's latest changes nothing (it arrived late). Out is
	// how many events the holder counts its record holding out before Give (what the
	// latest Lent.Out said, less what loans without an answer gave). The store also
	// gives back whatever the record holds beyond Out: the events a lost answer lent, or
	// a give-back that did not land. With Seq 0, neither applies.
	Seq int64
	Out int64

	// Receipt, when not nil on a loan to a holder, is written as a take's (see
	// Request.Receipt) when the loan lends: a refund naming it gives the events the
	// holder admitted from the loan back to the key, once the holder's record has ended.
	Receipt *Receipt

	// Want is how many events to borrow now: 0 only gives back, or renews the loan. The
	// store lends at most what the key has left, divided by Share or by the holders on
	// record with events out, whichever is more. When that is none, it lends one event:
	// a key's last few events go one to each holder that asks. In the last quarter of a
	// Windowed algorithm's window, it divides by Share alone: what the others leave there
	// would end with the window.
	Want  int64
	Share int64

	// TTL is how long the loan stays on record, and its events may be spent, from now:
	// every loan of a holder renews its record. For a Windowed algorithm the loan also
	// ends with the window it was lent in.
	TTL time.Duration

	// Revoke drops every record of the key, this holder's too, after its Give: their
	// events out are then counted as spent, and the other holders' next loans find their
	// records gone (Lent.Kept false), so that they drop what they hold. For a reset or a
	// refund of the key.
	Revoke bool

	// End drops the holder's record after its Give, and lends nothing: the events it
	// holds out, spent, are then forgotten. Set it on a holder's last loan, when every
	// earlier loan was answered: a loan still on its way would find no record, and lend
	// anew. It spares the loans of the key's other holders reading the ended record.
	End bool
}

// Lent is what a store answered a Loan.
type Lent struct {
	// Outcome is the key's after the loan, as a take of N would answer it: allowed when
	// anything was lent; when nothing was, its Wait is the time until one event could be.
	Outcome

	// N is how many events were lent (0 to Want).
	N int64

	// For is how long the holder may spend what it holds of this key, from the store's
	// now: until the record ends. 0 when it holds nothing on record.
	For time.Duration

	// Kept says whether the holder's earlier record was still there, so that its Give
	// went back to the key. When it was not (the loan ended, or was revoked), the holder
	// drops whatever it still holds of the key.
	Kept bool

	// Out is how many events the holder's record holds out after the loan: lent and not
	// given back, spent or not. 0 when it has none on record.
	Out int64
}
