package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Rule says how much a key may do. Its meaning is the same for every algorithm, but only
// some algorithms read Burst:
//
//   - Limit: events allowed per Period. For the token and leaky buckets, it is the refill
//     (drain) amount: Limit every Period, continuously.
//   - Period: the window length, or the refill period. It is between one millisecond and
//     10 years, in whole microseconds.
//   - Burst: the bucket's capacity (token bucket) or the queue's size (leaky bucket).
//     0 means Limit. The fixed window, sliding window and sliding log ignore it.
//
// Every number must be at most 2^52. An algorithm may refuse more (see its package). The zero Rule is invalid. Every
// constructor that takes a Rule returns an error wrapping ErrInvalidRule for it.
type Rule struct {
	Limit  int64
	Period time.Duration
	Burst  int64
}

// PerSecond is n events per second.
func PerSecond(n int64) Rule { return Rule{Limit: n, Period: time.Second} }

// PerMinute is n events per minute.
func PerMinute(n int64) Rule { return Rule{Limit: n, Period: time.Minute} }

// PerHour is n events per hour.
func PerHour(n int64) Rule { return Rule{Limit: n, Period: time.Hour} }

// PerDay is n events per 24 hours.
func PerDay(n int64) Rule { return Rule{Limit: n, Period: 24 * time.Hour} }

// validate reports whether the rule is usable by any algorithm: Limit at least 1, Period
// between 1ms and 10 years (3650 days) in whole microseconds, Burst not negative, and Limit
// and Burst at most 2^52, so that the same arithmetic gives the same answer in Go and in a
// Redis Lua script, whose numbers are IEEE doubles. An algorithm may refuse more (see each
// algorithm's package). The error wraps ErrInvalidRule.
func (r Rule) validate() error { return core.CheckRule(core.Rule(r)) }

// String formats the rule as "100 per 1s", or as "100 per 1s, burst 200" when Burst is
// set. MarshalText writes this form, and UnmarshalText reads it.
func (r Rule) String() string { return core.Rule(r).String() }

// MarshalText implements encoding.TextMarshaler. It returns the rule as String writes it,
// so that rules go into JSON, YAML and flags (flag.TextVar) as text. The zero Rule is
// the empty text.
func (r Rule) MarshalText() ([]byte, error) {
	if r == (Rule{}) {
		return []byte{}, nil
	}
	return []byte(r.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler. It sets the rule from text of the
// form String writes: "<limit> per <period>", then ", burst <n>" when there is a burst.
// The period is a Go duration ("1s", "1m0s", "1h30m", "1500ms"). It may also be second,
// minute, hour or day. Spaces around the words do not matter. The empty text is the zero
// Rule. Text of any other form is an error wrapping ErrInvalidRule. So is a rule no
// algorithm can enforce (see Rule). The error says what is wrong, and the rule
// is left as it was.
func (r *Rule) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	if s == "" {
		*r = Rule{}
		return nil
	}
	bad := func(why string, args ...any) error {
		return fmt.Errorf("%w: %q: %s", ErrInvalidRule, s, fmt.Sprintf(why, args...))
	}
	rate, burstText, hasBurst := strings.Cut(s, ",")
	limitText, periodText, ok := strings.Cut(strings.TrimSpace(rate), " per ")
	if !ok {
		return bad(`want "<limit> per <period>", as "100 per 1s"`)
	}
	var rule Rule
	var err error
	if rule.Limit, err = strconv.ParseInt(strings.TrimSpace(limitText), 10, 64); err != nil {
		return bad("the limit %q is not a whole number", strings.TrimSpace(limitText))
	}
	periodText = strings.TrimSpace(periodText)
	switch periodText {
	case "second":
		rule.Period = time.Second
	case "minute":
		rule.Period = time.Minute
	case "hour":
		rule.Period = time.Hour
	case "day":
		rule.Period = 24 * time.Hour
	default:
		if rule.Period, err = time.ParseDuration(periodText); err != nil {
			return bad("the period %q is not a duration (1s, 1m0s, 1h30m) or second, minute, hour or day", periodText)
		}
	}
	if hasBurst {
		word, n, ok := strings.Cut(strings.TrimSpace(burstText), " ")
		if !ok || word != "burst" {
			return bad(`want ", burst <n>" after the rate, as "100 per 1s, burst 200"`)
		}
		if rule.Burst, err = strconv.ParseInt(strings.TrimSpace(n), 10, 64); err != nil {
			return bad("the burst %q is not a whole number", strings.TrimSpace(n))
		}
	}
	if err := mathx.CheckRule(rule.Limit, rule.Period, rule.Burst); err != nil {
		return bad("%v", err)
	}
	*r = rule
	return nil
}
