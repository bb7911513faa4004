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
// one Redis, which answers at once or slowly: every 20th reply 15ms late, past the
// fallback's 5ms, so that the instances' shares decide part of the traffic. One API key
// is asked twice its 120,000 tokens a minute ("t"), twice its 600 requests a minute
// ("r"), 1,000 tokens a second against 90,000 a day ("d"), and 1,000 tokens a second
// against a day's budget it never reaches ("b"); open loop, 50/25/15/10% over the
// instances; of every four requests a chat completion, one streamed, another, and a
// Responses API stream, each estimated at three times what it uses; the client and the
// model speak gzip. It reports, for each minute, the tokens charged against the minute's
// budget (no request uses more than its estimate, so no debt is in progress) and the
// requests admitted against the requests' limit; the day's tokens charged against its
// budget; for "b", the tokens counted on Redis once the instances closed against those
// the model reported (billing, 1 when every token is charged once), and the decisions the
// fallback's shares made (charged there, not on Redis); and how late the generator ran at
// p99. Run it once:
//
//	go test -run '^$' -bench FourInstances -benchtime 1x ./examples/llmproxy
func BenchmarkFourInstances(b *testing.B) {
	for _, slow := range []bool{false, true} {
		for _, leases := range []bool{false, true} {
			name := map[bool]string{false: "exact", true: "leases"}[leases] + map[bool]string{false: "", true: "/slow-redis"}[slow]
			b.Run(name, func(b *testing.B) { runFourInstances(b, leases, slow) })
		}
	}
}

func runFourInstances(b *testing.B, leases, slow bool) {
	srv := redistest.Start(b)
	addr := srv.Addr
	if slow {
		p := redistest.StartProxy(b, srv.Addr)
		p.HoldEvery(20, 15*time.Millisecond)
		addr = p.Addr
	}
	c := fleetConfig(120_000, 600, 90_000)
	f := startFleet(b, addr, c, leases)
	f.spend(b, llmlimit.Tokens, "t", "key", 120_000)
	f.spend(b, llmlimit.Requests, "r", "key", 600)
	const minute = time.Minute
	var runs []sent
	var late time.Duration
	for range b.N {
		runs, late = f.drive(b, "key", map[string]int{"t": 40, "r": 20, "d": 10, "b": 10}, 2*minute)
	}
	f.close()
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
	counted, reported := f.billed(b, srv, c)
	b.ReportMetric(float64(counted)/float64(reported), "billed/reported")
	b.ReportMetric(float64(f.shares(b)), "share-decisions")
	b.Logf("b: %d tokens counted on Redis, %d reported by the model, %d charged to clients", counted, reported, figures(runs, "b", 0, 2*minute).tokens)
	b.ReportMetric(float64(late.Microseconds())/1000, "late-p99-ms")
}
