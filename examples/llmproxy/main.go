// Llmproxy is a proxy in front of a language model's API, limited in tokens a minute per
// API key: a request is admitted on an estimate (the words of its prompt, the part known
// before the answer), passed to the upstream, and charged the tokens the upstream says
// it used, completion included, once the answer is done. A key that used more than it
// had left is in debt: its next requests are answered 429, with the exact Retry-After,
// until the debt is repaid.
//
//	go run ./examples/llmproxy          # a demo: a built-in fake upstream, one client, printed
//	go run ./examples/llmproxy -serve   # serve on :8081 in front of the fake (or -upstream URL)
//
// It speaks both APIs' formats, OpenAI's chat completions and Anthropic's messages, as
// JSON and as streams (Server-Sent Events), and reads the usage each reports: a JSON
// answer's usage, OpenAI's last chunk of a stream (the proxy asks for it, with
// stream_options.include_usage, when the client did not), Anthropic's message_start and
// message_delta. A stream that reports no usage, or is cut short (the client left, the
// upstream failed), is charged what it produced: a token per delta of content, after its
// input. The client sees the tokens charged in X-Usage-Total-Tokens: a header of a JSON
// answer, a trailer of a stream. A request body over 1 MiB is refused with 413, before
// anything is charged. The built-in fake upstream answers in both formats, streamed or
// not.
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
	"mime"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// usageHeader carries the tokens a completion used, from the proxy to the limiter.
const usageHeader = "X-Usage-Total-Tokens"

// maxBody bounds the request bodies the proxy takes (a larger one is refused with 413),
// and the JSON answers it reads for their usage.
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

// proxy is the limited reverse proxy to upstream: a gate that reads the request (and
// refuses one too large), the limiter's Middleware, and the reverse proxy, whose answers
// a meter reads for their usage as they pass.
func proxy(upstream *url.URL, limiter *tokenbucket.Limiter) http.Handler {
	rp := httputil.NewSingleHostReverseProxy(upstream)
	rp.ModifyResponse = func(resp *http.Response) error {
		x := exchangeOf(resp.Request)
		if x == nil || resp.StatusCode != http.StatusOK {
			return nil // a failed answer: the estimate stands
		}
		media, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		switch media {
		case "text/event-stream": // read as it streams; the tokens in a trailer at its end
			if resp.Trailer == nil {
				resp.Trailer = http.Header{}
			}
			resp.Trailer[usageHeader] = nil // announced: the reverse proxy sends it after the body
			resp.Body = newMeter(resp.Body, true, x.prompt, func(u Usage, known bool) {
				x.settle(u, known)
				if known {
					resp.Trailer.Set(usageHeader, strconv.FormatInt(u.Total(), 10))
				}
			})
		case "application/json": // read whole, for the tokens in a header
			m := newMeter(resp.Body, false, x.prompt, x.settle)
			body, err := io.ReadAll(io.LimitReader(m, maxBody+1))
			if err != nil {
				m.Close()
				return err
			}
			if len(body) > maxBody { // too large to read whole: passed on, and its usage unread (the estimate stands)
				resp.Body = struct {
					io.Reader
					io.Closer
				}{io.MultiReader(bytes.NewReader(body), m), m}
				return nil
			}
			m.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			if u, known := x.result(); known {
				resp.Header.Set(usageHeader, strconv.FormatInt(u.Total(), 10))
			}
		}
		return nil
	}
	mw := &ratelimit.Middleware{
		Limiter: limiter,
		Key:     apiKey,
		KeyError: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		},
		Cost:       &ratelimit.Cost{Estimate: estimate, Actual: actual, Unit: "tokens"},
		PolicyName: func(*http.Request) string { return "tokens-per-minute" },
	}
	return gate(mw.Wrap(recoverAbort(rp)))
}

// exchange is what the proxy knows of one request: its estimate, and what its answer
// cost once the meter read it.
type exchange struct {
	prompt int64
	mu     sync.Mutex
	usage  Usage
	known  bool
	abort  bool // the answer was cut short: the connection is aborted once it is charged
}

func (x *exchange) settle(u Usage, known bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.usage, x.known = u, known
}

func (x *exchange) result() (Usage, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.usage, x.known
}

type exchangeKey struct{}

// exchangeOf is r's exchange, nil for a request that did not pass the gate.
func exchangeOf(r *http.Request) *exchange {
	x, _ := r.Context().Value(exchangeKey{}).(*exchange)
	return x
}

// gate reads a request's body (up to maxBody: more is refused with 413, and nothing is
// charged), asks a stream in OpenAI's format for its usage, and puts the request's
// exchange in its context, for the estimate and the meter. A stream cut short is charged
// what it produced, then its connection aborted, as the reverse proxy asked.
func gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > maxBody {
			http.Error(w, fmt.Sprintf("a request body of %d bytes: at most %d", r.ContentLength, maxBody), http.StatusRequestEntityTooLarge)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil {
			http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(body) > maxBody {
			http.Error(w, fmt.Sprintf("a request body over %d bytes", maxBody), http.StatusRequestEntityTooLarge)
			return
		}
		req, body := readRequest(r.URL.Path, body)
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		x := &exchange{prompt: promptTokens(req)}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x)))
		if x.abort {
			panic(http.ErrAbortHandler)
		}
	})
}

// recoverAbort takes the reverse proxy's abort of an answer cut short (http.ErrAbortHandler)
// as the end of the answer, so that the Middleware charges what it cost; the gate aborts
// the connection after.
func recoverAbort(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				x := exchangeOf(r)
				if v != http.ErrAbortHandler || x == nil {
					panic(v)
				}
				x.abort = true
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// apiKey is the request's bearer token, or Anthropic's x-api-key.
func apiKey(r *http.Request) (string, error) {
	if key := r.Header.Get("X-Api-Key"); key != "" {
		return key, nil
	}
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || key == "" {
		return "", errors.New("an API key is required: Authorization: Bearer <key>, or X-Api-Key")
	}
	return key, nil
}

// estimate is what a request is admitted on: its prompt's words (about its tokens), the
// part of its cost known before the answer; a key with that much left is admitted, and
// the completion is charged after, in debt if need be. (Admitting on the prompt and
// max_tokens instead never leaves a key in debt, and refuses a long answer a key could
// have afforded.)
func estimate(r *http.Request) int64 {
	if x := exchangeOf(r); x != nil {
		return max(1, x.prompt)
	}
	return 1
}

// actual is what the answer cost, as its meter read it; -1 (the estimate stands) for an
// answer that said nothing of it (a failure, a format the proxy does not read).
func actual(r *http.Request, _ ratelimit.Answer) int64 {
	if x := exchangeOf(r); x != nil {
		if u, known := x.result(); known {
			return u.Total()
		}
	}
	return -1
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
	fmt.Fprintf(out, "%-8s %-36s %6s %9s %5s %10s %12s\n", "at", "request", "status", "estimate", "used", "remaining", "retry-after")
	for _, step := range []struct {
		at     time.Duration
		prompt string
		max    int64
		stream bool
	}{
		{0, strings.Repeat("tell me a story ", 25), 1000, false}, // 100 words: 100 + 400 used
		{time.Second, strings.Repeat("and another one ", 50), 1000, false},
		{2 * time.Second, strings.Repeat("more ", 200), 1000, false},
		{3 * time.Second, "hello there", 100, false},
		{30 * time.Second, "hello there", 100, false},
		{45 * time.Second, "hello there", 100, false},
		{50 * time.Second, strings.Repeat("go on ", 50), 500, true}, // streamed, charged all the same
		{51 * time.Second, "hello there", 100, false},
	} {
		clk.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(step.at))
		body, _ := json.Marshal(map[string]any{"model": "fake", "max_tokens": step.max, "stream": step.stream,
			"messages": []map[string]string{{"role": "user", "content": step.prompt}}})
		r := httptest.NewRequestWithContext(context.Background(), "POST", "/v1/chat/completions", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer key-1")
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var req modelRequest
		_ = json.Unmarshal(body, &req)
		used := w.Header().Get(usageHeader)
		if used == "" {
			used = "-"
		}
		line := fmt.Sprintf("%-8v %-36s %6d %9d %5s %10s %12s", step.at, describe(req),
			w.Code, promptTokens(req), used, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
		fmt.Fprintln(out, strings.TrimRight(line, " "))
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "RateLimit-Policy:", policyOf(h))
	return nil
}

// describe is a request of the demo, in a few words.
func describe(req modelRequest) string {
	s := fmt.Sprintf("%d words, max_tokens %d", promptTokens(req), req.maxTokens())
	if req.Stream {
		s += ", streamed"
	}
	return s
}

// policyOf is the RateLimit-Policy field of a request of h by a new key.
func policyOf(h http.Handler) string {
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"messages":[{"content":"hi"}],"max_tokens":1}`))
	r.Header.Set("Authorization", "Bearer key-2")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Header().Get("RateLimit-Policy")
}
