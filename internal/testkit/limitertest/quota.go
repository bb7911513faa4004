package limitertest

import (
	"context"
	"errors"
	"testing"
	"time"
	_ "time/tzdata" // the zones of the scenarios, on a machine without a zone database

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// testQuotas pins the calendar quotas' numbers: windows that start on the 1st or at
// midnight of their zone, as long as the calendar makes them.
func testQuotas(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	newQuota := func(t *testing.T, q fixedwindow.Quota, at time.Time) (*fixedwindow.QuotaLimiter, *clock.Fake) {
		t.Helper()
		clk := clock.NewFake(at)
		l, err := fixedwindow.NewQuota(newStore(t, clk), q)
		if err != nil {
			t.Fatal(err)
		}
		return l, clk
	}
	t.Run("3 a month in New York, across the month's end", func(t *testing.T) {
		ny := zone(t, "America/New_York")
		l, clk := newQuota(t, fixedwindow.Quota{Limit: 3, Per: fixedwindow.Month, In: ny}, time.Date(2027, 1, 31, 23, 59, 0, 0, ny))
		for i := range 3 {
			if d, err := l.Allow(ctx, "tenant"); err != nil || !d.Allowed || d.Remaining != int64(2-i) || d.ResetAfter != time.Minute {
				t.Fatalf("call %d at 23:59 on January 31st: %+v, %v", i, d, err)
			}
		}
		if d, err := l.Allow(ctx, "tenant"); err != nil || d != (ratelimit.Decision{Limit: 3, RetryAfter: time.Minute, ResetAfter: time.Minute}) {
			t.Errorf("the fourth call: %+v, %v; want denied, retry after 1m", d, err)
		}
		clk.Set(time.Date(2027, 2, 1, 0, 0, 0, 0, ny))
		if d, err := l.Allow(ctx, "tenant"); err != nil || d != (ratelimit.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: 28 * 24 * time.Hour}) {
			t.Errorf("at 00:00 on February 1st: %+v, %v; want allowed, 2 left until March 1st", d, err)
		}
	})
	t.Run("a charge before two resets gives nothing back", func(t *testing.T) {
		l, clk := newQuota(t, fixedwindow.Quota{Limit: 10, Per: fixedwindow.Day, In: time.UTC}, time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC))
		c, _, err := l.Charge(ctx, "tenant", 10)
		if err != nil || c == nil {
			t.Fatalf("Charge(10) = %v, %v", c, err)
		}
		for range 2 {
			clk.Advance(time.Second)
			if err := l.Reset(ctx, "tenant"); err != nil {
				t.Fatal(err)
			}
		}
		if d, _ := l.AllowN(ctx, "tenant", 10); !d.Allowed {
			t.Fatalf("AllowN(10) after the resets: %+v", d)
		}
		if _, err := c.Settle(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if d, _ := l.Allow(ctx, "tenant"); d.Allowed {
			t.Errorf("a charge before two resets, settled at 0, gave back what the resets forgave: %+v", d)
		}
	})
	t.Run("a day in Madrid, 23 and 25 hours long", func(t *testing.T) {
		madrid := zone(t, "Europe/Madrid")
		for _, c := range []struct {
			day  time.Time
			long time.Duration
		}{{time.Date(2027, 3, 28, 0, 0, 0, 0, madrid), 23 * time.Hour}, {time.Date(2027, 10, 31, 0, 0, 0, 0, madrid), 25 * time.Hour}} {
			l, _ := newQuota(t, fixedwindow.Quota{Limit: 10, Per: fixedwindow.Day, In: madrid}, c.day)
			if d, err := l.Allow(ctx, "tenant"); err != nil || !d.Allowed || d.ResetAfter != c.long {
				t.Errorf("at 00:00 on %s: %+v, %v; want ResetAfter %v", c.day.Format(time.DateOnly), d, err, c.long)
			}
		}
	})
	t.Run("a day whose midnight Santiago skips starts at its first instant", func(t *testing.T) {
		// Saturday 4 September 2027 ends at 23:59:59 -04; Sunday starts at 01:00 -03,
		// 04:00 UTC. A quota of 1 a day spent at 22:59 -04 is spent until then.
		santiago := zone(t, "America/Santiago")
		l, clk := newQuota(t, fixedwindow.Quota{Limit: 1, Per: fixedwindow.Day, In: santiago}, time.Date(2027, 9, 5, 2, 59, 0, 0, time.UTC))
		if d, err := l.Allow(ctx, "tenant"); err != nil || !d.Allowed || d.ResetAfter != time.Hour+time.Minute {
			t.Fatalf("at 22:59 -04: %+v, %v; want allowed, reset at 04:00 UTC", d, err)
		}
		clk.Set(time.Date(2027, 9, 5, 3, 0, 0, 0, time.UTC)) // 23:00 -04, still Saturday
		if d, err := l.Allow(ctx, "tenant"); err != nil || d != (ratelimit.Decision{Limit: 1, RetryAfter: time.Hour, ResetAfter: time.Hour}) {
			t.Errorf("at 23:00 -04: %+v, %v; want denied until Sunday's 01:00 -03, 1h", d, err)
		}
		clk.Set(time.Date(2027, 9, 5, 4, 0, 0, 0, time.UTC))
		if d, err := l.Allow(ctx, "tenant"); err != nil || !d.Allowed || d.ResetAfter != 23*time.Hour {
			t.Errorf("at 01:00 -03 on Sunday: %+v, %v; want allowed, a 23-hour day", d, err)
		}
	})
	t.Run("a day Apia's calendar skips is no window", func(t *testing.T) {
		// Samoa went from Thursday 29 December 2011, 23:59:59 -10, to Saturday 31
		// December, 00:00 +14, at 10:00 UTC: there was no 30 December
		apia := zone(t, "Pacific/Apia")
		l, clk := newQuota(t, fixedwindow.Quota{Limit: 1, Per: fixedwindow.Day, In: apia}, time.Date(2011, 12, 30, 9, 0, 0, 0, time.UTC))
		if d, err := l.Allow(ctx, "tenant"); err != nil || !d.Allowed || d.ResetAfter != time.Hour {
			t.Fatalf("at 23:00 on the 29th: %+v, %v; want allowed, reset at the 31st", d, err)
		}
		clk.Set(time.Date(2011, 12, 30, 10, 0, 0, 0, time.UTC))
		if d, err := l.Allow(ctx, "tenant"); err != nil || !d.Allowed || d.ResetAfter != 24*time.Hour {
			t.Errorf("at 00:00 on the 31st: %+v, %v; want allowed, a day of 24 hours", d, err)
		}
	})
	t.Run("a clock stepped a day ahead and back keeps the count, for today's window", func(t *testing.T) {
		day := time.Date(2027, 6, 10, 12, 0, 0, 0, time.UTC)
		l, clk := newQuota(t, fixedwindow.Quota{Limit: 2, Per: fixedwindow.Day}, day)
		clk.Set(day.Add(50 * time.Hour)) // two days ahead
		for range 2 {
			if d, err := l.Allow(ctx, "tenant"); err != nil || !d.Allowed {
				t.Fatalf("two days ahead: %+v, %v", d, err)
			}
		}
		clk.Set(day)
		if d, err := l.Allow(ctx, "tenant"); err != nil || d.Allowed || d.RetryAfter != 12*time.Hour {
			t.Errorf("back on the 10th at noon: %+v, %v; want denied until midnight, 12h, not for two days", d, err)
		}
	})
	t.Run("a month in UTC from the 15th at noon", func(t *testing.T) {
		l, _ := newQuota(t, fixedwindow.Quota{Limit: 10, Per: fixedwindow.Month}, time.Date(2027, 2, 15, 12, 0, 0, 0, time.UTC))
		if d, err := l.Allow(ctx, "tenant"); err != nil || d.ResetAfter != 13*24*time.Hour+12*time.Hour {
			t.Errorf("%+v, %v; want ResetAfter 13d12h", d, err)
		}
	})
	t.Run("an ISO week and a year", func(t *testing.T) {
		// Friday January 1st 2027, noon: the week began on Monday December 28th
		at := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
		week, _ := newQuota(t, fixedwindow.Quota{Limit: 5, Per: fixedwindow.Week}, at)
		if d, err := week.Allow(ctx, "tenant"); err != nil || d.ResetAfter != 2*24*time.Hour+12*time.Hour {
			t.Errorf("a week: %+v, %v; want ResetAfter 2d12h, at Monday 00:00", d, err)
		}
		year, _ := newQuota(t, fixedwindow.Quota{Limit: 5, Per: fixedwindow.Year}, time.Date(2027, 7, 1, 0, 0, 0, 0, time.UTC))
		if d, err := year.Allow(ctx, "tenant"); err != nil || d.ResetAfter != 184*24*time.Hour {
			t.Errorf("a year: %+v, %v; want ResetAfter 184 days", d, err)
		}
	})
	t.Run("with a rate, all or none", func(t *testing.T) {
		clk := clock.NewFake(time.Date(2027, 3, 31, 23, 59, 59, 0, time.UTC))
		store := newStore(t, clk)
		quota, err := fixedwindow.NewQuota(store, fixedwindow.Quota{Limit: 4, Per: fixedwindow.Month})
		if err != nil {
			t.Fatal(err)
		}
		rate, err := fixedwindow.New(store, ratelimit.PerSecond(2))
		if err != nil {
			t.Fatal(err)
		}
		parts := []ratelimit.Part{{Limiter: quota, Key: "tenant"}, {Limiter: rate, Key: "tenant"}}
		admitted := 0
		for range 3 { // the rate admits 2; the denied third takes nothing from the quota
			if d, err := ratelimit.AllowAll(ctx, 1, parts...); err != nil {
				t.Fatal(err)
			} else if d.Allowed {
				admitted++
			}
		}
		clk.Advance(time.Second) // April: a new month, and a new second
		for range 3 {
			if d, err := ratelimit.AllowAll(ctx, 1, parts...); err != nil {
				t.Fatal(err)
			} else if d.Allowed {
				admitted++
			}
		}
		d, err := quota.PeekN(ctx, "tenant", 1)
		if admitted != 4 || err != nil || d.Remaining != 1 {
			t.Errorf("admitted %d (want 4: 2 in March, 2 in April); April's quota then: %+v, %v (want 2 taken)", admitted, d, err)
		}
	})
	t.Run("bad quotas", func(t *testing.T) {
		store := newStore(t, clock.NewFake(Start))
		for _, q := range []fixedwindow.Quota{{}, {Limit: 1}, {Limit: 0, Per: fixedwindow.Day}, {Limit: 1, Per: 9}} {
			if _, err := fixedwindow.NewQuota(store, q); !errors.Is(err, ratelimit.ErrInvalidRule) {
				t.Errorf("NewQuota(%+v): %v; want ErrInvalidRule", q, err)
			}
		}
	})
}
