// Llmproxy is a proxy in front of a language model's API, limited in tokens a minute per
// API key: a request is admitted on an estimate (the words of its prompt, the part known
// before the answer), passed to the upstream, and charged the tokens the upstream says
// it used, completion included, once the answer is done. A key that used more than it had left is in debt: its next
// requests are answered 429, with the exact Retry-After, until the debt is repaid.
//
//	go run ./examples/llmproxy          # a demo: a built-in fake upstream, one client, printed
//	go run ./examples/llmproxy -serve   # serve on :8081 in front of the fake (or -upstream URL)
//
// The fake upstream answers as OpenAI's chat completions do, with the usage in the body;
// the proxy reads it from there and hands it to the limiter in a header
// (X-Usage-Total-Tokens), which the client sees too.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// usageHeader carries the tokens a completion used, from the proxy to the limiter.
const usageHeader = "X-Usage-Total-Tokens"

// maxBody bounds the request bodies the proxy reads for its estimate.
const maxBody = 1 << 20

func main() {
	serve := flag.Bool("serve", false, "serve on -addr instead of running the demo")
	addr := flag.String("addr", ":8081", "the proxy's address, with -serve")
	upstream := flag.String("upstream", "", "the model API's base URL; the built-in fake when empty")
	tpm := flag.Int64("tpm", 2000, "tokens a minute per API key")
	flag.Parse()
	if !*serve {
		if err := demo(os.Stdout); err != nil {
			log.Fatal(err)
		}
		return
	}
	target := *upstream
	if target == "" {
		fake := httptest.NewServer(fakeModel())
		defer fake.Close()
		target = fake.URL
	}
	u, err := url.Parse(target)
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := tokenbucket.New(localstore.New(), ratelimit.PerMinute(*tpm), ratelimit.WithNamespace("tokens-per-minute"))
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("llmproxy: %d tokens a minute per API key, in front of %s, on %s", *tpm, target, *addr)
	log.Fatal(http.ListenAndServe(*addr, proxy(u, limiter)))
}

// proxy is the limited reverse proxy to upstream.
func proxy(upstream *url.URL, limiter *tokenbucket.Limiter) http.Handler {
	rp := httputil.NewSingleHostReverseProxy(upstream)
	rp.ModifyResponse = func(resp *http.Response) error {
		used, err := usage(resp)
		if err != nil {
			return err
		}
		if used >= 0 {
			resp.Header.Set(usageHeader, strconv.FormatInt(used, 10))
		}
		return nil
	}
	mw := &ratelimit.Middleware{
		Limiter: limiter,
		Key:     apiKey,
		KeyError: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		},
		Cost:       &ratelimit.Cost{Estimate: estimate, Actual: ratelimit.CostHeader(usageHeader), Unit: "tokens"},
		PolicyName: func(*http.Request) string { return "tokens-per-minute" },
	}
	return mw.Wrap(rp)
}

// apiKey is the request's bearer token.
func apiKey(r *http.Request) (string, error) {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || key == "" {
		return "", errors.New("an API key is required: Authorization: Bearer <key>")
	}
	return key, nil
}

// chatRequest is the part of a chat completion request the proxy reads.
type chatRequest struct {
	Messages []struct {
		Content string `json:"content"`
	} `json:"messages"`
	MaxTokens int64 `json:"max_tokens"`
}

// defaultMaxTokens is the completion a request without max_tokens is estimated at.
const defaultMaxTokens = 256

// estimate is what a request is admitted on: its prompt's words (about its tokens), the
// part of its cost known before the answer; a key with that much left is admitted, and
// the completion is charged after, in debt if need be. (Admitting on the prompt and
// max_tokens instead never leaves a key in debt, and refuses a long answer a key could
// have afforded.) The body is read and put back for the upstream.
func estimate(r *http.Request) int64 {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req chatRequest
	if err != nil || json.Unmarshal(body, &req) != nil {
		return 1
	}
	return promptTokens(req)
}

// cmp is n, or def when n is not above 0.
func cmp(n, def int64) int64 {
	if n > 0 {
		return n
	}
	return def
}

// promptTokens counts a request's prompt as the fake model does: a token a word.
func promptTokens(req chatRequest) int64 {
	var n int64
	for _, m := range req.Messages {
		n += int64(len(strings.Fields(m.Content)))
	}
	return n
}

// completion is the part of a chat completion answer the proxy reads.
type completion struct {
	Usage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	} `json:"usage"`
}

// usage is the total tokens a successful JSON answer reports, or -1 for any other
// answer (the estimate then stands); the body is put back for the client.
func usage(resp *http.Response) (int64, error) {
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return -1, nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return -1, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var c completion
	if json.Unmarshal(body, &c) != nil || c.Usage.TotalTokens < 0 {
		return -1, nil
	}
	return c.Usage.TotalTokens, nil
}

// fakeModel answers chat completions as a model would, deterministically: a token a word
// of the prompt, and a completion of up to max_tokens, as long as the prompt words
// times 4 (a long question, a long answer).
func fakeModel() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var req chatRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req); err != nil {
			http.Error(w, "a chat completion request in JSON, please: "+err.Error(), http.StatusBadRequest)
			return
		}
		var c completion
		c.Usage.PromptTokens = promptTokens(req)
		c.Usage.CompletionTokens = min(cmp(req.MaxTokens, defaultMaxTokens), 4*c.Usage.PromptTokens)
		c.Usage.TotalTokens = c.Usage.PromptTokens + c.Usage.CompletionTokens
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"object":  "chat.completion",
			"choices": []map[string]any{{"message": map[string]string{"role": "assistant", "content": strings.Repeat("word ", int(c.Usage.CompletionTokens))}}},
			"usage":   c.Usage,
		})
	})
	return mux
}

// demo runs one client against the proxy and the fake upstream, in memory on a fake
// clock (every run prints the same), and prints what each request got.
func demo(out io.Writer) error {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	fake := httptest.NewServer(fakeModel())
	defer fake.Close()
	u, _ := url.Parse(fake.URL)
	limiter, err := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerMinute(2000), ratelimit.WithNamespace("tokens-per-minute"))
	if err != nil {
		return err
	}
	h := proxy(u, limiter)
	fmt.Fprintln(out, "2000 tokens a minute per API key; each request is admitted on its prompt's words and")
	fmt.Fprintln(out, "charged what the model used, its completion included: a key that used more than it had")
	fmt.Fprintln(out, "is in debt, and waits until it is repaid.")
	fmt.Fprintln(out)
	fmt.Fprintf(out, "%-8s %-32s %6s %9s %5s %10s %12s\n", "at", "request", "status", "estimate", "used", "remaining", "retry-after")
	for _, step := range []struct {
		at     time.Duration
		prompt string
		max    int64
	}{
		{0, strings.Repeat("tell me a story ", 25), 1000}, // 100 words: 100 + 400 used
		{time.Second, strings.Repeat("and another one ", 50), 1000},
		{2 * time.Second, strings.Repeat("more ", 200), 1000},
		{3 * time.Second, "hello there", 100},
		{30 * time.Second, "hello there", 100},
		{45 * time.Second, "hello there", 100},
	} {
		clk.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(step.at))
		body, _ := json.Marshal(map[string]any{"model": "fake", "max_tokens": step.max,
			"messages": []map[string]string{{"role": "user", "content": step.prompt}}})
		r := httptest.NewRequestWithContext(context.Background(), "POST", "/v1/chat/completions", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer key-1")
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var req chatRequest
		_ = json.Unmarshal(body, &req)
		used := w.Header().Get(usageHeader)
		if used == "" {
			used = "-"
		}
		line := fmt.Sprintf("%-8v %-32s %6d %9d %5s %10s %12s", step.at, fmt.Sprintf("%d words, max_tokens %d", promptTokens(req), step.max),
			w.Code, promptTokens(req), used, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
		fmt.Fprintln(out, strings.TrimRight(line, " "))
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "RateLimit-Policy:", policyOf(h))
	return nil
}

// policyOf is the RateLimit-Policy field of a request of h by a new key.
func policyOf(h http.Handler) string {
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"messages":[{"content":"hi"}],"max_tokens":1}`))
	r.Header.Set("Authorization", "Bearer key-2")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Header().Get("RateLimit-Policy")
}
