package fixedwindow_test

import (
	"errors"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// FuzzQuotaText: any text either is refused with an error wrapping ErrInvalidRule,
// leaving the quota as it was, or reads as a quota whose String reads back the same.
func FuzzQuotaText(f *testing.F) {
	for _, s := range []string{"10000 per month in America/New_York", "3 per day", "1 per week in UTC",
		"5 per year in Europe/Madrid", "0 per day", "3 per fortnight", "3 per day in Nowhere/City", "3 per day in", "", "2 per day in UTC+01:00", "2 per day in UTC-03:30",
		"2 per day in UTC+24:00", "2 per day in Local"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := fixedwindow.Quota{Limit: 7, Per: fixedwindow.Week}
		if err := q.UnmarshalText([]byte(s)); err != nil {
			if !errors.Is(err, ratelimit.ErrInvalidRule) || q.Limit != 7 || q.Per != fixedwindow.Week || q.In != nil {
				t.Fatalf("%q: %v, and the quota became %+v", s, err, q)
			}
			return
		}
		text, err := q.MarshalText()
		if err != nil {
			t.Fatalf("%q read as %+v, which does not marshal: %v", s, q, err)
		}
		var back fixedwindow.Quota
		if err := back.UnmarshalText(text); err != nil || back.String() != q.String() {
			t.Fatalf("%q -> %q -> %+v, %v", s, text, back, err)
		}
	})
}

// The windows of each calendar, in a zone with summer time: each starts at 00:00 local
// and ends where the next starts.
func TestQuotaWindows(t *testing.T) {
	madrid, err := time.LoadLocation("Europe/Madrid")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2027, 3, 28, 12, 0, 0, 0, madrid) // a Sunday, 23 hours long
	for _, c := range []struct {
		per              fixedwindow.Calendar
		start, end, next time.Time
	}{
		{fixedwindow.Day, time.Date(2027, 3, 28, 0, 0, 0, 0, madrid), time.Date(2027, 3, 29, 0, 0, 0, 0, madrid), time.Date(2027, 3, 30, 0, 0, 0, 0, madrid)},
		{fixedwindow.Week, time.Date(2027, 3, 22, 0, 0, 0, 0, madrid), time.Date(2027, 3, 29, 0, 0, 0, 0, madrid), time.Date(2027, 4, 5, 0, 0, 0, 0, madrid)},
		{fixedwindow.Month, time.Date(2027, 3, 1, 0, 0, 0, 0, madrid), time.Date(2027, 4, 1, 0, 0, 0, 0, madrid), time.Date(2027, 5, 1, 0, 0, 0, 0, madrid)},
		{fixedwindow.Year, time.Date(2027, 1, 1, 0, 0, 0, 0, madrid), time.Date(2028, 1, 1, 0, 0, 0, 0, madrid), time.Date(2029, 1, 1, 0, 0, 0, 0, madrid)},
	} {
		w := fixedwindow.Quota{Limit: 1, Per: c.per, In: madrid}.Window(at)
		want := core.Window{Start: c.start.UnixMicro(), End: c.end.UnixMicro(), Next: c.next.UnixMicro()}
		if w != want {
			t.Errorf("%v: %+v; want %+v", c.per, w, want)
		}
	}
	if d := time.UnixMicro(fixedwindow.Quota{Limit: 1, Per: fixedwindow.Day, In: madrid}.Window(at).End).Sub(time.Date(2027, 3, 28, 0, 0, 0, 0, madrid)); d != 23*time.Hour {
		t.Errorf("March 28th in Madrid lasts %v; want 23h", d)
	}
}

// TestWindowsStartAtFirstInstants holds, for instants every 7h13m over fifteen years in
// zones that skip or repeat midnights (Santiago, Havana, Asuncion, Coyhaique, the Azores,
// Apia with its skipped day, Lord Howe's half-hour shifts, Kiritimati's skipped day) and
// for each calendar, what a window is: [Start, End) holds t, Next comes after End, and
// each bound is the first instant of its date on the zone's clock, a midnight or, where
// the clock skips midnight, the instant it skips from.
func TestWindowsStartAtFirstInstants(t *testing.T) {
	date := func(x time.Time, loc *time.Location) time.Time {
		y, m, d := x.In(loc).Date()
		return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	}
	for _, name := range []string{"America/Santiago", "America/Havana", "America/Asuncion", "America/Coyhaique",
		"Atlantic/Azores", "Pacific/Apia", "Australia/Lord_Howe", "Pacific/Kiritimati", "Europe/Madrid", "UTC"} {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		for per := fixedwindow.Day; per <= fixedwindow.Year; per++ {
			q := fixedwindow.Quota{Limit: 1, Per: per, In: loc}
			for at := time.Date(2010, 1, 1, 0, 0, 0, 0, time.UTC); at.Year() < 2025; at = at.Add(7*time.Hour + 13*time.Minute) {
				w := q.Window(at)
				start, end, next := time.UnixMicro(w.Start), time.UnixMicro(w.End), time.UnixMicro(w.Next)
				if !(!at.Before(start) && at.Before(end) && end.Before(next)) {
					t.Fatalf("%v in %s at %v: window [%v, %v, %v) does not hold it", per, name, at, start, end, next)
				}
				for _, b := range []time.Time{start, end, next} {
					if !date(b.Add(-time.Microsecond), loc).Before(date(b, loc)) {
						t.Fatalf("%v in %s at %v: a window bound %v is not the first instant of its date", per, name, at, b.In(loc))
					}
				}
			}
		}
	}
}

// TestQuotaZones: a quota's zone is told apart by name, or by offset for a fixed one,
// reads back from its text, and is never time.Local.
func TestQuotaZones(t *testing.T) {
	x1, x2 := time.FixedZone("X", 3600), time.FixedZone("X", -5*3600)
	q1, q2 := fixedwindow.Quota{Limit: 1, Per: fixedwindow.Day, In: x1}, fixedwindow.Quota{Limit: 1, Per: fixedwindow.Day, In: x2}
	if q1.String() != "1 per day in UTC+01:00" || q2.String() != "1 per day in UTC-05:00" {
		t.Errorf("fixed zones as text: %q, %q", q1.String(), q2.String())
	}
	a1, err1 := q1.Algorithm()
	a2, err2 := q2.Algorithm()
	if err1 != nil || err2 != nil || a1 == a2 {
		t.Errorf("two fixed zones named X, +1h and -5h, share an algorithm (%v, %v)", err1, err2)
	}
	// 03:00 UTC is the 2nd at +1 and still the 1st at -5
	at := time.Date(2027, 1, 2, 3, 0, 0, 0, time.UTC)
	if w1, w2 := q1.Window(at), q2.Window(at); w1.Start != time.Date(2027, 1, 1, 23, 0, 0, 0, time.UTC).UnixMicro() ||
		w2.Start != time.Date(2027, 1, 1, 5, 0, 0, 0, time.UTC).UnixMicro() {
		t.Errorf("the days of +1h and -5h: %v, %v", time.UnixMicro(w1.Start).UTC(), time.UnixMicro(w2.Start).UTC())
	}
	for _, q := range []fixedwindow.Quota{q1, q2, {Limit: 2, Per: fixedwindow.Week, In: time.FixedZone("UTC", 0)},
		{Limit: 2, Per: fixedwindow.Month, In: time.FixedZone("", 5*3600+30*60)}} {
		text, err := q.MarshalText()
		var back fixedwindow.Quota
		if err != nil || back.UnmarshalText(text) != nil || back.String() != q.String() || back.Window(at) != q.Window(at) {
			t.Errorf("%v: marshals to %q (%v), reads back as %v", q, text, err, back)
		}
	}
	local := fixedwindow.Quota{Limit: 1, Per: fixedwindow.Day, In: time.Local}
	if _, err := local.Algorithm(); !errors.Is(err, ratelimit.ErrInvalidRule) {
		t.Errorf("a quota in time.Local: %v; want ErrInvalidRule", err)
	}
	if _, err := local.MarshalText(); !errors.Is(err, ratelimit.ErrInvalidRule) {
		t.Errorf("a quota in time.Local marshals: %v", err)
	}
	var q fixedwindow.Quota
	if err := q.UnmarshalText([]byte("1 per day in Local")); !errors.Is(err, ratelimit.ErrInvalidRule) {
		t.Errorf(`"in Local": %v; want ErrInvalidRule`, err)
	}
}
