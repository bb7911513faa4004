package fixedwindow

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// firstInstant is the first instant whose date, on the wall clock of loc, is date or
// later (date is that wall date's midnight as if in UTC). It is the date's midnight
// where the clock shows one; where a zone skips midnight (Santiago's clocks go from
// 23:59:59 to 01:00 on the first Sunday of September) it is the instant the date begins
// with, the skip; and a date the calendar skips whole (Pacific/Apia's 30 December 2011)
// begins where the next one does.
func firstInstant(date time.Time, loc *time.Location) time.Time {
	t := date.Add(-50 * time.Hour) // before date's midnight in every zone: offsets are within 26 hours
	for {
		lt := t.In(loc)
		_, offset := lt.Zone()
		wall := time.Duration(offset) * time.Second
		if !t.Add(wall).Before(date) {
			return t // the zone's new offset starts on date or later: a skipped midnight
		}
		midnight := date.Add(-wall) // the date's midnight at this offset
		if _, end := lt.ZoneBounds(); end.IsZero() || midnight.Before(end) {
			return midnight
		}
		_, t = lt.ZoneBounds() // the offset changes before that midnight: on to the next
	}
}

// window is the calendar window of per in loc that holds t, and the one after it: each
// from the first instant of its first date (see firstInstant), and never empty: a window
// whose dates the calendar skips whole is no window.
func window(per Calendar, loc *time.Location, t time.Time) core.Window {
	y, m, d := t.In(loc).Date()
	first := time.Date(y, m, d, 0, 0, 0, 0, time.UTC) // the first date of t's window
	switch per {
	case Week:
		first = first.AddDate(0, 0, -(int(first.Weekday())+6)%7) // back to Monday
	case Month:
		first = first.AddDate(0, 0, 1-d)
	case Year:
		first = time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	after := func(date time.Time, k int) time.Time { // the first date k windows after date
		switch per {
		case Week:
			return date.AddDate(0, 0, 7*k)
		case Month:
			return date.AddDate(0, k, 0)
		case Year:
			return date.AddDate(k, 0, 0)
		}
		return date.AddDate(0, 0, k)
	}
	// the window that starts last at or before t: where a zone's clock goes back across
	// midnight, t's date may be the one before the window t is in
	start := firstInstant(first, loc)
	end := firstInstant(after(first, 1), loc)
	for k := 2; !t.Before(end) || !end.After(start); k++ {
		start, end = end, firstInstant(after(first, k), loc)
	}
	next := end
	for k := 1; !next.After(end); k++ {
		next = firstInstant(after(first, k), loc)
	}
	return core.Window{Start: start.UnixMicro(), End: end.UnixMicro(), Next: next.UnixMicro()}
}

// errLocal is why a quota refuses time.Local: it names the zone of each host it runs on,
// and instances whose hosts differ would count in different windows under one name.
var errLocal = errors.New("time.Local names a different zone on each host: name the zone (time.LoadLocation)")

// zoneName is loc's name in a quota's text and keys: its IANA name; for a zone of one
// fixed offset, that offset as "UTC+01:00" ("UTC" for none) unless its name loads as the
// same fixed offset; so that two zones of one name and different offsets never share a
// window, and the text reads back as the same zone. A zone of another kind whose name
// does not load (a time.LoadLocationFromTZData of its own) is refused.
func zoneName(loc *time.Location) (string, error) {
	if loc == time.Local {
		return "", errLocal
	}
	name := loc.String()
	ref := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).In(loc)
	if start, end := ref.ZoneBounds(); start.IsZero() && end.IsZero() { // one offset, for ever
		_, offset := ref.Zone()
		if l, err := time.LoadLocation(name); err == nil && name != "Local" {
			lr := ref.In(l)
			if s, e := lr.ZoneBounds(); s.IsZero() && e.IsZero() {
				if _, o := lr.Zone(); o == offset {
					return name, nil
				}
			}
		}
		return offsetName(offset), nil
	}
	if l, err := time.LoadLocation(name); err != nil || name == "Local" || l.String() != name {
		return "", fmt.Errorf("the time zone %q is not one time.LoadLocation knows by that name", name)
	}
	return name, nil
}

// offsetName is a fixed offset of seconds east of UTC as "UTC+hh:mm" (or with seconds,
// "UTC+hh:mm:ss", when it has some), "UTC" for none.
func offsetName(offset int) string {
	if offset == 0 {
		return "UTC"
	}
	sign := "+"
	if offset < 0 {
		sign, offset = "-", -offset
	}
	s := fmt.Sprintf("UTC%s%02d:%02d", sign, offset/3600, offset/60%60)
	if offset%60 != 0 {
		s += fmt.Sprintf(":%02d", offset%60)
	}
	return s
}

// loadZone is the zone a quota's text names: an IANA name, or a fixed offset as
// offsetName writes it.
func loadZone(name string) (*time.Location, error) {
	if rest, ok := strings.CutPrefix(name, "UTC"); ok && rest != "" {
		if offset, ok := parseOffset(rest); ok {
			return time.FixedZone(offsetName(offset), offset), nil
		}
	}
	if name == "Local" {
		return nil, errLocal
	}
	return time.LoadLocation(name)
}

// parseOffset reads "+hh:mm" or "-hh:mm[:ss]", within a day.
func parseOffset(s string) (int, bool) {
	if len(s) < 2 || (s[0] != '+' && s[0] != '-') {
		return 0, false
	}
	parts := strings.Split(s[1:], ":")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, false
	}
	offset := 0
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || len(p) != 2 || v < 0 || (i > 0 && v > 59) || (i == 0 && v > 23) {
			return 0, false
		}
		offset = offset*60 + v
	}
	if len(parts) == 2 {
		offset *= 60
	}
	if s[0] == '-' {
		offset = -offset
	}
	return offset, offset != 0
}
