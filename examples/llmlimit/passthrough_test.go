package llmlimit

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// TestClientGetsWhatTheUpstreamSent: through a Gate, the Middleware and Proxy, with
// ReportUsage off, before a model that compresses its answers with gzip when asked, a
// client gets the very bytes the model sends it (decoded), whatever the
// gateway asked the model for: no usage chunk, no "usage": null in a chunk, no
// UsageHeader, in every API's format, streamed or not; and each answer is charged the
// tokens the model reported (the prompt's words and the completion's).
func TestClientGetsWhatTheUpstreamSent(t *testing.T) {
	const prompt, maxTokens = 5, 12 // the fake model answers min(12, 4x5) = 12 words: 17 tokens in all
	for _, c := range []struct {
		path, body string
	}{
		{"/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"a b c d e"}]}`},
		{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":12,"messages":[{"role":"user","content":"a b c d e"}]}`},
		{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{},"max_tokens":12,"messages":[{"role":"user","content":"a b c d e"}]}`},
		{"/v1/chat/completions", `{"model":"m","max_tokens":12,"messages":[{"role":"user","content":"a b c d e"}]}`},
		{"/v1/completions", `{"model":"m","stream":true,"max_tokens":12,"prompt":"a b c d e"}`},
		{"/v1/completions", `{"model":"m","max_tokens":12,"prompt":"a b c d e"}`},
		{"/v1/responses", `{"model":"m","stream":true,"max_output_tokens":12,"input":"a b c d e"}`},
		{"/v1/responses", `{"model":"m","max_output_tokens":12,"input":"a b c d e"}`},
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"a b c d e"}]}`},
		{"/v1/messages", `{"model":"m","max_tokens":12,"messages":[{"role":"user","content":"a b c d e"}]}`},
	} {
		for _, accept := range []string{"gzip", ""} {
			t.Run(c.path+" "+c.body+" "+accept, func(t *testing.T) {
				srv, limiter := passThrough(t)
				r, _ := http.NewRequest("POST", srv.URL+c.path, strings.NewReader(c.body))
				r.Header.Set("Authorization", "Bearer k")
				r.Header.Set("Content-Type", "application/json")
				if accept != "" {
					r.Header.Set("Accept-Encoding", accept) // set by hand: the answer comes as it was sent
				}
				resp, err := srv.Client().Do(r)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if resp.Header.Get("Content-Encoding") == "gzip" {
					got = []byte(gunzipped(t, got))
				}
				direct := httptest.NewRecorder() // a model of its own: the same ids
				FakeModel().ServeHTTP(direct, httptest.NewRequest("POST", c.path, strings.NewReader(c.body)))
				if resp.StatusCode != http.StatusOK || !bytes.Equal(got, direct.Body.Bytes()) {
					t.Errorf("%d, the client got\n%s\nwhere the model sends\n%s", resp.StatusCode, got, direct.Body.Bytes())
				}
				if h, tr := resp.Header.Get(UsageHeader), resp.Trailer.Get(UsageHeader); h != "" || tr != "" {
					t.Errorf("%s: header %q, trailer %q; want neither", UsageHeader, h, tr)
				}
				d, err := limiter.PeekN(context.Background(), LimitKey("k", ""), 1)
				if want := int64(4000 - prompt - maxTokens - 1); err != nil || d.Remaining != want {
					t.Errorf("after the answer: %d remaining, %v; want %d (charged %d)", d.Remaining, err, want, prompt+maxTokens)
				}
			})
		}
	}
}

// passThrough is served's gateway, with ReportUsage off, before the fake model.
func passThrough(t *testing.T) (*httptest.Server, *ratelimit.AlgorithmLimiter) {
	t.Helper()
	model := httptest.NewServer(gzipping(FakeModel()))
	t.Cleanup(model.Close)
	u, _ := url.Parse(model.URL)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ps, err := Table{"": {TokensPerMinute: 4000}}.Policies(localstore.New(localstore.WithClock(clk)), Options{MaxTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	mw := &ratelimit.Middleware{Key: APIKey, Policies: ps, Headers: OpenAIHeaders()}
	srv := httptest.NewServer((&Gate{Tokens: Words}).Wrap(mw.Wrap(Proxy(u))))
	t.Cleanup(srv.Close)
	return srv, ps[0].Limiter.(*ratelimit.AlgorithmLimiter)
}

// gunzipped is b decoded from gzip.
func gunzipped(t *testing.T, b []byte) string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	s, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return string(s)
}

// gzipping is h answering in gzip to a request that accepts it, as real APIs do, each
// flush of h's flushed through the compressor.
func gzipping(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := &gzipWriter{ResponseWriter: w, z: gzip.NewWriter(w)}
		h.ServeHTTP(zw, r)
		zw.z.Close()
	})
}

type gzipWriter struct {
	http.ResponseWriter
	z *gzip.Writer
}

func (g *gzipWriter) Write(p []byte) (int, error) { return g.z.Write(p) }

func (g *gzipWriter) Flush() {
	g.z.Flush()
	http.NewResponseController(g.ResponseWriter).Flush()
}

// TestUsageDropper: the usage chunk is taken out of a stream and the null usage out of
// every other chunk, whatever its line ends (LF, CRLF, CR) and however the bytes arrive
// (one at a time, or all at once); every other byte passes as it came, a stream cut in
// the middle of an event too.
func TestUsageDropper(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		ev := func(lines ...string) string { return strings.Join(lines, eol) + eol + eol }
		in := ": a comment" + eol + eol +
			ev(`data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}`) +
			ev("event: x", `data: {"choices":[],`, `data: "usage":{"total_tokens":5}}`) +
			ev(`data: {"choices":[],"usage":null}`) +
			ev(`data: {"choices": [], "usage": null, "id": "x"}`) + // spaced, as some servers write it
			ev("data: [DONE]") + "data: cut"
		want := ": a comment" + eol + eol +
			ev(`data: {"choices":[{"delta":{"content":"hi"}}]}`) +
			ev(`data: {"choices":[]}`) +
			ev(`data: {"choices": [], "id": "x"}`) +
			ev("data: [DONE]") + "data: cut"
		// a stream that ends in an event without its blank line: decided as the others
		endsInUsage := ev(`data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}`) + `data: {"choices":[],"usage":{"total_tokens":5}}`
		endsInChunk := `data: {"choices":[{"delta":{}}],"usage":null}`
		for _, c := range [][2]string{{in, want}, {endsInUsage, ev(`data: {"choices":[{"delta":{"content":"hi"}}]}`)},
			{endsInChunk, `data: {"choices":[{"delta":{}}]}`}} {
			for _, oneByte := range []bool{true, false} {
				var src io.Reader = strings.NewReader(c[0])
				if oneByte {
					src = iotest.OneByteReader(src)
				}
				got, err := io.ReadAll(newUsageDropper(io.NopCloser(src)))
				if err != nil || string(got) != c[1] {
					t.Errorf("line ends %q, a byte at a time %v: %q, %v; want %q", eol, oneByte, got, err, c[1])
				}
			}
		}
	}
}

// TestRequestsBurst: a fresh key of 60 requests a minute, asked every 100ms, is admitted
// 119 in its first minute by default (the minute's worth at once, then the rate: 59 more
// whole seconds), and with RequestsBurst 1 it is admitted 60 (one at once, then the rate).
func TestRequestsBurst(t *testing.T) {
	for _, c := range []struct {
		burst int64
		want  int // admitted in [0, 60s), asked 10 times a second
	}{{0, 119}, {1, 60}, {500, 119}} {
		model := httptest.NewServer(FakeModel())
		u, _ := url.Parse(model.URL)
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		clk := clock.NewFake(start)
		ps, err := Table{"": {RequestsPerMinute: 60}}.Policies(localstore.New(localstore.WithClock(clk)), Options{RequestsBurst: c.burst})
		if err != nil {
			t.Fatal(err)
		}
		h := (&Gate{Tokens: Words}).Wrap((&ratelimit.Middleware{Key: APIKey, Policies: ps}).Wrap(Proxy(u)))
		admitted := 0
		for i := range 600 { // [0, 60s)
			clk.Set(start.Add(time.Duration(i) * 100 * time.Millisecond))
			w := httptest.NewRecorder()
			r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"max_tokens":1,"messages":[{"content":"hi"}]}`))
			r.Header.Set("Authorization", "Bearer k")
			h.ServeHTTP(w, r)
			if w.Code == http.StatusOK {
				admitted++
			}
		}
		model.Close()
		if admitted != c.want {
			t.Errorf("RequestsBurst %d: %d admitted in the first minute; want %d", c.burst, admitted, c.want)
		}
	}
	if _, err := (Table{"": {RequestsPerMinute: 60}}).Policies(localstore.New(), Options{RequestsBurst: -1}); err == nil {
		t.Error("a RequestsBurst of -1: no error")
	}
}

// TestEndpoints: a Gate serves only the requests whose tokens it meters, and the model
// lists: an embedding is charged its usage; a GET of the models passes, charged nothing;
// audio, a batch, a token count, a DELETE, a thread's messages and a path an upstream may
// resolve elsewhere ("/v1/models/../files") get 404 in the API's format, and never reach
// the upstream.
func TestEndpoints(t *testing.T) {
	var reached []string
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = append(reached, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/embeddings") {
			io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"m","usage":{"prompt_tokens":8,"total_tokens":8}}`)
			return
		}
		io.WriteString(w, `{"object":"list","data":[]}`)
	})
	srv, limiter := served(t, upstream)
	for _, c := range []struct {
		method, path string
		status       int
		anthropic    bool
		charged      int64 // in all, after the request
	}{
		{"POST", "/v1/embeddings", 200, false, 8},
		{"GET", "/v1/models", 200, false, 8},
		{"GET", "/v1/models/gpt-4o", 200, false, 8},
		{"POST", "/v1/audio/transcriptions", 404, false, 8},
		{"POST", "/v1/batches", 404, false, 8},
		{"POST", "/v1/messages/count_tokens", 404, true, 8},
		{"DELETE", "/v1/chat/completions", 404, false, 8},
		{"GET", "/v1/models/../files/file-abc/content", 404, false, 8}, // an upstream resolves it to a file
		{"HEAD", "/v1/models/../batches", 404, false, 8},
		{"GET", "/v1/models/%2e%2e/files/file-abc/content", 404, false, 8},
		{"GET", "/v1//models", 404, false, 8},
		{"POST", "/v1/threads/thread_1/messages", 404, false, 8}, // an assistant's, not Anthropic's
	} {
		reached = nil
		var sent io.Reader = strings.NewReader(`{"model":"m","input":"a b c"}`)
		if c.method == "GET" || c.method == "HEAD" {
			sent = nil
		}
		r, _ := http.NewRequest(c.method, srv.URL+c.path, sent)
		r.Header.Set("Authorization", "Bearer k")
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s %s: %d %s; want %d", c.method, c.path, resp.StatusCode, body, c.status)
		}
		if c.status == 404 {
			want := `"type":"invalid_request_error"`
			if c.anthropic {
				want = `"type":"error"`
			}
			if c.method == "HEAD" {
				want = "" // no body
			}
			if !strings.Contains(string(body), want) || len(reached) != 0 {
				t.Errorf("%s %s: %s, the upstream reached %q; want the API's error (%s), and nothing reached", c.method, c.path, body, reached, want)
			}
		}
		d, err := limiter.PeekN(context.Background(), LimitKey("k", ""), 1)
		if want := 4000 - c.charged - 1; err != nil || d.Remaining != want {
			t.Errorf("after %s %s: %d remaining, %v; want %d", c.method, c.path, d.Remaining, err, want)
		}
	}
}

// TestUnreadableBodiesRefused: a body the Gate reads otherwise than an upstream would is
// refused with 400, never forwarded with its tokens unseen: a byte-order mark, a field
// the Gate reads spelled in another case (encoding/json takes "Stream" for "stream", and
// the last one wins), or folded as Unicode folds it ("ſtream" with a long s, in
// stream_options too), or twice (encoding/json merged two stream_options an upstream
// read the last of: its usage went unasked); a stream flag not a boolean (a lenient
// upstream reads 1 or "yes" as true); a background response, whose usage comes after
// the answer. A stream to any path of completions asks for its usage, and is charged it.
func TestUnreadableBodiesRefused(t *testing.T) {
	reached := 0
	srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		if bytes.Contains(body, []byte(`"include_usage":true`)) {
			io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":200,\"completion_tokens\":50,\"total_tokens\":250}}\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	for _, body := range []string{
		"\ufeff" + `{"stream":true,"messages":[{"content":"a b"}]}`,
		`{"stream":true,"messages":[{"content":"a b"}],"Stream":false}`,
		`{"stream":true,"messages":[],"Messages":[{"content":"a b"}]}`,
		`{"stream":true,"ſtream":false,"messages":[{"content":"a b"}],"meſſageſ":[]}`,
		`{"stream":true,"stream_options":{"include_uſage":true},"messages":[{"content":"a b"}]}`,
		`{"stream":true,"stream_options":{"Include_Usage":true},"messages":[{"content":"a b"}]}`,
		`{"stream":true,"Key":1,"max_toKens":5,"messages":[{"content":"a b"}]}`,
		`{"background":true,"input":"a b"}`,
		`{"stream":true,"stream_options":{"include_usage":true},"stream_options":{},"messages":[{"content":"a b"}]}`,
		`{"stream":true,"stream_options":{"Include_usage":true},"stream_options":{},"messages":[{"content":"a b"}]}`,
		`{"stream":false,"stream":true,"messages":[{"content":"a b"}]}`,
		`{"stream":1,"messages":[{"content":"a b"}]}`,
		`{"stream":"yes","messages":[{"content":"a b"}]}`,
		`{"stream":true,"stream_options":{"include_usage":1},"messages":[{"content":"a b"}]}`,
		`{"messages":[{"role":"user","content":"a b","Content":"x"}]}`,
		`{"messages":[{"role":"user","content":"a b","content":"x"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a b","TEXT":"x"}]}]}`,
		`{"input":[{"role":"user","CONTENT":"x","content":"a b"}]}`,
		`{"system":[{"type":"text","Text":"a b"}],"messages":[]}`,
		`[1, 2]`,
	} {
		resp, got := post(t, srv, "/v1/chat/completions", "k", body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, "invalid_request_error") {
			t.Errorf("%q: %d %s; want 400 in the API's format", body, resp.StatusCode, got)
		}
	}
	if reached != 0 || left(t, limiter, "k") != 4000 {
		t.Errorf("the upstream reached %d times, %d left; want none, and nothing charged", reached, left(t, limiter, "k"))
	}
	charged := int64(0)
	for _, path := range []string{"/v1/chat/completions/", "/openai/deployments/d/completions"} {
		before := left(t, limiter, "k")
		resp, _ := post(t, srv, path, "k", `{"stream":true,"max_tokens":100,"prompt":"a b"}`)
		charged = before - left(t, limiter, "k")
		if resp.StatusCode != http.StatusOK || charged != 250 {
			t.Errorf("%s: %d, charged %d; want 200, and the 250 the stream reported", path, resp.StatusCode, charged)
		}
	}
}

// TestTwoAPIKeys: a request that names two different keys, wherever it names them, is
// refused with 401: the limits would count one while the upstream bills the other (ten
// requests on one bearer key, each with an X-Api-Key of its own, were all admitted past
// a limit of three). A bearer's scheme is read in any case and its spaces trimmed, as an
// upstream reads it. The same key in several places is that key.
func TestTwoAPIKeys(t *testing.T) {
	srv, limiter := served(t, FakeModel())
	send := func(path string, h http.Header) int {
		r, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"a b c"}]}`))
		r.Header = h
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path string
		h    http.Header
	}{
		{"/v1/chat/completions", http.Header{"Authorization": {"Bearer sk-real"}, "X-Api-Key": {"junk-1"}}},
		{"/v1/chat/completions", http.Header{"Authorization": {"bearer sk-real"}, "X-Api-Key": {"junk-2"}}},
		{"/v1/chat/completions", http.Header{"Authorization": {"BEARER\tsk-real"}, "X-Api-Key": {"junk-3"}}},
		{"/v1/chat/completions", http.Header{"Authorization": {"Bearer sk-real", "Bearer junk-4"}}},
		{"/v1/chat/completions", http.Header{"X-Api-Key": {"", "junk-5"}, "Authorization": {"Bearer sk-real"}}},
		{"/openai/deployments/d/chat/completions", http.Header{"Api-Key": {"azure-real"}, "X-Api-Key": {"junk-6"}}},
		{"/v1beta/openai/chat/completions?key=google-real", http.Header{"X-Api-Key": {"junk-7"}}},
		{"/v1/chat/completions", http.Header{"Authorization": {"Bearer sk-real extra"}}},
	} {
		if got := send(c.path, c.h); got != http.StatusUnauthorized {
			t.Errorf("%s %v: %d; want 401", c.path, c.h, got)
		}
	}
	if left(t, limiter, "sk-real") != 4000 {
		t.Errorf("%d left of sk-real; want nothing charged", left(t, limiter, "sk-real"))
	}
	for i, h := range []http.Header{
		{"Authorization": {"Bearer sk-real"}, "X-Api-Key": {"sk-real"}},
		{"Authorization": {"bearer   sk-real "}},
		{"Api-Key": {"sk-real"}},
	} {
		if got := send("/v1/chat/completions", h); got != http.StatusOK || left(t, limiter, "sk-real") != 4000-13*int64(i+1) {
			t.Errorf("%v: %d, %d left; want 200, and sk-real charged 13 more", h, got, left(t, limiter, "sk-real"))
		}
	}
}

// TestUpstreamErrorsCostNothing: an answer of 400 or more from the upstream, a
// redirect, an answer of no content, or no answer at all (502 in the API's format) costs
// no tokens, as the providers bill none (a 429 from the upstream cost its estimate, 103);
// embeddings are estimated on their input alone (with a max_tokens default of 4,096 a
// key of fewer tokens a minute could never embed).
func TestUpstreamErrorsCostNothing(t *testing.T) {
	for _, status := range []int{400, 429, 500, 503, 302, 204} {
		srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, `{"error":{"message":"no","type":"server_error","code":null}}`)
		}))
		if resp, _ := post(t, srv, "/v1/chat/completions", "k", `{"model":"m","max_tokens":100,"messages":[{"content":"a b c"}]}`); resp.StatusCode != status || left(t, limiter, "k") != 4000 {
			t.Errorf("the upstream's %d: %d, %d left; want it passed on, and 4000 left", status, resp.StatusCode, left(t, limiter, "k"))
		}
	}
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // nothing listens there: connection refused
	u, _ := url.Parse(down.URL)
	gw, gwLimiter := servedAt(t, u)
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		resp, got := post(t, gw, path, "k", `{"model":"m","max_tokens":100,"messages":[{"content":"a b c"}]}`)
		if left := left(t, gwLimiter, "k"); resp.StatusCode != http.StatusBadGateway ||
			resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(got, `"error"`) || left != 4000 {
			t.Errorf("%s, the upstream down: %d %s %s, %d left; want 502 in the API's JSON, nothing charged", path, resp.StatusCode, resp.Header.Get("Content-Type"), got, left)
		}
	}
	srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[]}`) // no usage: the estimate stands
	}))
	if resp, _ := post(t, srv, "/v1/embeddings", "k", `{"model":"m","input":"a b"}`); resp.StatusCode != http.StatusOK || left(t, limiter, "k") != 4000-2 {
		t.Errorf("embeddings of 2 words without usage: %d, %d left; want 200, charged 2", resp.StatusCode, left(t, limiter, "k"))
	}
}

// TestIdentityStream: a stream whose upstream says Content-Encoding: identity (no coding)
// reaches the client without the usage the gateway asked for, as a plain one does: the
// client got a "usage": null in every chunk and the usage chunk.
func TestIdentityStream(t *testing.T) {
	srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "identity")
		FakeModel().ServeHTTP(w, r)
	}))
	body := `{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"a b"}]}`
	resp, got := post(t, srv, "/v1/chat/completions", "k", body)
	direct := httptest.NewRecorder()
	FakeModel().ServeHTTP(direct, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body)))
	if resp.StatusCode != http.StatusOK || got != direct.Body.String() {
		t.Errorf("the client got\n%s\nwhere the model sends\n%s", got, direct.Body.String())
	}
	if left(t, limiter, "k") != 4000-2-3 {
		t.Errorf("%d left; want 3995, charged the 5 the stream reported", left(t, limiter, "k"))
	}
}

// TestLineEndsThroughProxy: each API's stream, its lines ended by LF, CRLF or a bare CR
// (all three allowed by the SSE specification), sent three bytes at a time, plain or
// gzip, through a Gate, the Middleware and Proxy: charged exactly the usage it reports,
// and the client gets what the upstream sent (less the usage the gateway asked for).
func TestLineEndsThroughProxy(t *testing.T) {
	type api struct {
		path, body string
		events     []string // as the upstream sends them, with "\n" between lines of one event
		addedUsage string   // the usage event the gateway asked for (chat/completions), "" for none
		charge     int64
	}
	apis := []api{
		{"/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":100,"messages":[{"content":"a b"}]}`,
			[]string{`data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}`, `data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`},
			`data: {"id":"c","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":50,"total_tokens":60}}`, 60},
		{"/v1/completions", `{"model":"m","stream":true,"max_tokens":100,"prompt":"a b"}`,
			[]string{`data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":null}],"usage":null}`},
			`data: {"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":50,"total_tokens":60}}`, 60},
		{"/v1/responses", `{"model":"m","stream":true,"max_output_tokens":100,"input":"a b"}`,
			[]string{"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}",
				"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}",
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":50,\"total_tokens\":60}}}"}, "", 60},
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":100,"messages":[{"content":"a b"}]}`,
			[]string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[],\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}",
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}",
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":50}}",
				"event: message_stop\ndata: {\"type\":\"message_stop\"}"}, "", 60},
	}
	join := func(evs []string, eol string) string {
		var b strings.Builder
		for _, e := range evs {
			b.WriteString(strings.ReplaceAll(e, "\n", eol) + eol + eol)
		}
		return b.String()
	}
	for _, a := range apis {
		for _, eol := range []string{"\n", "\r\n", "\r"} {
			for _, gz := range []bool{false, true} {
				name := fmt.Sprintf("%s %q gzip=%v", a.path, eol, gz)
				t.Run(name, func(t *testing.T) {
					evs := a.events
					if a.addedUsage != "" {
						evs = append(append([]string{}, evs...), a.addedUsage)
					}
					sent := join(evs, eol) + "data: [DONE]" + eol + eol
					srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						w.Header().Set("Content-Type", "text/event-stream")
						var out io.Writer = w
						var zw *gzipWriter
						if gz {
							w.Header().Set("Content-Encoding", "gzip")
							zw = &gzipWriter{ResponseWriter: w, z: gzip.NewWriter(w)}
							out = zw
						}
						rc := http.NewResponseController(w)
						for i := 0; i < len(sent); i += 3 {
							io.WriteString(out, sent[i:min(i+3, len(sent))])
							if zw != nil {
								zw.Flush()
							} else {
								rc.Flush()
							}
						}
						if zw != nil {
							zw.z.Close()
						}
					}))
					r, _ := http.NewRequest("POST", srv.URL+a.path, strings.NewReader(a.body))
					r.Header.Set("Authorization", "Bearer k")
					if gz {
						r.Header.Set("Accept-Encoding", "gzip")
					}
					resp, err := srv.Client().Do(r)
					if err != nil {
						t.Fatal(err)
					}
					got, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.Header.Get("Content-Encoding") == "gzip" {
						got = []byte(gunzipped(t, got))
					}
					want := sent
					if a.addedUsage != "" { // what the client would have got had it not been asked
						want = strings.ReplaceAll(join(a.events, eol), `,"usage":null`, "") + "data: [DONE]" + eol + eol
					}
					if string(got) != want {
						t.Errorf("the client got %q\nwant %q", got, want)
					}
					if charged := 4000 - left(t, limiter, "k"); charged != a.charge {
						t.Errorf("charged %d; want %d", charged, a.charge)
					}
				})
			}
		}
	}
}

// TestUpstreamHeadersAndCodings: the upstream's own rate-limit headers are taken out
// (the client read "60, 10000", the gateway's and the upstream's); a list of codings
// with identity in it is read as the codings left ("identity, gzip" was charged the
// estimate, and the client got the usage chunk); and an answer's usage is charged whole,
// far past the request's estimate and ten times the minute's budget (a prompt the
// estimate cannot read was charged 40,000 of 100,001).
func TestUpstreamHeadersAndCodings(t *testing.T) {
	body := `{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"a b"}]}`
	for _, coding := range [][]string{{"identity, gzip"}, {"gzip, identity"}, {"identity", "gzip"}} {
		srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Encoding"] = coding
			w.Header().Set("X-Ratelimit-Limit-Requests", "10000")
			w.Header().Set("Anthropic-Ratelimit-Tokens-Limit", "5")
			z := &gzipWriter{ResponseWriter: w, z: gzip.NewWriter(w)}
			FakeModel().ServeHTTP(z, r)
			z.z.Close()
		}))
		r, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer k")
		r.Header.Set("Accept-Encoding", "gzip")
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		direct := httptest.NewRecorder()
		FakeModel().ServeHTTP(direct, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body)))
		if string(got) != direct.Body.String() || left(t, limiter, "k") != 4000-2-3 {
			t.Errorf("%q: the client got\n%s\nwant\n%s\n%d left; want 3995", coding, got, direct.Body.String(), left(t, limiter, "k"))
		}
		if v := resp.Header.Values("X-Ratelimit-Limit-Requests"); len(v) > 1 || resp.Header.Get("Anthropic-Ratelimit-Tokens-Limit") != "" {
			t.Errorf("%q: the upstream's rate-limit headers reached the client: %v", coding, resp.Header)
		}
	}
	srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":100000,"completion_tokens":1,"total_tokens":100001}}`)
	}))
	post(t, srv, "/v1/chat/completions", "k", `{"model":"m","max_tokens":1,"messages":[{"content":"a"}]}`)
	d, err := limiter.PeekN(context.Background(), LimitKey("k", ""), 1)
	// a debt of 96,001 at 4,000 a minute: 24 minutes and a fraction until one token
	if want := time.Duration(96_002) * time.Minute / 4000; err != nil || d.Allowed || d.RetryAfter < want-time.Second || d.RetryAfter > want+time.Second {
		t.Errorf("after 100,001 tokens of a 4,000 a minute budget: %+v, %v; want denied for %v", d, err, want)
	}
}

// TestRequestsAsTheUpstreamReadsThem: a request that would reach the upstream otherwise
// than the Gate read it is refused, in the API's format, and reaches nothing: a method
// override, a body in a coding, a GET with a body, a query with ';' (dropped by Go, read
// by some upstreams as a key). A request's trailer never reaches the upstream, nor an
// upgrade it offers (a 101 opened a tunnel of requests the gateway never saw). A request
// for n completions is estimated at n times its max_tokens.
func TestRequestsAsTheUpstreamReadsThem(t *testing.T) {
	var reached []*http.Request
	srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		reached = append(reached, r)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[]}`) // no usage: the estimate stands
	}))
	body := `{"model":"m","max_tokens":10,"messages":[{"content":"a b c"}]}`
	for _, c := range []struct {
		method, path string
		h            http.Header
		status       int
	}{
		{"POST", "/v1/chat/completions", http.Header{"X-Http-Method-Override": {"PUT"}}, 400},
		{"GET", "/v1/models/gemini:generateContent", http.Header{"X-Http-Method-Override": {"POST"}}, 400},
		{"POST", "/v1/chat/completions", http.Header{"Content-Encoding": {"br"}}, 400},
		{"POST", "/v1/chat/completions?x=1;key=B", nil, 401},
	} {
		r, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(body))
		for k, v := range c.h {
			r.Header[k] = v
		}
		r.Header.Set("Authorization", "Bearer k")
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(got), `"error"`) {
			t.Errorf("%s %s %v: %d %s; want %d in the API's format", c.method, c.path, c.h, resp.StatusCode, got, c.status)
		}
	}
	if len(reached) != 0 || left(t, limiter, "k") != 4000 {
		t.Errorf("%d reached the upstream, %d left; want none, nothing charged", len(reached), left(t, limiter, "k"))
	}
	r, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", io.MultiReader(strings.NewReader(body))) // chunked: a trailer may follow
	r.Header.Set("Authorization", "Bearer k")
	r.Trailer = http.Header{"X-Api-Key": {"B"}}
	resp, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(reached) != 1 || len(reached[0].Trailer) != 0 || left(t, limiter, "k") != 4000-3-10 {
		t.Errorf("a request with a trailer: %d reached, trailer %v, %d left; want it without its trailer, charged 13", len(reached), reached[0].Trailer, left(t, limiter, "k"))
	}
	r, _ = http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer u")
	r.Header.Set("Connection", "Upgrade, HTTP2-Settings")
	r.Header.Set("Upgrade", "h2c") // an offer (curl --http2), declined
	if resp, err = srv.Client().Do(r); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if up := reached[len(reached)-1]; resp.StatusCode != http.StatusOK || up.Header.Get("Upgrade") != "" {
		t.Errorf("an upgrade offered: %d, the upstream saw Upgrade %q; want 200, and no upgrade asked of it", resp.StatusCode, up.Header.Get("Upgrade"))
	}
	post(t, srv, "/v1/chat/completions", "n", `{"model":"m","max_tokens":10,"n":8,"messages":[{"content":"a b c"}]}`)
	if left(t, limiter, "n") != 4000-3-80 {
		t.Errorf("n 8 of max_tokens 10: %d left; want 3917, charged its estimate of 83", left(t, limiter, "n"))
	}
}

// TestAnswersAsTheUpstreamSentThem: a client that leaves before the answer is charged
// the estimate (it was charged nothing, though the upstream read its whole prompt); a
// 103 Early Hints of the upstream is not passed on (it carried the gateway's headers
// with the upstream's, and the final answer none); the upstream's rate-limit trailers
// are taken out, and its other headers kept.
func TestAnswersAsTheUpstreamSentThem(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		switch r.Header.Get("User-Agent") {
		case "leaves":
			once.Do(func() { close(arrived) })
			<-release
		case "hints":
			w.Header().Set("Link", "</x>; rel=preload")
			w.Header().Set("X-Ratelimit-Limit-Tokens", "999")
			w.WriteHeader(http.StatusEarlyHints)
		}
		w.Header().Set("Ratelimit-Bucket-Id", "abc")
		w.Header().Set("Trailer", "X-Ratelimit-Remaining-Tokens")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`)
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "12345")
	}))
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	r, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":10,"messages":[{"content":"a b c"}]}`))
	r.Header.Set("Authorization", "Bearer k")
	r.Header.Set("User-Agent", "leaves")
	go func() { // the client leaves once the upstream has its request: a client that left
		// before the request went upstream used nothing, and is charged nothing
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
		}
		cancel()
	}()
	if resp, err := srv.Client().Do(r); err == nil {
		resp.Body.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if d, _ := limiter.PeekN(context.Background(), LimitKey("k", ""), 1); d.Remaining+1 == 4000-13 {
			break
		}
	}
	if got := left(t, limiter, "k"); got != 4000-13 {
		t.Errorf("a client that left before the answer: %d left; want 3987, charged its estimate", got)
	}
	r, _ = http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":10,"messages":[{"content":"a b c"}]}`))
	r.Header.Set("Authorization", "Bearer h")
	r.Header.Set("User-Agent", "hints")
	resp, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if v := resp.Header.Values("X-Ratelimit-Limit-Tokens"); resp.StatusCode != 200 || len(v) != 1 || v[0] != "4000" || resp.Header.Get("Ratelimit-Bucket-Id") != "abc" {
		t.Errorf("after a 103: %d, X-Ratelimit-Limit-Tokens %v, Ratelimit-Bucket-Id %q; want 200, the gateway's 4000 alone, and abc", resp.StatusCode, v, resp.Header.Get("Ratelimit-Bucket-Id"))
	}
	if v := resp.Trailer.Values("X-Ratelimit-Remaining-Tokens"); slices.Contains(v, "12345") {
		t.Errorf("the upstream's rate-limit trailer reached the client: %v", resp.Trailer)
	}
}

// TestNeverSentCostsNothing: a request the upstream never got costs nothing, whether no
// connection was made or its TLS handshake failed (an untrusted certificate cost every
// request its estimate); an empty gzip stream is an empty answer, not a 502; and an
// Azure path is limited as the deployment it names, which Azure bills whatever the
// body's model says.
func TestNeverSentCostsNothing(t *testing.T) {
	hit := 0
	tlsUp := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit++ }))
	defer tlsUp.Close()
	u, _ := url.Parse(tlsUp.URL)
	gw, gwLimiter := servedAt(t, u)
	resp, _ := post(t, gw, "/v1/chat/completions", "k", `{"model":"m","max_tokens":100,"messages":[{"content":"a b c"}]}`)
	if left := left(t, gwLimiter, "k"); resp.StatusCode != http.StatusBadGateway || hit != 0 || left != 4000 {
		t.Errorf("an upstream whose certificate is not trusted: %d, %d requests reached it, %d left; want 502, none, nothing charged", resp.StatusCode, hit, left)
	}
	srv, _ := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "gzip")
	}))
	if resp, got := post(t, srv, "/v1/chat/completions", "e", `{"model":"m","stream":true,"max_tokens":10,"messages":[{"content":"a b"}]}`); resp.StatusCode != http.StatusOK || got != "" {
		t.Errorf("an empty gzip stream: %d %q; want 200 and nothing", resp.StatusCode, got)
	}
	model := httptest.NewServer(FakeModel())
	defer model.Close()
	mu, _ := url.Parse(model.URL)
	ps, err := Table{"gpt-4o": {RequestsPerMinute: 1}, "gpt-4o-mini": {RequestsPerMinute: 1000}}.Policies(localstore.New(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	mw := &ratelimit.Middleware{Key: APIKey, KeyError: KeyError, Policies: ps, Denied: Denied}
	az := httptest.NewServer((&Gate{Tokens: Words}).Wrap(mw.Wrap(http.StripPrefix("/openai/deployments/gpt-4o", Proxy(mu)))))
	defer az.Close()
	admitted := 0
	for _, body := range []string{`{"model":"gpt-4o-mini","messages":[{"content":"a"}]}`, `{"messages":[{"content":"a"}]}`, `{"model":"gpt-4o-mini","messages":[{"content":"a"}]}`} {
		r, _ := http.NewRequest("POST", az.URL+"/openai/deployments/gpt-4o/v1/chat/completions?api-version=2024-10-21", strings.NewReader(body))
		r.Header.Set("Api-Key", "k")
		resp, err := az.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			admitted++
		}
	}
	if admitted != 1 {
		t.Errorf("three requests to the deployment gpt-4o of 1 a minute: %d admitted; want 1, whatever their bodies' model", admitted)
	}
}
