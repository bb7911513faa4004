package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// rule is the one rule of every comparison: 10 per second (the buckets hold 10).
var rule = ratelimit.PerSecond(10)

// start is where every scenario begins: on a whole second, where fixed windows begin.
var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type algorithm struct {
	name   string
	alg    *ratelimit.Algorithm
	color  string
	choose string // one line: when to choose it
}

var algorithms = []algorithm{
	{"tokenbucket", tokenbucket.Algorithm(), "#1f77b4", "APIs: bursts up to the capacity, then the rate"},
	{"leakybucket", leakybucket.Algorithm(), "#ff7f0e", "shaping: admitted requests leave evenly paced"},
	{"fixedwindow", fixedwindow.Algorithm(), "#2ca02c", "cheapest; up to 2x the limit across a boundary"},
	{"slidingwindow", slidingwindow.Algorithm(), "#d62728", "a window limit without the boundary burst"},
	{"slidinglog", slidinglog.Algorithm(), "#9467bd", "exact: never more than the limit in any period"},
}

// scenario is traffic: the instants of its requests, from start.
type scenario struct {
	name, about string
	length      time.Duration
	arrivals    []time.Duration
}

func evenly(from, to time.Duration, perSecond int) []time.Duration {
	var at []time.Duration
	gap := time.Second / time.Duration(perSecond)
	for t := from; t < to; t += gap {
		at = append(at, t)
	}
	return at
}

func burst(at time.Duration, n int) []time.Duration {
	b := make([]time.Duration, n)
	for i := range b {
		b[i] = at
	}
	return b
}

func scenarios() []scenario {
	// bursty: on for a while at 30/s, off for a while, from a fixed seed
	rng := rand.New(rand.NewPCG(7, 11))
	var bursty []time.Duration
	for t := time.Duration(0); t < 6*time.Second; {
		on := time.Duration(200+rng.IntN(600)) * time.Millisecond
		for end := t + on; t < end; t += time.Duration(rng.ExpFloat64() * float64(time.Second/30)) {
			bursty = append(bursty, t.Truncate(time.Millisecond))
		}
		t += time.Duration(300+rng.IntN(900)) * time.Millisecond
	}
	return []scenario{
		{"steady", "8/s, evenly, under the limit", 5 * time.Second, evenly(0, 5*time.Second, 8)},
		{"burst", "30 at once at 1s and at 3.5s", 5 * time.Second, append(burst(time.Second, 30), burst(3500*time.Millisecond, 30)...)},
		{"boundary", "10 at 0.9s and 10 at 1.0s, either side of a window edge", 3 * time.Second,
			append(burst(900*time.Millisecond, 10), burst(time.Second, 10)...)},
		{"overload", "25/s, evenly, for 5s", 5 * time.Second, evenly(0, 5*time.Second, 25)},
		{"bursty", "on-off bursts at about 30/s, seeded random", 6 * time.Second, bursty},
	}
}

// result is what one algorithm did with one scenario.
type result struct {
	admitted, denied int
	maxInPeriod      int             // the most admitted in any interval of one period
	smoothness       float64         // the coefficient of variation of the gaps between admitted requests
	memoryBytes      int             // the most state held in memory, in bytes
	redisBytes       int             // the most state held in Redis, in bytes of value
	leave            []time.Duration // when each admitted request proceeds: its instant plus its Delay
}

// simulate runs sc through alg's own step on one key, as localstore does.
func simulate(alg *ratelimit.Algorithm, sc scenario) (result, error) {
	args, err := alg.Prepare(core.Rule(rule), 1)
	if err != nil {
		return result{}, err
	}
	var st core.State
	var r result
	for _, at := range sc.arrivals {
		d := alg.Step(&st, start.Add(at).UnixMicro(), args)
		if d.Allowed() {
			r.admitted++
			r.leave = append(r.leave, at+d.Wait) // the Delay of an admitted event
		} else {
			r.denied++
		}
		mem, rds := stateBytes(st)
		r.memoryBytes, r.redisBytes = max(r.memoryBytes, mem), max(r.redisBytes, rds)
	}
	r.maxInPeriod = maxInWindow(r.leave, rule.Period)
	r.smoothness = variation(r.leave)
	return r, nil
}

// stateBytes is the size of a key's state: in memory, the State and its log's entries
// (16 bytes each); in Redis, the value "T:L:A" and the log's pairs as decimal strings.
func stateBytes(st core.State) (memory, redis int) {
	memory = 32
	redis = len(fmt.Sprintf("%d:%d:%d", st.Time, st.Level, st.Aux))
	if st.Log != nil {
		memory += 16 * st.Log.Len()
		for i := 0; i < st.Log.Len(); i++ {
			e := st.Log.At(i)
			redis += len(fmt.Sprint(e.At)) + len(fmt.Sprint(e.N))
		}
	}
	return memory, redis
}

// maxInWindow is the most instants (sorted) within any interval of length w.
func maxInWindow(at []time.Duration, w time.Duration) int {
	best, from := 0, 0
	for to := range at {
		for at[to]-at[from] >= w {
			from++
		}
		best = max(best, to-from+1)
	}
	return best
}

// variation is the coefficient of variation of the gaps between sorted instants: 0 for an
// even pace, larger for a burstier one.
func variation(at []time.Duration) float64 {
	if len(at) < 3 {
		return 0
	}
	var sum, sq float64
	for i := 1; i < len(at); i++ {
		g := float64(at[i] - at[i-1])
		sum += g
		sq += g * g
	}
	n := float64(len(at) - 1)
	mean := sum / n
	if mean == 0 {
		return 0
	}
	return math.Sqrt(max(0, sq/n-mean*mean)) / mean
}
