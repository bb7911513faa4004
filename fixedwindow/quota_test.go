package fixedwindow_test

import (
	"errors"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
)

// FuzzQuotaText: any text either is refused with an error wrapping ErrInvalidRule,
// leaving the quota as it was, or reads as a quota whose String reads back the same.
func FuzzQuotaText(f *testing.F) {
	for _, s := range []string{"10000 per month in America/New_York", "3 per day", "1 per week in UTC",
		"5 per year in Europe/Madrid", "0 per day", "3 per fortnight", "3 per day in Nowhere/City", "3 per day in", ""} {
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
		want := ratelimit.Window{Start: c.start.UnixMicro(), End: c.end.UnixMicro(), Next: c.next.UnixMicro()}
		if w != want {
			t.Errorf("%v: %+v; want %+v", c.per, w, want)
		}
	}
	if d := time.UnixMicro(fixedwindow.Quota{Limit: 1, Per: fixedwindow.Day, In: madrid}.Window(at).End).Sub(time.Date(2027, 3, 28, 0, 0, 0, 0, madrid)); d != 23*time.Hour {
		t.Errorf("March 28th in Madrid lasts %v; want 23h", d)
	}
}
