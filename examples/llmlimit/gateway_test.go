package llmlimit

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// gateway is a Gate counting words in front of the fake model, under t's limits, with
// OpenAI's or Anthropic's headers, on a fake clock at start.
func gateway(t *testing.T, table Table, o Options, anthropic bool) (*httptest.Server, *clock.Fake) {
	t.Helper()
	model := httptest.NewServer(FakeModel())
	t.Cleanup(model.Close)
	u, _ := url.Parse(model.URL)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ps, err := table.Policies(localstore.New(localstore.WithClock(clk)), o)
	if err != nil {
		t.Fatal(err)
	}
	mw := &ratelimit.Middleware{Key: APIKey, Policies: ps, Headers: OpenAIHeaders()}
	if anthropic {
		mw.Headers = AnthropicHeaders(clk.Now)
	}
	srv := httptest.NewServer((&Gate{Tokens: Words, ReportUsage: true}).Wrap(mw.Wrap(Proxy(u))))
	t.Cleanup(srv.Close)
	return srv, clk
}

// completion is a chat completion's body for model: a prompt of prompt words, max_tokens
// maxTokens, streamed or not.
func completion(model string, prompt, maxTokens int, stream bool) string {
	return `{"model":"` + model + `","stream":` + strconv.FormatBool(stream) + `,"max_tokens":` + strconv.Itoa(maxTokens) +
		`,"messages":[{"role":"user","content":"` + words(prompt) + `"}]}`
}

// TestHeadersMatchTheNextRequest: each request is admitted on its prompt and max_tokens
// (10 + 120) and charged what it used (10 + 40: the fake answers four words a word),
// under 3 requests and 1,000 tokens a minute. The tokens remaining in each answer's
// headers, plus what its answer gave back, are what the next request is decided on:
// 870, then 870 + 80 - 130 = 820, and so on, streamed or not. The fourth request is
// refused by the requests' limit (Retry-After 20s, a request per 20s) and costs the
// tokens nothing; 20s later the tokens are full again. A model of another family has
// limits of its own, and only the kinds its entry names.
func TestHeadersMatchTheNextRequest(t *testing.T) {
	srv, clk := gateway(t, Table{"": {RequestsPerMinute: 3, TokensPerMinute: 1000}, "big": {TokensPerMinute: 5000}}, Options{}, false)
	type want struct {
		code                         int
		requests, tokens, retryAfter string
	}
	check := func(what string, resp *http.Response, w want) {
		t.Helper()
		h := resp.Header
		if resp.StatusCode != w.code || h.Get("X-Ratelimit-Remaining-Requests") != w.requests ||
			h.Get("X-Ratelimit-Remaining-Tokens") != w.tokens || h.Get("Retry-After") != w.retryAfter {
			t.Errorf("%s: %d, requests %q, tokens %q, Retry-After %q; want %+v", what, resp.StatusCode,
				h.Get("X-Ratelimit-Remaining-Requests"), h.Get("X-Ratelimit-Remaining-Tokens"), h.Get("Retry-After"), w)
		}
	}
	resp, _ := post(t, srv, "/v1/chat/completions", "k", completion("gpt", 10, 120, false))
	check("the first", resp, want{200, "2", "870", ""})
	if got, want := resp.Header.Get("RateLimit-Policy"), `"requests";q=3;w=60, "tokens";q=1000;w=60;qu="tokens"`; got != want {
		t.Errorf("RateLimit-Policy %q; want %q", got, want)
	}
	if got, want := resp.Header.Get("RateLimit"), `"requests";r=2;t=20, "tokens";r=870;t=8`; got != want {
		t.Errorf("RateLimit %q; want %q", got, want)
	}
	if got := resp.Header.Get("X-Ratelimit-Reset-Tokens"); got != "7.8s" {
		t.Errorf("X-Ratelimit-Reset-Tokens %q; want 7.8s (130 tokens at 1,000 a minute)", got)
	}
	resp, _ = post(t, srv, "/v1/chat/completions", "k", completion("gpt", 10, 120, false))
	check("the second", resp, want{200, "1", "820", ""})
	resp, _ = post(t, srv, "/v1/chat/completions", "k", completion("gpt", 10, 120, true))
	check("the third, streamed", resp, want{200, "0", "770", ""})
	resp, _ = post(t, srv, "/v1/chat/completions", "k", completion("gpt", 10, 120, false))
	check("the fourth", resp, want{429, "0", "850", "20"})
	clk.Advance(20 * time.Second)
	resp, _ = post(t, srv, "/v1/chat/completions", "k", completion("gpt", 10, 120, false))
	check("20s later", resp, want{200, "0", "870", ""})
	resp, _ = post(t, srv, "/v1/chat/completions", "k", completion("big-2", 10, 120, false))
	check("a model of the big family", resp, want{200, "", "4870", ""})
}

// TestAnthropicHeaders: Anthropic's headers, input and output tokens apart, the reset an
// instant in RFC 3339 rounded up to a whole second; the day's limit binds the tokens'
// headers once it has less left than the minute's, and both stay in RateLimit.
func TestAnthropicHeaders(t *testing.T) {
	srv, _ := gateway(t, Table{"": {InputTokensPerMinute: 100, OutputTokensPerMinute: 1000, TokensPerMinute: 2000, TokensPerDay: 1000}}, Options{Weights: Weights{Output: 3}}, true)
	resp, _ := post(t, srv, "/v1/messages", "k", completion("claude", 10, 120, false))
	h := resp.Header
	for name, want := range map[string]string{
		"Anthropic-Ratelimit-Input-Tokens-Remaining":  "90",
		"Anthropic-Ratelimit-Input-Tokens-Reset":      "2026-01-01T00:00:06Z",
		"Anthropic-Ratelimit-Output-Tokens-Remaining": "880",
		"Anthropic-Ratelimit-Output-Tokens-Reset":     "2026-01-01T00:00:08Z", // 120 at 1,000 a minute: 7.2s
		"Anthropic-Ratelimit-Tokens-Limit":            "1000",                 // the day's, 10 + 3 × 120 = 370 taken
		"Anthropic-Ratelimit-Tokens-Remaining":        "630",
		"Anthropic-Ratelimit-Tokens-Reset":            "2026-01-02T00:00:00Z",
		"Anthropic-Ratelimit-Requests-Remaining":      "",
		"RateLimit":                                   `"tokens";r=1630;t=12, "input-tokens";r=90;t=6, "output-tokens";r=880;t=8, "tokens-per-day";r=630;t=86400`,
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s: %q; want %q", name, got, want)
		}
	}
	if got := h.Get(UsageHeader); got != "50" {
		t.Errorf("%s %q; want 50", UsageHeader, got)
	}
}

// TestPoliciesRefused: a table the policies cannot be made of is an error that names
// what is wrong.
func TestPoliciesRefused(t *testing.T) {
	for _, c := range []struct {
		table Table
		o     Options
		want  string
	}{
		{Table{"gpt": {TokensPerMinute: -1}}, Options{}, `"gpt": -1 is below 0`},
		{Table{"": {TokensPerMinute: 1}}, Options{Weights: Weights{Input: -2}}, "a weight of -2"},
		{Table{"": {TokensPerMinute: 1}}, Options{MaxTokens: -1}, "MaxTokens -1"},
	} {
		if _, err := c.table.Policies(localstore.New(), c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v, %+v: %v; want an error saying %q", c.table, c.o, err, c.want)
		}
	}
}

// TestUnknownModel: without a "" entry, a request to a model the table does not name is
// not limited, and gets no rate-limit headers.
func TestUnknownModel(t *testing.T) {
	srv, _ := gateway(t, Table{"gpt": {RequestsPerMinute: 1}}, Options{}, false)
	for range 3 {
		resp, _ := post(t, srv, "/v1/chat/completions", "k", completion("other", 1, 1, false))
		if resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Remaining-Requests") != "" {
			t.Fatalf("%d %v; want 200 without headers", resp.StatusCode, resp.Header)
		}
	}
}

// TestWithoutGate: a Middleware of a Table's policies that no Gate reads for is a
// mistake refused loudly (KeyError's answer), never a request let through unlimited.
func TestWithoutGate(t *testing.T) {
	ps, err := Table{"": {RequestsPerMinute: 1}}.Policies(localstore.New(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := (&ratelimit.Middleware{Key: APIKey, Policies: ps}).Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(completion("m", 1, 1, false)))
	r.Header.Set("Authorization", "Bearer k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "Gate") {
		t.Errorf("%d %q; want 400 naming the Gate", w.Code, w.Body.String())
	}
}
