package envoyrules

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
)

func parse(t *testing.T, yaml string) *Domain {
	t.Helper()
	d, err := Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// desc builds a descriptor from "key=value" pairs.
func desc(pairs ...string) []Entry {
	out := make([]Entry, len(pairs))
	for i, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		out[i] = Entry{k, v}
	}
	return out
}

// limitOf is the "requests_per_unit/unit" of the descriptor's match, or "" for none,
// "unlimited" for an unlimited one.
func limitOf(d *Domain, entries []Entry) string {
	m := d.Match(entries)
	switch {
	case m == nil:
		return ""
	case m.Unlimited:
		return "unlimited"
	}
	return strings.Join([]string{itoa(m.RequestsPerUnit), m.Unit}, "/")
}

func itoa(n uint32) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

// The matching rules of the service's documented examples (its README's "Examples"):
// the most specific value first, then wildcards, then any value; the depth of the
// request's descriptor equal to the tree's; unlimited; replaces; metric keys.
func TestMatchAsTheServiceDocuments(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       map[string]string // descriptor ("k=v,k2=v2") -> limit
	}{
		{"key and value", `
domain: mongo_cps
descriptors:
  - {key: database, value: users, rate_limit: {unit: second, requests_per_unit: 500}}
  - {key: database, value: default, rate_limit: {unit: second, requests_per_unit: 500}}
`, map[string]string{"database=users": "500/second", "database=default": "500/second", "database=other": "", "db=users": ""}},
		{"nested, and any value", `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`, map[string]string{
			"message_type=marketing,to_number=2061111111": "5/day",
			"to_number=2061111111":                        "100/day",
			"message_type=marketing":                      "", // a placeholder level has no limit
			"message_type=alerts,to_number=2061111111":    "",
		}},
		{"the most specific first", `
domain: edge_proxy_per_ip
descriptors:
  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: remote_address, value: 50.0.0.5, rate_limit: {unit: second, requests_per_unit: 0}}
`, map[string]string{"remote_address=50.0.0.1": "10/second", "remote_address=50.0.0.5": "0/second"}},
		{"depth must match", `
domain: example4
descriptors:
  - {key: key, value: value, rate_limit: {requests_per_unit: 300, unit: second}}
  - key: other
    value: value
    descriptors:
      - {key: subkey, rate_limit: {requests_per_unit: 300, unit: second}}
`, map[string]string{"key=value,subkey=subvalue": "", "key=value": "300/second", "other=value,subkey=x": "300/second",
			"other=value": "", "other=value,subkey=x,deeper=y": ""}},
		{"unlimited", `
domain: internal
descriptors:
  - {key: ldap, rate_limit: {unlimited: true}}
  - {key: azure, rate_limit: {unit: minute, requests_per_unit: 100}}
`, map[string]string{"ldap=x": "unlimited", "azure=y": "100/minute"}},
		{"wildcards", `
domain: example9
descriptors:
  - {key: key1, value: value*, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: path, value: /api/*/action, rate_limit: {unit: minute, requests_per_unit: 21}}
  - {key: route, value: /api/*/resource/*/action, rate_limit: {unit: minute, requests_per_unit: 22}}
  - {key: route, value: /api/v1/resource/1/action, rate_limit: {unit: minute, requests_per_unit: 23}}
`, map[string]string{"key1=value1": "20/minute", "key1=valueXYZ": "20/minute", "key1=value": "20/minute", "key1=valu": "",
			"path=/api/123/action": "21/minute", "path=/api/123/other": "", "path=/api//action": "21/minute",
			"route=/api/v2/resource/456/action": "22/minute", "route=/api/v1/resource/1/action": "23/minute",
			"route=/api/v2/resource/action": ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := parse(t, c.yaml)
			for req, want := range c.want {
				if got := limitOf(d, desc(strings.Split(req, ",")...)); got != want {
					t.Errorf("(%s): %q; want %q", req, got, want)
				}
			}
		})
	}
}

// Metric keys as the service's README's examples give them.
func TestMetricKeys(t *testing.T) {
	d := parse(t, `
domain: example8
descriptors:
  - {key: key1, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: key1, value: value1, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - {key: subject_id, rate_limit: {unit: minute, requests_per_unit: 60}}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - {key: resource, rate_limit: {unit: minute, requests_per_unit: 100}}
`)
	for req, want := range map[string]string{
		"key1=unspecified_value": "example8.key1_unspecified_value",
		"key1=value1":            "example8.key1_value1",
		"key2=anything":          "example8.key2",
		"route=api,http_method=GET,subject_id=123":      "example8.route_api.http_method_GET.subject_id",
		"user=alice,action=readfile,resource=documents": "example8.user_alice.action_readfile.resource",
	} {
		m := d.Match(desc(strings.Split(req, ",")...))
		if m == nil || m.MetricKey != want {
			t.Errorf("(%s): metric key %v; want %q", req, m, want)
		}
	}
}

// Files the service refuses are refused, with a message that names the problem.
func TestParseErrors(t *testing.T) {
	for bad, want := range map[string]string{
		`descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1}}]`:                                              "domain is empty",
		`{domain: d, descriptors: [{key: "", rate_limit: {unit: second, requests_per_unit: 1}}]}`:                                "empty key",
		`{domain: d, descriptors: [{key: a}, {key: a}]}`:                                                                         "twice",
		`{domain: d, descriptors: [{key: a, rate_limit: {unit: fortnight, requests_per_unit: 1}}]}`:                              `unit "fortnight"`,
		`{domain: d, descriptors: [{key: a, rate_limit: {unit: second, unlimited: true}}]}`:                                      "unlimited has no unit",
		`{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ""}]}}]}`:         "no name",
		`{domain: d, descriptors: [{key: a, rate_limit: {name: x, unit: second, requests_per_unit: 1, replaces: [{name: x}]}}]}`: "own name",
		`{domain: d, descriptors: [{key: a, value: b, share_threshold: true}]}`:                                                  "wildcard",
		`{domain: d, descriptors: [{key: a, typo: 1}]}`:                                                                          "typo",
		`{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}}]}`:               `algorithm "magic"`,
		`{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: -1}}]}`:                                "`-1`",
		"domain: d\n---\ndomain: e\n": "second YAML document",
		"":                            "empty file",
	} {
		if _, err := Parse("f.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error saying %q", bad, err, want)
		}
	}
	d1, d2 := parse(t, "domain: d"), parse(t, "domain: d")
	if _, err := New(d1, d2); err == nil {
		t.Error("one domain in two files: no error")
	}
}

type fixture struct {
	t   *testing.T
	dc  *Decider
	d   *Domain
	clk *clock.Fake
}

func newFixture(t *testing.T, yaml string) *fixture {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	return &fixture{t: t, dc: &Decider{Store: localstore.New(localstore.WithClock(clk)), Clock: clk}, d: parse(t, yaml), clk: clk}
}

// decide decides descriptors (each "k=v,k2=v2") with hits, and returns the result.
func (f *fixture) decide(hits uint32, descriptors ...string) Result {
	f.t.Helper()
	var ds [][]Entry
	for _, s := range descriptors {
		ds = append(ds, desc(strings.Split(s, ",")...))
	}
	r, err := f.dc.Decide(context.Background(), f.d, ds, hits)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

const publicAPI = `
domain: public-api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: path
        value: /export
        rate_limit: {unit: hour, requests_per_unit: 2, algorithm: slidinglog}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
  - key: path
    value: /beta
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// 100 a minute per api_key, 5 a minute on /login for everyone, a nested rule, an
// unlimited one, a shadow one, hits_addend, and a request one descriptor denies.
func TestDecide(t *testing.T) {
	f := newFixture(t, publicAPI)
	r := f.decide(1, "api_key=a", "path=/login")
	if r.OverLimit || r.Statuses[0].Remaining != 99 || r.Statuses[1].Remaining != 4 {
		t.Fatalf("first request: %+v", r)
	}
	if s := r.Statuses[1]; s.ResetAfter != time.Minute || s.Hits != (Hits{Total: 1, Within: 1}) {
		t.Errorf("/login status: %+v", s)
	}
	r = f.decide(4, "api_key=b", "path=/login") // /login's 4 left, for b too: the 5th is past 80%
	if r.OverLimit || r.Statuses[0].Remaining != 96 || r.Statuses[1].Remaining != 0 || r.Statuses[1].Hits.Near != 1 {
		t.Fatalf("4 hits: %+v", r)
	}
	// /login is spent: the request is over, and a's 100 lose nothing
	r = f.decide(1, "api_key=a", "path=/login")
	if !r.OverLimit || r.Statuses[0].OverLimit || !r.Statuses[1].OverLimit || r.Statuses[1].Hits.Over != 1 {
		t.Fatalf("over on /login: %+v", r)
	}
	if r := f.decide(1, "api_key=a"); r.Statuses[0].Remaining != 98 {
		t.Errorf("a after a denied request: %d left; want 98 (nothing taken by the denial)", r.Statuses[0].Remaining)
	}
	// nested, with its own algorithm: 2 an hour per (api_key, /export)
	for i, want := range []bool{false, false, true} {
		if r := f.decide(1, "api_key=a,path=/export"); r.OverLimit != want {
			t.Errorf("export %d: over %v; want %v", i+1, r.OverLimit, want)
		}
	}
	// unlimited, and no limit at all
	r = f.decide(1, "path=/health", "path=/nowhere")
	if r.OverLimit || !r.Statuses[0].Unlimited || r.Statuses[0].Remaining != math.MaxUint32 || r.Statuses[1].Match != nil {
		t.Errorf("unlimited and unmatched: %+v", r)
	}
	// shadow mode: decided and counted, never over
	f.decide(1, "path=/beta")
	r = f.decide(1, "path=/beta")
	if r.OverLimit || r.Statuses[0].OverLimit || r.Statuses[0].Hits != (Hits{Total: 1, Over: 1, Shadow: 1}) {
		t.Errorf("shadow over its limit: %+v", r)
	}
	// hits_addend beyond what a limit can ever hold: over, nothing taken
	r = f.decide(101, "api_key=c")
	if !r.OverLimit || r.Statuses[0].Hits.Over != 101 {
		t.Errorf("101 hits of a 100 limit: %+v", r)
	}
	if r := f.decide(1, "api_key=c"); r.Statuses[0].Remaining != 99 {
		t.Errorf("c after: %d left; want 99", r.Statuses[0].Remaining)
	}
	// a minute later /login is back
	f.clk.Advance(time.Minute)
	if r := f.decide(1, "api_key=a", "path=/login"); r.OverLimit {
		t.Errorf("a minute later: %+v", r)
	}
}

// What envoyproxy/ratelimit's own call sequences showed: a denied request reports what
// the other limits still hold (nothing was taken from them), hits that can never fit
// and a limit of 0 say when the window ends, and the headers name the last descriptor
// over its limit.
func TestDecideAsTheServiceAnswers(t *testing.T) {
	f := newFixture(t, `
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: key5
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: never
    rate_limit: {unit: minute, requests_per_unit: 0}
`)
	for i := range 15 { // key3 holds 10 an hour: calls 11 to 15 are over, and take nothing
		r := f.decide(1, "key2=9902", "key3=9902")
		want := uint32(19 - i)
		if i >= 10 {
			want = 10 // key2 keeps the 10 it had
		}
		if r.OverLimit != (i >= 10) || r.Statuses[0].OverLimit || r.Statuses[0].Remaining != want {
			t.Fatalf("call %d: over %v, key2 %+v; want key2 OK with %d left", i+1, r.OverLimit, r.Statuses[0], want)
		}
	}
	if r := f.decide(1, "key2=9902"); r.Statuses[0].Remaining != 9 {
		t.Errorf("key2 alone after: %d left; want 9", r.Statuses[0].Remaining)
	}
	f.clk.Advance(15 * time.Second) // 45s before the minute ends
	for _, c := range []struct {
		hits uint32
		desc string
	}{{25, "key2=x"}, {1, "never=x"}} {
		r := f.decide(c.hits, c.desc)
		if s := r.Statuses[0]; !r.OverLimit || s.ResetAfter != 45*time.Second {
			t.Errorf("%d hits on %s, which never fit: over %v, reset %v; want over, 45s (the window's end)", c.hits, c.desc, r.OverLimit, s.ResetAfter)
		}
	}
	f.decide(1, "key4=x")
	f.decide(2, "key5=x")
	r := f.decide(1, "key4=x", "key5=x")
	if tight, ok := r.Tightest(); !ok || tight.Match.RequestsPerUnit != 2 {
		t.Errorf("two descriptors over: the headers describe %+v; want the last over (limit 2)", tight)
	}
}

// replaces: a matched rule that replaces another's name drops it from the request.
func TestReplaces(t *testing.T) {
	f := newFixture(t, `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - {key: user, value: bkthomps, rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}}
  - key: key_2
    value: value_2
    descriptors:
      - {key: user, value: bkthomps, rate_limit: {replaces: [{name: specific_limit}], requests_per_unit: 10, unit: second}}
`)
	for i := range 10 {
		if r := f.decide(1, "key_1=value_1,user=bkthomps", "key_2=value_2,user=bkthomps"); r.OverLimit || r.Statuses[0].Match != nil {
			t.Fatalf("request %d with both: %+v; want the 10/s rule alone", i+1, r)
		}
	}
	if r := f.decide(1, "key_1=value_1,user=bkthomps", "key_2=value_2,user=bkthomps"); !r.OverLimit {
		t.Error("the 11th with both: not over")
	}
	for i := range 5 { // the replaced rule was not touched
		if r := f.decide(1, "key_1=value_1,user=bkthomps"); r.OverLimit {
			t.Fatalf("the 5/s rule alone, request %d: over", i+1)
		}
	}
}

// share_threshold: every value of a wildcard counts together; without it, each apart.
func TestShareThreshold(t *testing.T) {
	f := newFixture(t, `
domain: example11
descriptors:
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: files_no_share, value: files_no_share/*, rate_limit: {unit: hour, requests_per_unit: 10}}
`)
	f.decide(5, "files=files/a.pdf")
	f.decide(5, "files=files/b.csv")
	if r := f.decide(1, "files=files/c.txt"); !r.OverLimit {
		t.Error("a shared threshold of 10 after 5 + 5: c not over")
	}
	f.decide(10, "files_no_share=files_no_share/a.pdf")
	if r := f.decide(1, "files_no_share=files_no_share/b.csv"); r.OverLimit {
		t.Error("an isolated threshold: b over after a's 10")
	}
}

// quota_mode: over only when every quota descriptor is, and then nothing consumed.
func TestQuotaMode(t *testing.T) {
	f := newFixture(t, `
domain: q
descriptors:
  - {key: service, value: s1, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: service, value: s2, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: user, rate_limit: {unit: minute, requests_per_unit: 10}}
`)
	want := []bool{false, false, true} // s1 is spent after 1, s2 after 2: then both are
	for i, over := range want {
		if r := f.decide(1, "service=s1", "service=s2", "user=u"); r.OverLimit != over {
			t.Fatalf("request %d: over %v; want %v (%+v)", i+1, r.OverLimit, over, r)
		}
	}
	if r := f.decide(1, "user=u"); r.Statuses[0].Remaining != 7 {
		t.Errorf("user after 2 admitted and 1 denied: %d left; want 7", r.Statuses[0].Remaining)
	}
}

// Chains are what a client that names its values should send.
func TestChains(t *testing.T) {
	d := parse(t, publicAPI)
	got := []string{}
	for _, c := range d.Chains() {
		got = append(got, strings.Join(c, ">"))
	}
	if want := "api_key api_key>path path"; strings.Join(got, " ") != want {
		t.Errorf("chains %q; want %q", got, want)
	}
}

// Every key the service accepts loads: names and replaces, a limit of 0 (everything
// over), quota_mode, detailed_metric, metadata (accepted, not used), nested and
// unlimited descriptors, a leading document marker.
func TestEveryKeyOfTheService(t *testing.T) {
	d := parse(t, `---
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces: [{name: per_user}, {name: other}]
      unit: minute
      requests_per_unit: 4
  - key: source
    value: proxy
    descriptors:
      - {key: destination, value: blocked, rate_limit: {name: blocked_limit, unit: minute, requests_per_unit: 0}}
      - {key: destination, rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}}
      - key: user
        rate_limit: {unlimited: true}
  - key: unspecified
    detailed_metric: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: service
    value: one
    quota_mode: true
    rate_limit: {unit: month, requests_per_unit: 1}
    metadata:
      service_with_quota: {name: one, tags: [a, b]}
`)
	f := &fixture{t: t, dc: &Decider{Store: localstore.New()}, d: d}
	if r := f.decide(1, "source=proxy,destination=blocked"); !r.OverLimit || r.Statuses[0].Hits.Over != 1 {
		t.Errorf("a limit of 0: %+v; want over", r)
	}
	if r := f.decide(1, "source=proxy,user=u"); r.OverLimit || !r.Statuses[0].Unlimited {
		t.Errorf("nested unlimited: %+v", r)
	}
	if m := d.Match(desc("service=one")); m == nil || !m.QuotaMode || m.Unit != "month" || m.Rule.Period != 30*24*time.Hour {
		t.Errorf("quota_mode, a month: %+v", m)
	}
	// category replaces per_user: with both, only category's 4 a minute applies
	for range 3 {
		if r := f.decide(1, "category=account", "source=proxy,destination=x"); r.OverLimit || r.Statuses[1].Match != nil {
			t.Fatalf("replaced: %+v", r)
		}
	}
}

// A domain in two files is refused, naming both.
func TestDomainInTwoFiles(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"a.yaml", "b.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Load(dir)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "a.yaml")) || !strings.Contains(err.Error(), filepath.Join(dir, "b.yaml")) {
		t.Errorf("a domain in two files: %v; want an error naming both", err)
	}
}
