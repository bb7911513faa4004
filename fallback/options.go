package fallback

import (
	"log/slog"
	"time"

	"github.com/ratelimit-go/ratelimit/clock"
)

// Option configures a Store.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithInstanceCount asks count, at each decision, how many instances share the rule
// while the primary is down. Less than 1 means 1. Pass the number of instances alive,
// learned while the primary was up, such as members.Members.Count. It replaces
// WithInstances.
func WithInstanceCount(count func() int) Option {
	return optionFunc(func(s *Store) { s.count = count })
}

// WithInstances sets how many instances share the rule while the primary is down. Each
// enforces 1/n of it. The default is 1, the whole rule; less than 1 means 1.
func WithInstances(n int) Option {
	return optionFunc(func(s *Store) { s.instances, s.count = int64(max(1, n)), nil })
}

// WithTimeout sets the least a decision waits for the primary. After it, the decision
// is made on the secondary. The default is DefaultTimeout (5ms); 0 or less means the
// default. A decision waits that long beyond the primary's measured tail, up to
// WithMaxTimeout (see Timeout). The store stops waiting then, whatever the primary's
// client does with its context.
//
// # Timeout and breaker
//
// A decision the primary has not answered within the timeout is made on the secondary.
// Its call goes on. An answer that comes later is a slow primary, not a down one. It
// counts as an answer for the breaker. Its time counts in the round trip the timeout
// follows, up to WithMaxTimeout (50ms by default). A lease of an in-flight limit that
// such an answer grants is released at once, since nobody holds it. So a Redis a zone
// away, a jittery network or a busy CPU make decisions wait longer for Redis. They never
// send them to the shares wholesale.
//
// A call fails when it returns an error wrapping ratelimit.ErrUnavailable, or stays
// unanswered for the breaker's Unanswered (100ms). The breaker opens when at least 20
// calls ended in the last second, and at least half of them failed (see Breaker). Then,
// for a second, no decision tries the primary, so none waits. After that, a single probe
// goes to the primary. Its answer closes the breaker, and its failure opens it for another
// second.
//
// A primary that is down opens the breaker within about 200ms of traffic. Below 20 calls
// a second, the breaker stays closed, and each call pays the timeout. Calls left
// unanswered within a tenth of a second of each other do not open it, unless an error
// comes with them. They are the process starved of CPU for a moment.
//
// An error that says nothing about availability, such as a missing script, is also
// answered from the secondary. It does not count as a failure. Neither does a caller that
// gives up: a decision whose context ends returns ctx.Err().
//
// # A slow primary
//
// A take the primary is too slow for is decided on the secondary. The primary still
// counts what the instance admitted, once, at what it cost, if it answers within a
// second. If the primary admitted the take too, the share's take is its mirror. The
// take's settlement (a Charge's) then goes to the primary. If the share admitted what the
// primary denied or never received, the primary is charged it as a debit. If the share
// denied what the primary admitted later, the primary gives back a take with a receipt.
// A take without one stays counted there.
//
// A take the share would deny waits a while longer for the primary, up to the breaker's
// Unanswered (100ms). A share holds only 1/n of the rule, and a slow primary decides
// better. Watch OnDecision's sources and OnPrimaryError's timeouts.
//
// # Choosing the timeout
//
// The timeout is what a decision may always wait for the primary, whatever the round
// trip. Set it above the primary's usual round trip where the application runs, with
// room for the slow ones. OnDecision reports the primary's latency for each decision it
// makes. redis-cli --latency, run from an instance, measures it too.
//
// The default of 5ms suits a Redis on the same host or in the same zone. The timeout
// then follows a Redis further away by itself, up to WithMaxTimeout. BENCHMARKS.md gives
// the share of decisions Redis makes at 1, 2.5 and 4ms away, with jitter and held
// replies. A reply that comes after its decision's timeout is still read by redisstore,
// which keeps its connection. So a slow moment does not cost the next decisions a new
// connection.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.timeout = d
		}
	})
}

// WithMaxTimeout bounds how far the timeout follows the primary's measured round trip.
// The default is DefaultMaxTimeout (50ms). A value below the timeout means the timeout,
// which then stays as WithTimeout set it. See WithTimeout.
func WithMaxTimeout(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.maxTimeout = d
		}
	})
}

// WithPolicy sets what happens while the primary cannot decide (LocalShare by default).
func WithPolicy(p Policy) Option {
	return optionFunc(func(s *Store) { s.policy = p })
}

// WithBreaker configures the circuit breaker; zero fields keep their defaults.
func WithBreaker(b Breaker) Option {
	return optionFunc(func(s *Store) {
		if b.FailureRate > 0 && b.FailureRate <= 1 {
			s.breaker.rate = b.FailureRate
		}
		if b.MinCalls > 0 {
			s.breaker.minCalls = int64(b.MinCalls)
		}
		if b.Window >= slices {
			s.breaker.slice = int64(b.Window / slices)
		}
		if b.OpenFor > 0 {
			s.breaker.openFor = b.OpenFor
		}
		if b.Unanswered > 0 {
			s.breaker.unanswered = b.Unanswered
		}
	})
}

// WithHooks sets callbacks for metrics and logs.
func WithHooks(h Hooks) Option {
	return optionFunc(func(s *Store) { s.hooks = h })
}

// WithLogger logs what the store swallows while it keeps deciding. At Warn, it logs:
//   - each time the breaker opens, with the primary's error that opened it;
//   - that its probes still fail, with the latest probe's error, at most every 30s;
//   - the primary's errors that open nothing (a missing script), at most one a second;
//   - once a minute, a timeout that follows a primary slower than WithTimeout.
//
// At Info, it logs each time the primary decides again. A nil logger, the default, logs
// nothing.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(s *Store) { s.log = l })
}

// WithClock sets the clock of the breaker and of the latency hooks. The default is
// clock.NewMonotonic(), and nil means the default. It does not change the stores'
// clocks.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) {
		if c != nil {
			s.clock = c
		}
	})
}
