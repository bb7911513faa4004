package llmlimit

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// served is a gateway in front of upstream, served on a loopback port: a Gate counting
// words, 4000 tokens a minute per API key (a request that says no max_tokens estimated
// at 100 of answer) on a clock that stands still (nothing refills), and Proxy. It returns
// the token limit's limiter.
func served(t *testing.T, upstream http.Handler) (*httptest.Server, *ratelimit.AlgorithmLimiter) {
	t.Helper()
	model := httptest.NewServer(upstream)
	t.Cleanup(model.Close)
	u, _ := url.Parse(model.URL)
	return servedAt(t, u)
}

// servedAt is served's gateway in front of the upstream at u.
func servedAt(t *testing.T, u *url.URL) (*httptest.Server, *ratelimit.AlgorithmLimiter) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ps, err := Table{"": {TokensPerMinute: 4000}}.Policies(localstore.New(localstore.WithClock(clk)), Options{MaxTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	mw := &ratelimit.Middleware{Key: APIKey, KeyError: KeyError, Policies: ps, Headers: OpenAIHeaders()}
	srv := httptest.NewServer((&Gate{Tokens: Words, ReportUsage: true}).Wrap(mw.Wrap(Proxy(u))))
	t.Cleanup(srv.Close)
	return srv, ps[0].Limiter.(*ratelimit.AlgorithmLimiter)
}

// post sends body to path of srv as key, and returns the answer read whole, with its
// trailers.
func post(t *testing.T, srv *httptest.Server, path, key, body string) (*http.Response, string) {
	t.Helper()
	r, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+key)
	r.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// left is what key has left of its 4000 tokens (of its default models), once it is out
// of debt.
func left(t *testing.T, l *ratelimit.AlgorithmLimiter, key string) int64 {
	t.Helper()
	d, err := l.PeekN(context.Background(), LimitKey(key, ""), 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed {
		return -1
	}
	return d.Remaining + 1
}

// words is a prompt of n words.
func words(n int) string { return strings.TrimSpace(strings.Repeat("word ", n)) }

// TestStreamsCharged: the case a streamed completion never charged: five completions of
// 1,010 tokens each (a prompt of 202 words, 808 of answer), streamed, against 4,000
// tokens a minute. Each stream is admitted on its estimate (its prompt and max_tokens:
// 202 + 900) and charged what it reports, in either API's format: the first three are
// admitted and charged 1,010 each, which leaves 970, and the next two (estimated at
// 1,102) are refused. A client that did not ask OpenAI's stream for its
// usage gets it asked for (stream_options.include_usage), its other options kept; the
// client sees the tokens charged in a trailer.
func TestStreamsCharged(t *testing.T) {
	for _, api := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"x":1},"max_tokens":900,"messages":[{"role":"user","content":"` + words(202) + `"}]}`},
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":900,"system":"` + words(2) + `","messages":[{"role":"user","content":[{"type":"text","text":"` + words(200) + `"}]}]}`},
	} {
		t.Run(api.path, func(t *testing.T) {
			var sent []string
			model := FakeModel()
			srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				sent = append(sent, string(b))
				r.Body = io.NopCloser(bytes.NewReader(b))
				model.ServeHTTP(w, r)
			}))
			var codes []int
			for range 5 {
				resp, body := post(t, srv, api.path, "k", api.body)
				codes = append(codes, resp.StatusCode)
				if resp.StatusCode == http.StatusOK {
					if got := resp.Trailer.Get(UsageHeader); got != "1010" {
						t.Errorf("the trailer %s: %q; want 1010", UsageHeader, got)
					}
					if !strings.Contains(body, "word") {
						t.Errorf("the stream passed on: %q", body)
					}
				}
			}
			if want := []int{200, 200, 200, 429, 429}; !slices.Equal(codes, want) {
				t.Errorf("five streamed completions of 1,010 tokens at 4,000 a minute: %v; want %v", codes, want)
			}
			if got := left(t, limiter, "k"); got != 970 {
				t.Errorf("after 3,030 tokens charged of 4,000: %d left; want 970", got)
			}
			if len(sent) != 3 {
				t.Fatalf("%d requests reached the model; want 3", len(sent))
			}
			if strings.HasSuffix(api.path, "/chat/completions") && !strings.Contains(sent[0], `"stream_options":{"include_usage":true,"x":1}`) {
				t.Errorf("the model was asked %s; want stream_options with include_usage, and the client's own", sent[0])
			}
		})
	}
}

// TestStreamsCutShort: a stream the client leaves before it ends (the upstream still
// producing, its usage never reported) is charged what it produced: its prompt (or the
// input its message_start reported) and a token per delta of content streamed; the
// upstream's request is cancelled with the client's.
func TestStreamsCutShort(t *testing.T) {
	for _, api := range []struct {
		path    string
		start   string // an event before the deltas
		delta   string
		prompt  int // the prompt's words
		charged int64
	}{
		{"/v1/chat/completions", "", `{"choices":[{"index":0,"delta":{"content":"w "}}]}`, 10, 10 + 30},
		{"/v1/messages", `{"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":1}}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"w "}}`, 10, 12 + 30},
	} {
		t.Run(api.path, func(t *testing.T) {
			cancelled := make(chan struct{})
			srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				s := newSSE(w)
				if api.start != "" {
					s.data("", api.start)
				}
				for range 30 {
					s.data("", api.delta)
				}
				<-r.Context().Done() // still producing, until the proxy gives up on it
				close(cancelled)
			}))
			body := `{"stream":true,"messages":[{"content":"` + words(api.prompt) + `"}]}`
			r, _ := http.NewRequest("POST", srv.URL+api.path, strings.NewReader(body))
			r.Header.Set("Authorization", "Bearer k")
			resp, err := srv.Client().Do(r)
			if err != nil {
				t.Fatal(err)
			}
			lines := bufio.NewScanner(resp.Body)
			for seen := 0; seen < 30 && lines.Scan(); {
				if strings.Contains(lines.Text(), `"w "`) {
					seen++
				}
			}
			resp.Body.Close() // the client leaves
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("the upstream's request outlived the client's by 10s")
			}
			want := 4000 - api.charged
			deadline := time.Now().Add(10 * time.Second)
			for left(t, limiter, "k") != want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond) // the charge lands once the proxy gave up on the upstream
			}
			if got := left(t, limiter, "k"); got != want {
				t.Errorf("after a stream cut short at 30 deltas: %d left; want %d (%d charged)", got, want, api.charged)
			}
		})
	}
}

// TestStreamWithoutUsage: an upstream that streams no usage, though asked, is charged its
// prompt and a token per delta of content.
func TestStreamWithoutUsage(t *testing.T) {
	srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := newSSE(w)
		for range 50 {
			s.data("", `{"choices":[{"index":0,"delta":{"content":"w "}}]}`)
		}
		s.data("", "[DONE]")
	}))
	resp, _ := post(t, srv, "/v1/chat/completions", "k", `{"stream":true,"messages":[{"content":"`+words(5)+`"}]}`)
	if got := resp.Trailer.Get(UsageHeader); resp.StatusCode != http.StatusOK || got != "55" {
		t.Errorf("a stream of 50 deltas without usage: %d, charged %q; want 200 and 55", resp.StatusCode, got)
	}
	if got := left(t, limiter, "k"); got != 4000-55 {
		t.Errorf("%d left; want %d", got, 4000-55)
	}
}

// TestJSONCharged: a JSON answer in Anthropic's format is charged its input and output,
// its cached input included.
func TestJSONCharged(t *testing.T) {
	srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"type": "message", "usage": map[string]int64{
			"input_tokens": 7, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 3, "output_tokens": 40}})
	}))
	resp, _ := post(t, srv, "/v1/messages", "k", `{"max_tokens":50,"messages":[{"content":"one two"}]}`)
	if got := resp.Header.Get(UsageHeader); got != "150" {
		t.Errorf("%s: %q; want 150", UsageHeader, got)
	}
	if got := left(t, limiter, "k"); got != 4000-150 {
		t.Errorf("%d left; want %d", got, 4000-150)
	}
}

// TestBodyTooLarge: a request body over 1 MiB is refused with 413, whether its length is
// declared or found reading it: nothing reaches the model, nothing is charged.
func TestBodyTooLarge(t *testing.T) {
	calls := 0
	srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls++ }))
	big := `{"messages":[{"content":"` + strings.Repeat("a", DefaultMaxBody) + `"}]}`
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(big)
		if chunked {
			body = io.MultiReader(body) // no length known: read, and found too long
		}
		r, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", body)
		r.Header.Set("Authorization", "Bearer k")
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("a body of %d bytes (chunked %v): %d; want 413", len(big), chunked, resp.StatusCode)
		}
	}
	if calls != 0 || left(t, limiter, "k") != 4000 {
		t.Errorf("%d calls to the model, %d left; want none, and 4000", calls, left(t, limiter, "k"))
	}
	if resp, _ := post(t, srv, "/v1/chat/completions", "k", `{"messages":[{"content":"`+strings.Repeat("a", DefaultMaxBody-100)+`"}]}`); resp.StatusCode != http.StatusOK {
		t.Errorf("a body just under 1 MiB: %d; want 200", resp.StatusCode)
	}
}

// TestMeter: the usage of streams read in pieces of any size, plain and compressed with
// gzip, with LF, CRLF and CR line ends, events of several data lines, comments and
// unknown events, and a line too long to read; chat completions, legacy completions, the
// Responses API and Anthropic's messages.
func TestMeter(t *testing.T) {
	for _, c := range []struct {
		name, stream string
		want         Usage
	}{
		{"openai", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9,\"total_tokens\":12}}\n\ndata: [DONE]\n\n", Usage{3, 9}},
		{"crlf and comments", ": hi\r\nevent: x\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\r\n", Usage{5, 2}},
		{"data on lines", "data: {\"type\":\"message_start\",\ndata: \"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":6}}\n\n", Usage{4, 6}},
		{"anthropic cut", "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\ndata: {\"type\":\"content_block_delta\"}\n\ndata: {\"type\":\"content_block_delta\"}\n\ndata: {\"type\":\"content_block_delta\"}\n\n", Usage{4, 3}},
		{"too long a line", "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", maxLine) + "\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", Usage{5, 1}},
		{"no end", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}", Usage{5, 1}},
		{"crlf on lines", "data: {\"type\":\"message_start\",\r\ndata: \"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\r\n\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":6}}\r\n\r\n", Usage{4, 6}},
		{"bare cr", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\rdata: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5000,\"total_tokens\":5010}}\r\rdata: [DONE]\r\r", Usage{10, 5000}},
		{"completions", "data: {\"object\":\"text_completion\",\"choices\":[{\"text\":\"a\",\"index\":0}]}\n\ndata: {\"object\":\"text_completion\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5000,\"total_tokens\":5010}}\n\ndata: [DONE]\n\n", Usage{10, 5000}},
		{"completions cut", "data: {\"choices\":[{\"text\":\"a\",\"index\":0}]}\n\ndata: {\"choices\":[{\"text\":\"b\",\"index\":0}]}\n\n", Usage{5, 2}},
		{"responses", "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"usage\":null}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":5000,\"total_tokens\":5010}}}\n\n", Usage{10, 5000}},
		{"responses cut", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\" there\"}\n\n", Usage{5, 2}},
	} {
		for _, encoding := range []string{"", "gzip"} {
			body := c.stream
			if encoding == "gzip" {
				body = gzipped(c.stream)
			}
			for _, size := range []int{1, 7, 1 << 16} {
				for _, empty := range []bool{false, true} { // a read of nothing between two (io.Reader allows it)
					var got Usage
					var r io.Reader = strings.NewReader(body)
					if empty {
						r = &emptyReads{r: r}
					}
					m := NewMeter(io.NopCloser(r), encoding, true, 5, func(u Usage, known bool) { got = u })
					buf := make([]byte, size)
					for {
						if _, err := m.Read(buf); err != nil {
							break
						}
					}
					if got != c.want {
						t.Errorf("%s (%q), read %d bytes at a time (reads of nothing between: %v): %+v; want %+v", c.name, encoding, size, empty, got, c.want)
					}
				}
			}
		}
	}
}

// emptyReads reads r, with a read of nothing before each read of it.
type emptyReads struct {
	r     io.Reader
	empty bool
}

func (e *emptyReads) Read(p []byte) (int, error) {
	if e.empty = !e.empty; e.empty {
		return 0, nil
	}
	return e.r.Read(p)
}

// gzipped is s compressed with gzip.
func gzipped(s string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(s))
	zw.Close()
	return b.String()
}

// TestGzipCharged: an upstream that compresses its answers with gzip (as real APIs do
// when asked) is metered all the same, JSON and streams: usage 5,010 on a max_tokens of
// 100 is charged 5,010, not the estimate. The client gets the bytes the upstream sent,
// but for the usage chunk the gateway asked for: a stream that did not ask gets it
// decoded, without that chunk. A client that asks for a coding the meter cannot read (br)
// is answered uncompressed.
func TestGzipCharged(t *testing.T) {
	const jsonAnswer = `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":5000,"total_tokens":5010}}`
	const streamAnswer = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5000,\"total_tokens\":5010}}\n\ndata: [DONE]\n\n"
	const streamNotAsked = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
	var asked []string
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.Header.Get("Accept-Encoding"))
		body, _ := io.ReadAll(r.Body)
		answer, media := jsonAnswer, "application/json"
		if bytes.Contains(body, []byte(`"stream":true`)) {
			answer, media = streamAnswer, "text/event-stream"
		}
		w.Header().Set("Content-Type", media)
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			answer = gzipped(answer)
		}
		io.WriteString(w, answer)
	})
	for _, c := range []struct {
		name, accept, body string
		want               string // the bytes the client gets
		wantAsked          string // the Accept-Encoding the upstream got
	}{
		{"json, gzip", "gzip, deflate, br", `{"max_tokens":100,"messages":[{"content":"hi"}]}`, gzipped(jsonAnswer), "gzip"},
		{"stream, gzip", "gzip", `{"stream":true,"max_tokens":100,"messages":[{"content":"hi"}]}`, streamNotAsked, "gzip"},
		{"stream, gzip, usage asked", "gzip", `{"stream":true,"stream_options":{"include_usage":true},"max_tokens":100,"messages":[{"content":"hi"}]}`, gzipped(streamAnswer), "gzip"},
		{"json, br only", "br", `{"max_tokens":100,"messages":[{"content":"hi"}]}`, jsonAnswer, "gzip"}, // the Transport's own, decoded before the meter
		{"stream, gzip refused", "gzip;q=0, identity", `{"stream":true,"max_tokens":100,"messages":[{"content":"hi"}]}`, streamNotAsked, "gzip"},
	} {
		t.Run(c.name, func(t *testing.T) {
			asked = nil
			srv, limiter := served(t, upstream)
			r, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(c.body))
			r.Header.Set("Authorization", "Bearer k")
			r.Header.Set("Accept-Encoding", c.accept) // set by hand: the client's Transport leaves the answer as it came
			resp, err := srv.Client().Do(r)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(got) != c.want {
				t.Errorf("%d, %q; want 200 and %q", resp.StatusCode, got, c.want)
			}
			if len(asked) != 1 || asked[0] != c.wantAsked {
				t.Errorf("the upstream was asked Accept-Encoding %q; want %q", asked, c.wantAsked)
			}
			d, err := limiter.PeekN(context.Background(), LimitKey("k", ""), 1)
			if err != nil || d.Allowed || d.RetryAfter != 15165*time.Millisecond { // 1011 tokens short at 4000 a minute
				t.Errorf("after an answer of 5010 tokens: %+v, %v; want the key 1010 in debt", d, err)
			}
		})
	}
}

// TestErrorsInTheAPIsFormat: the gateway's own answers (401 without an API key, 413 for
// a body too large, 429 when a limit denies) are JSON in the format of the API the
// request was sent to, with the types its SDK reads.
func TestErrorsInTheAPIsFormat(t *testing.T) {
	model := httptest.NewServer(FakeModel())
	t.Cleanup(model.Close)
	u, _ := url.Parse(model.URL)
	ps, err := Table{"": {RequestsPerMinute: 1}}.Policies(localstore.New(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	mw := &ratelimit.Middleware{Key: APIKey, KeyError: KeyError, Denied: Denied, Policies: ps, Headers: OpenAIHeaders()}
	srv := httptest.NewServer((&Gate{MaxBody: 1000}).Wrap(mw.Wrap(Proxy(u))))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		path, key, body string
		status          int
		want            string // the error's type
	}{
		{"/v1/chat/completions", "", `{"messages":[{"content":"hi"}]}`, 401, "invalid_request_error"},
		{"/v1/messages", "", `{"messages":[{"content":"hi"}]}`, 401, "authentication_error"},
		{"/v1/chat/completions", "k", `{"messages":[{"content":"` + strings.Repeat("a", 1000) + `"}]}`, 413, "invalid_request_error"},
		{"/v1/messages", "k", `{"messages":[{"content":"` + strings.Repeat("a", 1000) + `"}]}`, 413, "request_too_large"},
		{"/v1/chat/completions", "k", `{"messages":[{"content":"hi"}]}`, 200, ""},
		{"/v1/chat/completions", "k", `{"messages":[{"content":"hi"}]}`, 429, "rate_limit_exceeded"},
		{"/v1/messages", "k", `{"messages":[{"content":"hi"}]}`, 429, "rate_limit_error"},
	} {
		r, _ := http.NewRequest("POST", srv.URL+c.path, strings.NewReader(c.body))
		if c.key != "" {
			r.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s (key %q): %d %s; want %d", c.path, c.key, resp.StatusCode, b, c.status)
			continue
		}
		if c.status == 200 {
			continue
		}
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		anthropic := strings.HasSuffix(c.path, "/messages")
		if err := json.Unmarshal(b, &e); err != nil || e.Error.Type != c.want || e.Error.Message == "" ||
			resp.Header.Get("Content-Type") != "application/json" || anthropic != (e.Type == "error") {
			t.Errorf("%s %d: %s (%s); want the API's JSON error of type %q", c.path, c.status, b, resp.Header.Get("Content-Type"), c.want)
		}
		if c.status == 429 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s 429 without Retry-After", c.path)
		}
	}
}

// TestLargeJSONCharged: a JSON answer past the 1 MiB the meter holds (embeddings of many
// inputs, 2.3 MB) is charged the usage it reports at its end, plain or gzip, and reaches
// the client whole; one cut short, or with no usage, keeps its estimate.
func TestLargeJSONCharged(t *testing.T) {
	vector := "[" + strings.TrimSuffix(strings.Repeat("0.0123456789,", 1536), ",") + "]"
	var data []string
	for i := range 120 {
		data = append(data, fmt.Sprintf(`{"object":"embedding","index":%d,"embedding":%s}`, i, vector))
	}
	answer := `{"object":"list","data":[` + strings.Join(data, ",") + `],"model":"m","usage":{"prompt_tokens":300,"total_tokens":300}}`
	for _, c := range []struct {
		name   string
		body   string // the upstream's answer
		gzip   bool
		charge int64
	}{
		{"plain", answer, false, 300},
		{"gzip", answer, true, 300},                      // 2.3 MB decoded from far less than 1 MiB
		{"cut short", answer[:len(answer)-40], false, 2}, // the input alone: embeddings have no completion
		{"no usage", strings.Replace(answer, `"usage"`, `"other"`, 1), false, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			sent := c.body
			if c.gzip {
				sent = gzipped(c.body)
			}
			srv, limiter := served(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if c.gzip {
					w.Header().Set("Content-Encoding", "gzip")
				}
				io.WriteString(w, sent)
			}))
			r, _ := http.NewRequest("POST", srv.URL+"/v1/embeddings", strings.NewReader(`{"model":"m","input":"one two"}`))
			r.Header.Set("Authorization", "Bearer k")
			resp, err := srv.Client().Do(r) // its Transport asks for gzip, and decodes it
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(got) != c.body {
				t.Errorf("%d, %d bytes; want 200 and the upstream's %d", resp.StatusCode, len(got), len(c.body))
			}
			if got := left(t, limiter, "k"); got != 4000-c.charge {
				t.Errorf("%d left; want %d", got, 4000-c.charge)
			}
		})
	}
}
