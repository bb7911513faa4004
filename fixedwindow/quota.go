package fixedwindow

import (
	_ "embed"

	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Calendar is the length of a quota's windows as a time zone's calendar counts them.
type Calendar uint8

// The calendar windows:
//   - Day: from midnight to midnight. It lasts 23 or 25 hours on the days summer time
//     starts or ends.
//   - Week: an ISO week, from Monday 00:00.
//   - Month: from the 1st at 00:00, 28 to 31 days.
//   - Year: from January 1st.
const (
	Day Calendar = iota + 1
	Week
	Month
	Year
)

var calendarNames = []string{Day: "day", Week: "week", Month: "month", Year: "year"}

// String is "day", "week", "month" or "year".
func (c Calendar) String() string {
	if c >= Day && c <= Year {
		return calendarNames[c]
	}
	return "calendar(" + strconv.Itoa(int(c)) + ")"
}

// Quota is at most Limit events per calendar window of a time zone. An API plan's
// "10,000 calls a month" is one. The month is the customer's, from the 1st at 00:00 in
// their zone. Its zero value is invalid: Limit and Per are required.
//
// A quota is only as durable as its store. localstore forgets it when the process
// exits. On Redis, a month's count lives in Redis's memory. A Redis without persistence
// that restarts starts every key's month afresh. It then admits up to a whole quota
// again. Keep a quota's Redis with its writes on disk, in one of these ways:
//   - appendonly yes with appendfsync everysec, with a second of counts at risk.
//   - appendonly yes with appendfsync always.
//   - RDB snapshots, such as save 60 1000, with up to the snapshot's age at risk.
//
// Replication is asynchronous. A replica promoted after a failover may lack the
// master's last writes, and those counts are lost with them.
type Quota struct {
	Limit int64
	Per   Calendar
	// In is the time zone of the calendar. Nil means UTC. Quotas tell zones apart by
	// their IANA name (time.LoadLocation's). They tell zones of one fixed offset
	// (time.FixedZone) apart by that offset, named "UTC+01:00". A quota refuses
	// time.Local, since it names a different zone on each host.
	In *time.Location
}

func (q Quota) location() *time.Location {
	if q.In == nil {
		return time.UTC
	}
	return q.In
}

// String is the quota as text, in the form UnmarshalText reads:
// "10000 per month in America/New_York". A nil In is "in UTC".
func (q Quota) String() string {
	zone, err := zoneName(q.location())
	if err != nil {
		zone = q.location().String()
	}
	return strconv.FormatInt(q.Limit, 10) + " per " + q.Per.String() + " in " + zone
}

// MarshalText is String's form (encoding.TextMarshaler).
func (q Quota) MarshalText() ([]byte, error) {
	if err := q.validate(); err != nil {
		return nil, err
	}
	return []byte(q.String()), nil
}

// UnmarshalText reads "<limit> per <day|week|month|year>", optionally followed by
// " in <zone>". The zone is a name of the IANA time zone database, as time.LoadLocation
// reads it: "Europe/Madrid" or "UTC", say. It may also be a fixed offset as String
// writes it, such as "UTC+01:00". "Local" is refused. Without a zone, the zone is UTC.
//
// Bad text is an error wrapping ratelimit.ErrInvalidRule that names the wrong part.
// It leaves q as it was.
func (q *Quota) UnmarshalText(text []byte) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("fixedwindow: quota %q: %w: %s", text, ratelimit.ErrInvalidRule, fmt.Sprintf(format, args...))
	}
	fields := strings.Fields(string(text))
	if len(fields) != 3 && len(fields) != 5 {
		return bad(`want "<limit> per <day|week|month|year> [in <zone>]"`)
	}
	limit, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return bad("the limit %q is not a whole number", fields[0])
	}
	if fields[1] != "per" {
		return bad(`"per" must follow the limit`)
	}
	var per Calendar
	for c := Day; c <= Year; c++ {
		if fields[2] == c.String() {
			per = c
		}
	}
	if per == 0 {
		return bad("%q is not day, week, month or year", fields[2])
	}
	loc := time.UTC
	if len(fields) == 5 {
		if fields[3] != "in" {
			return bad(`"in" must come before the zone`)
		}
		if loc, err = loadZone(fields[4]); err != nil {
			return bad("no time zone %q: %v", fields[4], err)
		}
	}
	got := Quota{Limit: limit, Per: per, In: loc}
	if err := got.validate(); err != nil {
		return err
	}
	*q = got
	return nil
}

func (q Quota) validate() error {
	if q.Per < Day || q.Per > Year {
		return fmt.Errorf("fixedwindow: %w: a quota per %v: want Day, Week, Month or Year", ratelimit.ErrInvalidRule, q.Per)
	}
	if _, err := zoneName(q.location()); err != nil {
		return fmt.Errorf("fixedwindow: %w: a quota in %v: %v", ratelimit.ErrInvalidRule, q.location(), err)
	}
	return core.CheckRule(core.Rule(q.Rule()))
}

// Rule is the quota as a Rule, for what reads one, such as the middleware's
// RateLimit-Policy header. Its Limit is the quota's. Its Period is the usual length of a
// window: 24 hours, 7 days, 30 days or 365 days. The header gives that as the window.
// Decisions follow the calendar, not this Period.
func (q Quota) Rule() ratelimit.Rule {
	periods := []time.Duration{Day: 24 * time.Hour, Week: 7 * 24 * time.Hour, Month: 30 * 24 * time.Hour, Year: 365 * 24 * time.Hour}
	if q.Per < Day || q.Per > Year {
		return ratelimit.Rule{Limit: q.Limit}
	}
	return ratelimit.Rule{Limit: q.Limit, Period: periods[q.Per]}
}

// Window is the window that holds t and the next, in microseconds since the Unix epoch.
func (q Quota) Window(t time.Time) core.Window {
	if q.Per < Day || q.Per > Year {
		return core.Window{}
	}
	return window(q.Per, q.location(), t)
}

// Algorithm is the quota's algorithm as stores see it, named "quota". There is one per
// calendar and time zone. It places each decision's window.
func (q Quota) Algorithm() (*core.Algorithm, error) {
	if err := q.validate(); err != nil {
		return nil, err
	}
	zone, _ := zoneName(q.location()) // validated
	key := quotaKey{q.Per, zone}
	if alg, ok := quotaAlgorithms.Load(key); ok {
		return alg.(*core.Algorithm), nil
	}
	cal := Quota{Per: q.Per, In: q.location()}
	window := func(now int64) core.Window { return cal.Window(time.UnixMicro(now)) }
	alg := &core.Algorithm{
		Name:       "quota",
		Script:     quotaScript,
		ScriptKeys: []string{"state"},
		Prepare:    prepareQuota,
		Step: func(st *core.State, now int64, a core.Args) core.Outcome {
			return quotaStep(st, now, a, window(now))
		},
		Refund: func(st *core.State, now int64, a core.Args) int64 {
			return refundQuota(st, now, a, window(now))
		},
		Debit: func(st *core.State, now int64, a core.Args) int64 {
			return debitQuota(st, now, a, window(now))
		},
		Void: func(st *core.State, now int64, a core.Args) int64 {
			return voidQuota(st, now, a, window(now))
		},
		Window:   window,
		Lendable: true,
		Windowed: true,
	}
	got, _ := quotaAlgorithms.LoadOrStore(key, alg)
	return got.(*core.Algorithm), nil
}

// quotaAlgorithms holds one Algorithm per calendar and zone, so that every limiter of a
// quota shares its keys in every store: a few per program.
var quotaAlgorithms sync.Map // quotaKey -> *core.Algorithm

type quotaKey struct {
	per  Calendar
	zone string
}

//go:embed quota.lua
var quotaScript string

// quotaEnd is the end of the window that holds t (see core.Window), or 0 for a
// window that is none.
func quotaEnd(w core.Window, t int64) int64 {
	switch {
	case !(w.Start < w.End && w.End < w.Next):
		return 0
	case t < w.Start:
		return w.Start
	case t < w.End:
		return w.End
	case t < w.Next:
		return w.Next
	}
	span := w.Next - w.End
	return w.Next + ((t-w.Next)/span+1)*span
}

// advanceQuota brings st to now, or to the latest instant it has seen while it counts
// events, empties a count of another window, and returns the end of st's window in w
// (placed at now), or 0 when w is none.
func advanceQuota(st *core.State, now, period int64, w core.Window) (end int64) {
	rewound := st.Time-now > period // calendar windows are not periodic: back to now's
	if rewound {
		core.SetFloor(st, st.Time) // the count moves to now's window: the takes before are of another
		st.Time = now
	}
	t := now
	if st.Level > 0 || st.Time != 0 {
		t = max(st.Time, now)
	}
	if end = quotaEnd(w, t); end == 0 {
		return 0
	}
	if st.Level > 0 && st.Aux != end && !rewound { // a rewound key carries its count into now's window
		st.Level = 0
	}
	st.Time, st.Aux = t, end
	return end
}

// quotaStep is the fixed window's decision (count) over the calendar windows of w.
// Without a window (a calendar that makes none) it denies, changing nothing.
func quotaStep(st *core.State, now int64, a core.Args, w core.Window) core.Outcome {
	end := advanceQuota(st, now, a.Period, w)
	if end == 0 {
		return a.Outcome(false, 0, time.Second, 0)
	}
	return count(st, now, end, a)
}

// refundQuota takes n events off the count, down to 0, when the take at a.Taken was of
// the current window (and after the key's floor).
func refundQuota(st *core.State, now int64, a core.Args, w core.Window) int64 {
	end := advanceQuota(st, now, a.Period, w)
	if end == 0 || a.Taken <= core.Floor(st) || a.Taken > st.Time || quotaEnd(w, a.Taken) != end {
		return 0
	}
	gave := min(a.N, max(0, st.Level))
	st.Level -= gave
	return gave
}

// voidQuota leaves a reset key empty, with a floor at its latest instant until its
// window ends (see the fixed window's void); a floor of its window stays.
func voidQuota(st *core.State, now int64, a core.Args, w core.Window) int64 {
	end := advanceQuota(st, now, a.Period, w)
	if end == 0 {
		return 0
	}
	if st.Level == 0 && (core.Floor(st) == core.MinInstant || quotaEnd(w, core.Floor(st)) != end) {
		return 0
	}
	core.VoidCounts(st)
	if end := quotaEnd(w, st.Time); end > now {
		return end - now
	}
	return 0
}

// debitQuota counts n events in the current window whatever it holds (up to
// mathx.MaxExact), and returns the time until the window ends; without a window (a
// calendar that makes none) it counts nothing.
func debitQuota(st *core.State, now int64, a core.Args, w core.Window) int64 {
	end := advanceQuota(st, now, a.Period, w)
	if end == 0 {
		return 0
	}
	st.Level = min(st.Level+min(a.N, mathx.MaxExact), mathx.MaxExact)
	return end - now
}

// QuotaLimiter limits each key to a Quota: at most Limit events per calendar window of
// its zone. It works on any Store. It is safe for concurrent use.
//
// Allow, AllowN and the rest are ratelimit.AlgorithmLimiter's. RetryAfter and ResetAfter
// are the time until the next window starts in the zone. A key's state expires then.
//
// A QuotaLimiter joins AllowAll with the limiters of the rate algorithms: "10,000 a month
// and 10 a second", all or none. Behind a fallback.Store whose primary is down, each of
// N instances counts Limit/N a window, at least 1.
//
// On Redis, the store's clock places the bounds of the windows. The server's clock then
// decides which window a decision falls in. A few minutes of disagreement across a
// window's start decide as the server says. Clocks more than a window apart would count
// in windows as long as the next, from its end.
type QuotaLimiter struct {
	ratelimit.AlgorithmLimiter
	quota Quota
}

// NewQuota returns a QuotaLimiter of q over store. It returns an error wrapping
// ratelimit.ErrInvalidRule for an invalid quota, and an error for a nil store.
//
// Its keys are in the namespace q.String(), such as "10000 per month in
// America/New_York". ratelimit.WithNamespace may name another. Quotas of different
// calendars or zones must not share a namespace.
func NewQuota(store ratelimit.Store, q Quota, opts ...ratelimit.Option) (*QuotaLimiter, error) {
	alg, err := q.Algorithm()
	if err != nil {
		return nil, err
	}
	if q.In == nil {
		q.In = time.UTC
	}
	opts = append([]ratelimit.Option{ratelimit.WithNamespace(q.String())}, opts...)
	l, err := ratelimit.NewAlgorithmLimiter(store, alg, q.Rule(), opts...)
	if err != nil {
		return nil, err
	}
	return &QuotaLimiter{AlgorithmLimiter: *l, quota: q}, nil
}

// Quota is the limiter's quota.
func (l *QuotaLimiter) Quota() Quota { return l.quota }

// prepareQuota checks rule and n: at most Limit events counted per window.
func prepareQuota(rule core.Rule, n int64) (core.Args, error) {
	return core.CountArgs("quota", rule, n)
}
