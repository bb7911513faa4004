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

// WithInstanceCount makes the number of instances sharing the rule while the primary is
// down whatever count returns at each decision (less than 1 means 1): the number of
// instances alive, learned while the primary was up, such as members.Members.Count.
// It replaces WithInstances.
func WithInstanceCount(count func() int) Option {
	return optionFunc(func(s *Store) { s.count = count })
}

// WithInstances says how many instances share the rule while the primary is down: each
// enforces 1/n of it (1 by default: the whole rule; less than 1 means 1).
func WithInstances(n int) Option {
	return optionFunc(func(s *Store) { s.instances, s.count = int64(max(1, n)), nil })
}

// WithTimeout sets the least a decision waits for the primary (DefaultTimeout by
// default; 0 or less means the default): that long beyond the primary's measured tail
// (see Timeout and WithMaxTimeout), whatever the primary's client does with its context,
// after which it is decided on the secondary.
//
// # Timeout and breaker
//
// A decision the primary has not answered within the timeout is decided on the
// secondary, but its call goes on: an answer that comes later is a primary that is slow,
// not one that is down. It counts as an answer for the breaker. Its time counts in the
// round trip the timeout follows (see Timeout), up to WithMaxTimeout (50ms by default).
// A lease of an in-flight limit it granted is released at once, since nobody holds it.
// So a Redis a zone away, a jittery network or a busy
// CPU make decisions wait longer for Redis, never send them to the shares wholesale.
//
// A call is a failure when it fails with an error wrapping ratelimit.ErrUnavailable,
// or stays unanswered for the breaker's Unanswered (100ms). When at least half of the
// calls that ended in the last second failed, and there were at least 20, the breaker
// opens (see Breaker): for a second no decision tries the primary, so none waits. Calls
// left unanswered within a tenth of a second of each other (the process starved of CPU
// for a moment) do not open it, unless an error comes with them; a primary that is down
// opens it within about 200ms of traffic, and below 20 calls a second it stays closed,
// each call paying the timeout. Then a single probe goes to the primary; its answer
// closes the breaker, its failure opens it for another second. An error that says
// nothing about availability (a missing script, say) is answered from the secondary
// too, but does not count as a failure; neither does a caller that gives up: a decision
// whose context ends returns ctx.Err().
//
// A take the primary is too slow for is decided on the secondary, and the primary counts
// what the instance admitted once, at what it cost, however late it answers (within a
// second). Where it admitted the take too, the share's take is the mirror of the
// primary's, and the take's settlement (a Charge's) goes to the primary. Where the share
// admitted what the primary denied, or never received, the primary is charged it as a
// debit. A take the share would deny waits for the primary a while longer (up to the
// breaker's Unanswered, 100ms): a share holds 1/n of the rule, and a slow primary decides
// better. Where the share denied what the primary admitted later still, the primary
// gives back a take that carries a receipt; one without stays counted there. Watch
// OnDecision's sources, and OnPrimaryError's timeouts.
//
// # Choosing the timeout
//
// The timeout is what a decision may always wait for the primary, before the round trip
// is known and whatever it is: above the primary's usual round trip where the
// application runs, with room for the slow ones (OnDecision reports the primary's
// latency of every decision it makes; or redis-cli --latency from an instance). The
// default of 5ms suits a Redis on the same host or in the same zone; the timeout then
// follows a Redis further away by itself, up to WithMaxTimeout (BENCHMARKS.md has the
// share Redis decides 1, 2.5 and 4ms away, with jitter and held replies). A reply that comes after its
// decision's timeout is still read by redisstore, and its connection kept, so a slow
// moment does not cost the next decisions a new connection.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.timeout = d
		}
	})
}

// WithMaxTimeout bounds how far the timeout follows the primary's measured round trip
// (DefaultMaxTimeout by default; a value below the timeout means the timeout, which then
// stays as WithTimeout set it). See WithTimeout.
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
// At Info, it logs each time the primary decides again. nil, the default, logs nothing.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(s *Store) { s.log = l })
}

// WithClock sets the clock of the breaker and of the latency hooks (clock.NewMonotonic()
// by default; nil means the default). It does not change the stores' clocks.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) {
		if c != nil {
			s.clock = c
		}
	})
}
