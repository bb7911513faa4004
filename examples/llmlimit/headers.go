package llmlimit

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// A provider's family of headers: its name in them, and the policies it reports (the
// binding one of them, when the request took part in several: a minute's and a day's).
type family struct {
	name     string
	policies []string
}

var (
	openAIFamilies = []family{
		{"requests", []string{Requests, RequestsPerDay}},
		{"tokens", []string{Tokens, TokensPerDay}},
	}
	anthropicFamilies = []family{
		{"requests", []string{Requests, RequestsPerDay}},
		{"tokens", []string{Tokens, TokensPerDay}},
		{"input-tokens", []string{InputTokens}},
		{"output-tokens", []string{OutputTokens}},
	}
)

// OpenAIHeaders is a Middleware's Headers writing OpenAI's rate-limit headers: for the
// requests' limit x-ratelimit-limit-requests, x-ratelimit-remaining-requests and
// x-ratelimit-reset-requests (the time until it is full again, as OpenAI writes it:
// "6m0s", "1s", "120ms"), and the same ending in -tokens for the tokens' limit; a request
// under both a minute's and a day's limit of one kind gets the one that binds. Every
// limit of the request, those OpenAI has no header for included (input and output
// tokens), is in the IETF draft's RateLimit-Policy and RateLimit (see IETFHeaders).
func OpenAIHeaders() func(http.Header, []ratelimit.PolicyDecision) {
	return func(h http.Header, limits []ratelimit.PolicyDecision) {
		for _, f := range openAIFamilies {
			if d, ok := bindingOf(limits, f.policies); ok {
				h.Set("X-Ratelimit-Limit-"+f.name, strconv.FormatInt(d.Limit, 10))
				h.Set("X-Ratelimit-Remaining-"+f.name, strconv.FormatInt(max(0, d.Remaining), 10))
				h.Set("X-Ratelimit-Reset-"+f.name, resetDuration(d).String())
			}
		}
		IETFHeaders(h, limits)
	}
}

// AnthropicHeaders is a Middleware's Headers writing Anthropic's rate-limit headers:
// anthropic-ratelimit-requests-limit, -remaining and -reset (the instant it is full
// again, in RFC 3339, read from now: time.Now when nil), and the same for tokens,
// input-tokens and output-tokens; a request under both a minute's and a day's limit of
// one kind gets the one that binds. Every limit of the request is in the IETF draft's
// RateLimit-Policy and RateLimit too (see IETFHeaders).
func AnthropicHeaders(now func() time.Time) func(http.Header, []ratelimit.PolicyDecision) {
	if now == nil {
		now = time.Now
	}
	return func(h http.Header, limits []ratelimit.PolicyDecision) {
		at := now()
		for _, f := range anthropicFamilies {
			if d, ok := bindingOf(limits, f.policies); ok {
				prefix := "Anthropic-Ratelimit-" + f.name
				h.Set(prefix+"-Limit", strconv.FormatInt(d.Limit, 10))
				h.Set(prefix+"-Remaining", strconv.FormatInt(max(0, d.Remaining), 10))
				h.Set(prefix+"-Reset", ceilSecond(at.Add(resetDuration(d))).UTC().Format(time.RFC3339))
			}
		}
		IETFHeaders(h, limits)
	}
}

// IETFHeaders writes the IETF draft's headers (draft-ietf-httpapi-ratelimit-headers) of
// every limit of the request, none hiding another: RateLimit-Policy lists each one's
// quota, the seconds a full quota takes to come back and its unit (qu="tokens"), and
// RateLimit each one's remaining and the seconds until it is full again. A policy whose
// name is not printable ASCII is left out.
func IETFHeaders(h http.Header, limits []ratelimit.PolicyDecision) {
	var policies, states []string
	for _, l := range limits {
		name, ok := sfString(l.Name)
		if !ok {
			continue
		}
		if w := windowSeconds(l); w > 0 {
			p := name + ";q=" + strconv.FormatInt(l.Decision.Limit, 10) + ";w=" + strconv.FormatInt(w, 10)
			if l.Unit != "" && l.Unit != "requests" {
				if unit, ok := sfString(l.Unit); ok {
					p += ";qu=" + unit
				}
			}
			policies = append(policies, p)
		}
		states = append(states, name+";r="+strconv.FormatInt(max(0, l.Decision.Remaining), 10)+";t="+strconv.FormatInt(ceilSeconds(resetDuration(l.Decision)), 10))
	}
	if len(policies) > 0 {
		h.Set("RateLimit-Policy", strings.Join(policies, ", "))
	}
	if len(states) > 0 {
		h.Set("RateLimit", strings.Join(states, ", "))
	}
}

// bindingOf is the decision of the policy named in names that binds (of those that
// denied, the one with the longest RetryAfter; else the one with the least remaining),
// and whether the request took part in any.
func bindingOf(limits []ratelimit.PolicyDecision, names []string) (ratelimit.Decision, bool) {
	var b ratelimit.Decision
	found := false
	for _, l := range limits {
		named := false
		for _, n := range names {
			named = named || l.Name == n
		}
		d := l.Decision
		switch {
		case !named:
		case !found,
			!d.Allowed && (b.Allowed || d.RetryAfter > b.RetryAfter),
			d.Allowed && b.Allowed && d.Remaining < b.Remaining:
			b, found = d, true
		}
	}
	return b, found
}

// resetDuration is how long until d's key is full again, in whole milliseconds rounded
// up (OpenAI's precision); 0 for a full key.
func resetDuration(d ratelimit.Decision) time.Duration {
	if d.ResetAfter <= 0 {
		return 0
	}
	return (d.ResetAfter + time.Millisecond - 1).Truncate(time.Millisecond)
}

// ceilSecond is t rounded up to a whole second, for RFC 3339 without its fraction: a
// client that waits until then is not early.
func ceilSecond(t time.Time) time.Time {
	if s := t.Truncate(time.Second); s.Before(t) {
		return s.Add(time.Second)
	}
	return t
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// windowSeconds is how long a full quota of l takes to come back at its rule's rate, in
// whole seconds rounded up and at least 1; 0 for a rule without a rate.
func windowSeconds(l ratelimit.PolicyDecision) int64 {
	if l.Decision.Limit <= 0 || l.Rule.Limit <= 0 || l.Rule.Period <= 0 {
		return 0
	}
	w := math.Ceil(float64(l.Decision.Limit) / float64(l.Rule.Limit) * l.Rule.Period.Seconds())
	if w >= math.MaxInt64 {
		return math.MaxInt64
	}
	return max(1, int64(w))
}

// sfString is name as a String of RFC 8941 structured fields, and whether it can be one
// (printable ASCII).
func sfString(name string) (string, bool) {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 0x20 || c > 0x7e {
			return "", false
		}
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String(), true
}
