package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// TestDemo pins the demo: each request admitted on its prompt, charged what the model
// used; the third leaves the key 184 tokens in debt (616 - 800), so the fourth, a
// second later, waits 5s for the debt and its 2 tokens (153 at 2000 a minute: 4.59s).
func TestDemo(t *testing.T) {
	var b bytes.Buffer
	if err := demo(&b); err != nil {
		t.Fatal(err)
	}
	want := `at       request                          status  estimate  used  remaining  retry-after
0s       100 words, max_tokens 1000          200       100   500       1900
1s       150 words, max_tokens 1000          200       150   750       1383
2s       200 words, max_tokens 1000          200       200  1000        616
3s       2 words, max_tokens 100             429         2     -          0            5
30s      2 words, max_tokens 100             200         2    10        748
45s      2 words, max_tokens 100             200         2    10       1238

RateLimit-Policy: "tokens-per-minute";q=2000;w=60;qu="tokens"
`
	if got := b.String(); !strings.HasSuffix(got, want) {
		t.Errorf("the demo printed:\n%s\nwant it to end with:\n%s", got, want)
	}
}

// TestProxy: a request without an API key never reaches the model; an answer that
// reports no usage (the model failed) keeps the estimate.
func TestProxy(t *testing.T) {
	calls := 0
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	defer model.Close()
	u, _ := url.Parse(model.URL)
	limiter, err := tokenbucket.New(localstore.New(), ratelimit.PerMinute(1000))
	if err != nil {
		t.Fatal(err)
	}
	h := proxy(u, limiter)
	ask := func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"messages":[{"content":"one two three"}]}`))
		if key != "" {
			r.Header.Set("Authorization", "Bearer "+key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := ask(""); w.Code != http.StatusUnauthorized || calls != 0 {
		t.Errorf("without an API key: %d, %d calls to the model; want 401 and none", w.Code, calls)
	}
	if w := ask("k"); w.Code != http.StatusServiceUnavailable || calls != 1 {
		t.Errorf("a failed answer: %d, %d calls; want the model's 503", w.Code, calls)
	}
	if d, err := limiter.PeekN(context.Background(), "k", 1); err != nil || d.Remaining != 996 {
		t.Errorf("after a failed answer estimated at 3: %+v, %v; want 997 left", d, err)
	}
}
