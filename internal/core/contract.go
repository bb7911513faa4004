package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/eventlog"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Outcome is a store's answer to one Request, as an Algorithm's Step gives it
// (Args.Outcome makes one): the Decision, with its two waits in one. The zero Outcome
// is a denial under a Limit of 0.
type Outcome struct {
	Remaining int64 // Decision.Remaining
	// Wait is Decision.Delay when allowed, and Decision.RetryAfter when denied.
	Wait  time.Duration
	Reset time.Duration // Decision.ResetAfter
	// Limit when denied, ^Limit when allowed: one field, so that an Outcome is four
	// words, returned in registers (a fifth would copy it through memory at every return)
	limit int64
}

// Outcome is an Outcome under a's Limit: allowed or not, remaining, the wait (the delay of
// an admission, the retry of a denial) and the time until the key is back to full. A
// decorator store that decides under a part of the request's rule (a share of it) gives
// that part's Limit.
func (a Args) Outcome(allowed bool, remaining int64, wait, reset time.Duration) Outcome {
	var flip int64 // -1 when allowed: limit holds ^Limit
	if allowed {
		flip = -1
	}
	return Outcome{Remaining: remaining, Wait: wait, Reset: reset, limit: a.Limit ^ flip}
}

// Split is o as a ratelimit.Decision's fields: its wait is the delay of an admission or
// the retry of a denial, and the other is 0.
func (o Outcome) Split() (allowed bool, limit, remaining int64, delay, retry, reset time.Duration) {
	if o.Allowed() {
		return true, o.Limit(), o.Remaining, o.Wait, 0, o.Reset
	}
	return false, o.Limit(), o.Remaining, 0, o.Wait, o.Reset
}

// Allowed says whether the request was admitted.
func (o Outcome) Allowed() bool { return o.limit < 0 }

// Limit is the Limit (Args.Limit) of the rule the key was decided under: the request's
// (a fallback instance deciding on its share reports the rule's), or a region's part of
// it.
func (o Outcome) Limit() int64 { return o.limit ^ o.limit>>63 }

// BatchStore is a Store that decides several takes at once, all or none: either every
// request is allowed and counted, or none is counted. ApplyAll returns each request's
// Outcome, in order, as it would be alone (when any is denied, none was counted).
// AllowAll hands it only takes of distinct keys. A store that cannot decide a particular
// batch atomically (keys on different Redis Cluster nodes, say) returns an error matching
// errors.ErrUnsupported, having counted nothing, and AllowAll takes the requests one by
// one instead. localstore, redisstore and fallback are BatchStores.
type BatchStore interface {
	Store
	ApplyAll(ctx context.Context, reqs []Request) ([]Outcome, error)
}

// Request is one decision asked of a Store: N events of Key, decided as its Spec says.
// What a limiter's requests share is behind the Spec, made once.
type Request struct {
	// Key is any string, the empty one included; two different strings never share state.
	Key string
	// N is the events to admit (or to refund), all or none.
	N int64
	// Spec is what the request does, and under which limit. Never nil, and never changed
	// once a request has carried it: stores may remember what they derive from it.
	Spec *Spec
	// Receipt, on a take, asks the store that decides it to write how it did (see
	// Receipt), so that it can be refunded later. A refund of a rate algorithm's events
	// carries the Receipt of the take that took them. It gives back no more than the key
	// would still hold of them. An in-flight limit's refund names its lease instead. A
	// debit with a Receipt not yet written is a take of N whatever the key has left, and
	// writes it as a take does (events admitted before they were counted); one with a
	// Receipt written settles that take (Spec.Retry). Nil for the others.
	Receipt *Receipt
}

// Spec is what a request does to its key, and under which limit: the part of a Request
// that a limiter makes once and shares among its requests.
type Spec struct {
	// Algorithm decides; Namespace keeps the keys of one limiter apart from another's on
	// the same store (see WithNamespace), and is any string.
	Algorithm *Algorithm
	Namespace string
	Rule      Rule
	// Op is what the request does to the key: a take (the zero Op), a peek, a refund, a
	// reset, an extension or a debit (see the constants). The Outcome of a refund, a reset
	// or an extension is a peek of 1 after it (an extension's Allowed aside). A debit's is
	// a peek of 1 at the request's Reserve. A store refuses any other Op with an error.
	Op Op
	// Lease names the lease a request of an in-flight limit takes, refunds (releases) or
	// extends; 0 for the rate algorithms. Stores copy it into Args.Lease, and into the
	// script's arguments.
	Lease int64
	// Retry marks a refund or a debit that settles a take again (Charge.Settle called
	// after a store's error): its first attempt may have landed. A store whose calls can
	// fail after they were applied (redisstore) applies it only if it finds no sign of the
	// first; others apply it as any.
	Retry bool
	// Reserve is the part of the key's allowance, in percent (0 to 99), that a take or a
	// peek must leave for more important requests (see WithReserves). A take is admitted
	// only if the key could admit N more than that part of Decision.Limit (rounded down),
	// and takes N. A request of more than Limit less that part is never admitted: a
	// limiter refuses it with ErrInvalidN. A debit takes N whatever the part, and its Outcome is
	// a peek at it; a refund, a reset or an extension ignores it.
	Reserve int64
}

// Receipt is the record of one take, written by the stores that decide it, for the
// refund of its events later (Request.Receipt). A refund never creates allowance: it gives
// back only what the key would still hold had the take been smaller from the start.
// Each algorithm's package says what that is. A window gives back the events of its
// current window, a sliding log its events still in the log. A bucket gives back no
// more than the least it has lacked of full since the take. Nothing comes back for a
// take before a reset of the key, or before a clock stepped back by more than a period. A Receipt is not safe for
// concurrent use; a store writes it before its Apply returns.
type Receipt struct {
	// At is the instant the store decided the take at, in microseconds since the Unix
	// epoch, on its clock (localstore's clock, Redis's TIME); 0 until it is decided.
	At int64
	// Via and Next are a decorator store's (fallback, hotkey's Shard and Leases): which
	// way it sent the take (the primary or the secondary, a shard, a lease), and the
	// Receipt its next store wrote, for the refund to go the same way.
	Via  int64
	Next *Receipt
}

// Args validates r and derives the integers its decision needs, as every store does
// before it touches any state: its Algorithm's Prepare of its Rule and N, then its
// Lease, and for a take or a peek the part of Limit its Reserve keeps back (Args.Keep).
// The error wraps ErrInvalidRule (a rule the algorithm cannot enforce, a reserve outside
// 0 to 99) or ErrInvalidN.
func (r Request) Args() (Args, error) {
	sp := r.Spec
	if sp == nil || sp.Algorithm == nil || sp.Algorithm.Prepare == nil {
		return Args{}, errors.New("ratelimit: a request without an algorithm")
	}
	n := r.N
	if sp.Op == OpDebit { // any cost, however far past the rule's Limit
		if n < 1 || n > mathx.MaxExact {
			return Args{}, fmt.Errorf("%s: a debit of %d: %w: want 1 to %d", sp.Algorithm.Name, n, ErrInvalidN, int64(mathx.MaxExact))
		}
		n = 1
	}
	a, err := sp.Algorithm.Prepare(sp.Rule, n)
	if err != nil {
		return Args{}, err
	}
	a.N = r.N
	if sp.Reserve < 0 || sp.Reserve > 99 {
		return Args{}, fmt.Errorf("%s: a reserve of %d%%: %w: want 0 to 99", sp.Algorithm.Name, sp.Reserve, ErrInvalidRule)
	}
	a.Lease = sp.Lease
	if sp.Reserve != 0 && (sp.Op == OpTake || sp.Op == OpPeek || sp.Op == OpDebit) {
		a.Keep = mathx.Keep(a.Limit, sp.Reserve)
	}
	if a.Taken, err = r.taken(); err != nil {
		return Args{}, err
	}
	return a, nil
}

// taken is Args.Taken of r, or the error of a refund without the receipt of its take.
func (r Request) taken() (int64, error) {
	sp := r.Spec
	switch {
	case sp.Op == OpTake && r.Receipt != nil:
		return TakenNow, nil
	case sp.Op == OpRefund && sp.Algorithm.Extend == nil: // a rate algorithm's: of the take it names
		if r.Receipt == nil || r.Receipt.At <= 0 {
			return 0, fmt.Errorf("%s: a refund without the Receipt of its take: %w: what it gives back must be known to have been taken", sp.Algorithm.Name, ErrInvalidN)
		}
		return r.Receipt.At, nil
	case sp.Op == OpDebit && r.Receipt != nil && r.Receipt.At > 0: // a take's settlement: names the take
		return r.Receipt.At, nil
	case sp.Op == OpDebit && r.Receipt != nil: // a take whatever the key has, that may be refunded
		return -1, nil
	}
	return 0, nil
}

// Op is what a Request does to its key (Spec.Op).
type Op uint8

const (
	// OpTake takes N events, all or none (AllowN).
	OpTake Op = iota
	// OpPeek gives the Outcome a take would give, changing nothing.
	OpPeek
	// OpRefund gives back N events taken before, never above the key's full allowance.
	OpRefund
	// OpReset forgets the key: its next decision sees it full.
	OpReset
	// OpExtend renews Lease for another Period from now, for an algorithm of leases
	// (Algorithm.Extend). Its Allowed says whether the lease was still held. Stores
	// refuse it for the others.
	OpExtend
	// OpDebit takes N events whatever the key has left, even past zero: a cost known
	// after the answer. N may exceed the rule's Limit. A key in debt denies until it is
	// repaid. Stores refuse it for an algorithm without Algorithm.Debit.
	OpDebit
)

var opNames = [...]string{OpTake: "take", OpPeek: "peek", OpRefund: "refund", OpReset: "reset", OpExtend: "extend", OpDebit: "debit"}

// String is op's name: "take", "peek", "refund", "reset", "extend" or "debit".
func (op Op) String() string {
	if int(op) < len(opNames) {
		return opNames[op]
	}
	return fmt.Sprintf("Op(%d)", uint8(op))
}

// Window is a calendar window and the next one, as a clock places them (Algorithm.Window):
// [Start, End) and [End, Next), in microseconds since the Unix epoch.
// A windowed algorithm counts in the window the deciding clock falls in, which may be a
// Redis server's a little ahead of or behind the store's: a time before Start falls in
// the window that ends at Start, one from Next on in windows as long as [End, Next).
type Window struct {
	Start, End, Next int64
}

// Algorithm is one rate-limiting algorithm as stores see it: the integers it needs from a
// rule, its decision step in Go, and the same step as a Lua script. Stores keep one state
// per (Algorithm, Namespace, Key), so limiters of different algorithms can share a store
// and keys.
//
// The five algorithms of this module each export theirs from their package;
// concurrency.Algorithm is the in-flight limit's.
type Algorithm struct {
	// Name is short and stable ("tokenbucket"); stores may use it in their keys.
	Name string

	// Script is the step in Lua, for redisstore, which composes it into its scripts. It
	// reads the request's arguments by name, as the fields of Args and Window (n, limit,
	// period, unit, rate, now, op, lease, keep, the window's bounds). It sets the
	// Outcome's allowed (0 or 1), remaining, retry, reset and delay (microseconds), and
	// writes its keys. Where its first key is named "state", the store reads that key's
	// T, L and A for it (State's Time, Level and Aux), and the step saves them.
	// The scripts of this module's algorithms are the examples to follow (internal/script
	// holds what surrounds them). Empty for an algorithm that runs in Go alone.
	Script string

	// ScriptKeys names the keys the Script uses for one limiter key, in the order of KEYS.
	// A store maps each (name, limiter key) to one of its own keys, all in one hash slot.
	ScriptKeys []string

	// Prepare validates rule and n and derives the integers one decision needs. Its
	// errors wrap ErrInvalidRule or ErrInvalidN.
	Prepare func(rule Rule, n int64) (Args, error)

	// Step decides one request against st at now (microseconds since the Unix epoch) and
	// updates st. It is a pure function of its inputs, and the Script computes the same.
	// Args must come from Prepare, and the Outcome from a.Outcome. A peek is Step on a
	// copy of the state; a reset is the zero State.
	Step func(st *State, now int64, a Args) Outcome

	// Refund gives back to st at now the a.N events of the take made at a.Taken (its
	// Receipt's instant), as far as st would still hold them (see Receipt), never above
	// its full allowance, and returns how many it gave back (whole events, rounded down).
	// For an algorithm of leases, it releases the lease a.Lease (1 if it was held).
	Refund func(st *State, now int64, a Args) (gave int64)

	// Void, when set, leaves st as a reset of the key at now leaves it: as a key never
	// seen, but for what makes the receipts of its takes before now give back nothing. It
	// returns how long (microseconds) that must be kept. It returns 0 when st held nothing
	// a receipt could name (a full bucket, an empty window), and the store forgets the
	// key. Without Void, a reset leaves the zero State.
	Void func(st *State, now int64, a Args) (keep int64)

	// Debit takes a.N events from st at now, whatever it has left, and returns the time
	// until st is back to full (microseconds). The algorithms that take debts set it: the
	// token bucket, the fixed window, the sliding window counter and the calendar quotas.
	// A key taken below what it allows denies until it has earned the events back. A
	// window counts past its Limit until it ends; a sliding window counter's debt lasts
	// two windows at most. The Script
	// does the same for OpDebit. Stores refuse a debit for an algorithm without it.
	Debit func(st *State, now int64, a Args) (reset int64)

	// Extend is set only by an algorithm of leases (the in-flight limit of
	// InFlightLimiter), whose state is a set of leases, each expiring by itself: it renews
	// the lease a.Lease so that it expires no sooner than a.Period after now, and reports
	// whether st held it. Stores refuse OpExtend for an algorithm without it, and the
	// decorators that cache or split a key's decisions pass leases straight through.
	Extend func(st *State, now int64, a Args) bool

	// Window, set only by an algorithm that counts in calendar windows (fixedwindow's
	// quotas), is the window around now (microseconds since the Unix epoch) and the one
	// after it, in the algorithm's time zone. Step places its window itself; a store that
	// runs the Script sends it the window at the store's own time, and the script
	// decides by the server's time among those bounds.
	Window func(now int64) Window

	// Lendable says that events may be taken ahead and admitted later one by one, from
	// memory (Lender, hotkey.Leases): a Decision carries no Delay that paces each request,
	// and the algorithm promises no more than a count per period, which events counted a
	// moment early still keep. True for the token bucket, the fixed window, the sliding
	// window counter and the calendar quotas; false for the leaky bucket (each request has
	// its own Delay), the sliding log (which records each event at its own instant) and
	// the in-flight limit.
	Lendable bool

	// Windowed says that events count in the window they fall in (Period-aligned, or the
	// calendar window of Window), so that events lent must be spent within the window
	// they were lent in, and can be given back only within it.
	Windowed bool
}

// Args are the integers one decision needs, as Algorithm.Prepare derives them from a Rule
// and n. Stores hand them unchanged to Step, or to the script, so both compute the same.
type Args struct {
	N      int64 // events asked for
	Limit  int64 // Decision.Limit: the most ever allowed at once
	Period int64 // Rule.Period in microseconds
	Unit   int64 // algorithm-defined (the size of one event in Level's units, or a tick)
	Rate   int64 // algorithm-defined (Level's units gained or drained per microsecond)
	Lease  int64 // Request.Lease, copied by the store after Prepare

	// Keep is what a take or a peek must leave of Limit for more important requests:
	// Request.Reserve percent of Limit, rounded down, set by the store after Prepare (0
	// for a refund, a reset or an extension). Every Step admits N only if N more than Keep
	// could be admitted, and reports Remaining above it.
	Keep int64

	// Taken is the receipt of a rate algorithm's request, set by the store after Prepare.
	// For a refund, it is the instant of the take it gives back (Receipt.At). For a debit
	// that settles a take, it is that take's instant, which names the settlement. It is
	// -1 for a take that carries a Receipt, or a debit whose Receipt is not yet written:
	// the algorithm keeps what a refund of it needs, and the store writes the Receipt
	// (State.Time after the step). Else it is 0.
	Taken int64
}

// State is one key's state as a Store keeps it for Step. The zero State is a key never
// seen, and a state whose last Decision had ResetAfter 0 is worth no more than the zero
// State, so a store may drop it; but what a reset leaves (Algorithm.Void) is kept as long
// as Void says, or later refunds could give back what the reset forgave. The meaning of the fields is the algorithm's; a store
// copies a State whole and never looks into Log. A store that keeps states outside the
// process (a database, a cache server) saves them with MarshalBinary and loads them with
// UnmarshalBinary.
type State struct {
	Time  int64         // the latest instant the key has seen, in microseconds since the Unix epoch
	Level int64         // tokens, queued work, or events counted, in the algorithm's units
	Aux   int64         // a second number: the unit of Level, or the previous window's count
	Log   *eventlog.Log // the events of a sliding log, the leases of an in-flight limit; else nil
}
