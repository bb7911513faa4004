package ratelimit

import (
	"cmp"
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// rateHeaders are the headers writeHeaders sets.
var rateHeaders = [...]string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"}

// setHeaders sets the rate-limit headers of a request decided under the policies ps, of
// key: Headers' when it is set, else the defaults (see writeHeaders). It returns the
// names Headers wrote (nil for the defaults, or without an in-flight limit), for the
// in-flight limit to take off.
func (m *Middleware) setHeaders(h http.Header, key string, ps []policy) []string {
	if m.Headers == nil {
		writeHeaders(h, ps)
		return nil
	}
	b := binding(ps)
	limits := make([]PolicyDecision, len(ps))
	for i, p := range ps {
		unit := "requests"
		if p.c.cost != nil && p.c.cost.Unit != "" {
			unit = p.c.cost.Unit
		}
		limits[i] = PolicyDecision{Name: p.name, Key: cmp.Or(p.key, key), Rule: p.rule, Unit: unit, Decision: p.d, Binding: i == b}
	}
	if m.InFlight == nil { // no refusal after this one takes them off
		m.Headers(h, limits)
		return nil
	}
	before := make(map[string]bool, len(h))
	for name := range h {
		before[name] = true
	}
	m.Headers(h, limits)
	var written []string
	for name := range h {
		if !before[name] {
			written = append(written, name)
		}
	}
	return written
}

// writeHeaders sets the IETF draft's RateLimit-Policy (each policy's quota and the seconds
// a full quota takes to come back) and RateLimit (draft-ietf-httpapi-ratelimit-headers),
// and the de facto X-RateLimit-*, from the policies ps: RateLimit and X-RateLimit-* both
// from the one policy that binds, never a limit of one beside a reset of another. A name
// that is not an RFC 8941 string leaves the draft's two out.
func writeHeaders(h http.Header, ps []policy) {
	b := binding(ps)
	d := ps[b].d
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(resetSeconds(d), 10))
	var bname string
	var list strings.Builder
	list.Grow(48 * len(ps))
	for i, p := range ps {
		name, ok := sfString(p.name)
		if !ok {
			return
		}
		if i == b {
			bname = name
		}
		if w := windowSeconds(p.d.Limit, p.rule); w > 0 {
			if list.Len() > 0 {
				list.WriteString(", ")
			}
			list.WriteString(name)
			list.WriteString(";q=")
			list.WriteString(strconv.FormatInt(p.d.Limit, 10))
			list.WriteString(";w=")
			list.WriteString(strconv.FormatInt(w, 10))
			if p.c.cost != nil && p.c.cost.Unit != "" && p.c.cost.Unit != "requests" {
				unit, _ := sfString(p.c.cost.Unit) // checked by Wrap
				list.WriteString(";qu=")
				list.WriteString(unit)
			}
		}
	}
	if list.Len() > 0 {
		h.Set("RateLimit-Policy", list.String())
	}
	h.Set("RateLimit", bname+";r="+strconv.FormatInt(ps[b].d.Remaining, 10)+";t="+strconv.FormatInt(resetSeconds(ps[b].d), 10))
}

// binding is the index of the policy that bounds the client now: of those that denied,
// the one with the longest RetryAfter; when none did, the one with the least remaining;
// the first of equals.
func binding(ps []policy) int {
	b := 0
	for i, p := range ps {
		switch {
		case !p.d.Allowed && (ps[b].d.Allowed || p.d.RetryAfter > ps[b].d.RetryAfter):
			b = i
		case p.d.Allowed && ps[b].d.Allowed && p.d.Remaining < ps[b].d.Remaining:
			b = i
		}
	}
	return b
}

// resetSeconds is d's ResetAfter in whole seconds, rounded up; 0 for a key that is full.
func resetSeconds(d Decision) int64 {
	if d.ResetAfter <= 0 {
		return 0
	}
	return ceilSeconds(d.ResetAfter)
}

// windowSeconds is how long a quota of limit takes to come back at rule's rate, in whole
// seconds rounded up and at least 1 (limit * Period / Limit, exactly: the product may
// pass 64 bits); 0 for a rule without a rate.
func windowSeconds(limit int64, rule Rule) int64 {
	if limit <= 0 || rule.Limit <= 0 || rule.Period <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(limit), uint64(rule.Period))
	hi, lo = ceilDiv128(hi, lo, uint64(rule.Limit))
	hi, lo = ceilDiv128(hi, lo, uint64(time.Second))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return max(1, int64(lo))
}

// ceilDiv128 is the 128-bit hi:lo divided by d > 0, rounded up.
func ceilDiv128(hi, lo, d uint64) (uint64, uint64) {
	qhi, r := hi/d, hi%d
	qlo, r := bits.Div64(r, lo, d)
	if r != 0 {
		var carry uint64
		qlo, carry = bits.Add64(qlo, 1, 0)
		qhi += carry
	}
	return qhi, qlo
}

// sfString is name as a String of RFC 8941 structured fields (quoted, '"' and '\'
// escaped), and whether it can be one: printable ASCII only.
func sfString(name string) (string, bool) {
	plain := true
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return "", false
		} else if c == '"' || c == '\\' {
			plain = false
		}
	}
	if plain {
		return `"` + name + `"`, true
	}
	var b strings.Builder
	b.Grow(len(name) + 4)
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		if c := name[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(name[i])
	}
	b.WriteByte('"')
	return b.String(), true
}

// ceilSeconds is d in whole seconds, rounded up, at least 1.
func ceilSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}
