package main

import (
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/examples/llmlimit"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
)

// BenchmarkFourInstances runs TestFourInstancesOnRedis's fleet for two real minutes, on
// the exact path (each decision a round trip to Redis) and with leases, side by side on
// one Redis: one API key asked twice its 120,000 tokens a minute ("t"), twice its 600
// requests a minute ("r"), and 1,000 tokens a second against 90,000 a day ("d"), open
// loop, half streamed, 50/25/15/10% over the instances, each request estimated at three
// times what it uses. It reports, for each minute, the tokens charged against the
// minute's budget (no request uses more than its estimate, so no debt is in progress)
// and the requests admitted against the requests' limit; the day's tokens charged
// against its budget; and how late the generator ran at p99. Run it once:
//
//	go test -run '^$' -bench FourInstances -benchtime 1x ./examples/llmproxy
func BenchmarkFourInstances(b *testing.B) {
	for _, leases := range []bool{false, true} {
		name := "exact"
		if leases {
			name = "leases"
		}
		b.Run(name, func(b *testing.B) {
			srv := redistest.Start(b)
			f := startFleet(b, srv.Addr, fleetConfig(120_000, 600, 90_000), leases)
			f.spend(b, llmlimit.Tokens, "t", "key", 120_000)
			f.spend(b, llmlimit.Requests, "r", "key", 600)
			const minute = time.Minute
			var runs []sent
			var late time.Duration
			for range b.N {
				runs, late = f.drive(b, "key", map[string]int{"t": 40, "r": 20, "d": 10}, 2*minute)
			}
			for i, from := range []time.Duration{0, minute} {
				t, r := figures(runs, "t", from, from+minute), figures(runs, "r", from, from+minute)
				if t.failed+r.failed > 0 {
					b.Errorf("minute %d: %d requests failed", i+1, t.failed+r.failed)
				}
				b.ReportMetric(float64(t.tokens)/120_000, "tokens/budget-min"+strconv.Itoa(i+1))
				b.ReportMetric(float64(r.admitted)/600, "requests/limit-min"+strconv.Itoa(i+1))
			}
			d := figures(runs, "d", 0, 2*minute)
			b.ReportMetric(float64(d.tokens)/90_000, "day-tokens/budget")
			b.ReportMetric(float64(late.Microseconds())/1000, "late-p99-ms")
		})
	}
}
