package ratelimit_test

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

func TestRuleHelpers(t *testing.T) {
	for _, tc := range []struct {
		got  ratelimit.Rule
		want ratelimit.Rule
		str  string
	}{
		{ratelimit.PerSecond(10), ratelimit.Rule{Limit: 10, Period: time.Second}, "10 per 1s"},
		{ratelimit.PerMinute(60), ratelimit.Rule{Limit: 60, Period: time.Minute}, "60 per 1m0s"},
		{ratelimit.PerHour(1000), ratelimit.Rule{Limit: 1000, Period: time.Hour}, "1000 per 1h0m0s"},
		{ratelimit.PerDay(10000), ratelimit.Rule{Limit: 10000, Period: 24 * time.Hour}, "10000 per 24h0m0s"},
		{ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 200}, ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 200}, "100 per 1s, burst 200"},
	} {
		if tc.got != tc.want || tc.got.String() != tc.str {
			t.Errorf("got %+v %q; want %+v %q", tc.got, tc.got.String(), tc.want, tc.str)
		}
		if err := core.CheckRule(core.Rule(tc.got)); err != nil {
			t.Errorf("%v: %v", tc.got, err)
		}
	}
}

// A rule's text is the form String writes, and reads back as the same rule: from flags,
// JSON and YAML without a format of our own.
func TestRuleText(t *testing.T) {
	for _, r := range []ratelimit.Rule{
		ratelimit.PerSecond(10), ratelimit.PerMinute(60), ratelimit.PerHour(1000), ratelimit.PerDay(10_000),
		{Limit: 100, Period: time.Second, Burst: 200},
		{Limit: 3, Period: 1500 * time.Millisecond},
		{Limit: 7, Period: 90*time.Minute + 3*time.Microsecond, Burst: 1 << 52},
		{},
	} {
		text, err := r.MarshalText()
		var back ratelimit.Rule
		if err != nil || back.UnmarshalText(text) != nil || back != r {
			t.Errorf("%+v: %q, %v; back %+v", r, text, err, back)
		}
	}
	for text, want := range map[string]ratelimit.Rule{
		"100 per second":             ratelimit.PerSecond(100),
		"  5 per minute ":            ratelimit.PerMinute(5),
		"2 per hour":                 ratelimit.PerHour(2),
		"10000 per day":              ratelimit.PerDay(10_000),
		"10 per 1m":                  ratelimit.PerMinute(10),
		"100 per 1s,burst 200":       {Limit: 100, Period: time.Second, Burst: 200},
		"100   per   1s ,  burst 20": {Limit: 100, Period: time.Second, Burst: 20},
	} {
		var r ratelimit.Rule
		if err := r.UnmarshalText([]byte(text)); err != nil || r != want {
			t.Errorf("%q: %+v, %v; want %+v", text, r, err, want)
		}
	}
	for text, says := range map[string]string{
		"100":                         `want "<limit> per <period>"`,
		"100/s":                       `want "<limit> per <period>"`,
		"ten per 1s":                  `the limit "ten" is not a whole number`,
		"10 per fortnight":            `the period "fortnight" is not a duration`,
		"10 per 1s, 20":               `want ", burst <n>"`,
		"10 per 1s, burst many":       `the burst "many" is not a whole number`,
		"0 per 1s":                    "limit 0 is less than 1",
		"1 per 1us":                   "period 1µs is shorter than 1ms",
		"1 per 1s, burst -1":          "burst -1 is negative",
		"99999999999999999999 per 1s": "is not a whole number",
	} {
		r := ratelimit.PerSecond(1)
		err := r.UnmarshalText([]byte(text))
		if !errors.Is(err, ratelimit.ErrInvalidRule) || !strings.Contains(err.Error(), says) || r != ratelimit.PerSecond(1) {
			t.Errorf("%q: %v, rule %v; want an error wrapping ErrInvalidRule that says %q, the rule unchanged", text, err, r, says)
		}
	}
}

func TestRuleTextInJSONAndFlags(t *testing.T) {
	var cfg struct {
		Rate  ratelimit.Rule `json:"rate"`
		Plan  ratelimit.Rule `json:"plan"`
		Spare ratelimit.Rule `json:"spare"`
	}
	in := `{"rate": "20 per 1s, burst 40", "plan": "10000 per day", "spare": ""}`
	if err := json.Unmarshal([]byte(in), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Rate != (ratelimit.Rule{Limit: 20, Period: time.Second, Burst: 40}) || cfg.Plan != ratelimit.PerDay(10_000) || cfg.Spare != (ratelimit.Rule{}) {
		t.Fatalf("from JSON: %+v", cfg)
	}
	out, err := json.Marshal(cfg)
	if err != nil || string(out) != `{"rate":"20 per 1s, burst 40","plan":"10000 per 24h0m0s","spare":""}` {
		t.Fatalf("to JSON: %s, %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"rate": "20 per jiffy"}`), &cfg); !errors.Is(err, ratelimit.ErrInvalidRule) {
		t.Errorf("bad JSON rule: %v", err)
	}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var rule ratelimit.Rule
	fs.TextVar(&rule, "rule", ratelimit.PerSecond(10), "the default rule")
	if err := fs.Parse([]string{"-rule", "5 per minute"}); err != nil || rule != ratelimit.PerMinute(5) {
		t.Errorf("-rule: %v, %v", rule, err)
	}
	if err := fs.Parse([]string{"-rule", "5 per moment"}); err == nil {
		t.Error("-rule with a bad period: no error")
	}
}

// FuzzRuleText: any text either is refused or reads as a rule that writes and reads back
// as itself; nothing panics.
func FuzzRuleText(f *testing.F) {
	for _, s := range []string{"100 per 1s", "100 per 1s, burst 200", "5 per minute", "", "1 per 87600h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var r ratelimit.Rule
		if r.UnmarshalText([]byte(s)) != nil {
			return
		}
		text, err := r.MarshalText()
		var back ratelimit.Rule
		if err != nil || back.UnmarshalText(text) != nil || back != r {
			t.Fatalf("%q reads as %+v, which writes %q and reads back as %+v", s, r, text, back)
		}
	})
}
