package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRun drives a server that denies every third request and checks the counts.
func TestRun(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") == "" {
			w.WriteHeader(401)
			return
		}
		if n.Add(1)%3 == 0 {
			w.WriteHeader(429)
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var progress, out bytes.Buffer
	c := config{method: "GET", tenants: 3, concurrency: 4, duration: time.Second}
	if err := c.parse(srv.URL, ""); err != nil {
		t.Fatal(err)
	}
	res := run(ctx, c, &progress)
	sent, ok, limited, bad := 0, 0, 0, 0
	for _, s := range res.tenants {
		sent, ok, limited, bad = sent+s.sent, ok+s.ok, limited+s.limited, bad+s.bad
		if s.sent == 0 {
			t.Error("a tenant sent nothing")
		}
	}
	// requests in flight at the end reach the server, but their answers are cut off and
	// not counted: the server sees up to one more per worker
	if sent == 0 || sent != ok+limited+bad || bad != 0 || n.Load() < int64(sent) || n.Load() > int64(sent)+4 {
		t.Errorf("sent %d = %d + %d + %d; the server saw %d", sent, ok, limited, bad, n.Load())
	}
	if limited < sent/3-4 || limited > sent/3+4 {
		t.Errorf("%d of %d limited; want about a third", limited, sent)
	}
	report(&out, c, res)
	if !strings.Contains(out.String(), "tenant-3") || !strings.Contains(out.String(), srv.URL) || !strings.Contains(progress.String(), "done") {
		t.Errorf("report:\n%s\nprogress: %q", out.String(), progress.String())
	}
}

// TestInstancesAndStreams: with -llm, chat completions go to two instances by their
// shares (3 to 1), half of them streamed; each answer's tokens (a header, or a stream's
// trailer) are counted per tenant and per instance.
func TestInstancesAndStreams(t *testing.T) {
	var streamed, plain atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	model := func(w http.ResponseWriter, r *http.Request) {
		if streamed.Load()+plain.Load() >= 400 { // enough: the run ends
			cancel()
		}
		var req struct {
			Model     string `json:"model"`
			MaxTokens int    `json:"max_tokens"`
			Stream    bool   `json:"stream"`
		}
		if r.Method != "POST" || r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&req) != nil || req.Model != "m" || req.MaxTokens != 7 {
			w.WriteHeader(400)
			return
		}
		if !req.Stream {
			plain.Add(1)
			w.Header().Set(usageHeader, "10")
			return
		}
		streamed.Add(1)
		w.Header().Set("Trailer", usageHeader)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: {}\n\n"))
		w.Header().Set(usageHeader, "30")
	}
	a, b := httptest.NewServer(http.HandlerFunc(model)), httptest.NewServer(http.HandlerFunc(model))
	defer a.Close()
	defer b.Close()
	c := config{method: "GET", tenants: 2, concurrency: 1, duration: time.Minute, rate: 0, llm: true, model: "m", prompt: 3, maxTokens: 7, stream: 0.5}
	if err := c.parse(a.URL+","+b.URL, "3,1"); err != nil {
		t.Fatal(err)
	}
	res := run(ctx, c, &bytes.Buffer{})
	ia, ib := res.instances[0], res.instances[1]
	if ia.bad+ib.bad > 0 || ia.sent < 3*ib.sent-3 || ia.sent > 3*ib.sent+3 {
		t.Errorf("instances: %d and %d sent, %d and %d failed; want 3 to 1, none failed", ia.sent, ib.sent, ia.bad, ib.bad)
	}
	all := res.tenants[0].ok + res.tenants[1].ok
	tokens := res.tenants[0].tokens + res.tenants[1].tokens
	if d := streamed.Load() - plain.Load(); d < -2 || d > 2 || tokens != ia.tokens+ib.tokens || tokens < int64(all)*20-40 || tokens > int64(all)*20+40 {
		t.Errorf("%d streamed, %d not, %d tokens of %d answers (%d + %d by instance); want half streamed, 20 tokens an answer",
			streamed.Load(), plain.Load(), tokens, all, ia.tokens, ib.tokens)
	}
	var out bytes.Buffer
	report(&out, c, res)
	if !strings.Contains(out.String(), "tokens") || !strings.Contains(out.String(), b.URL+"/v1/chat/completions") {
		t.Errorf("report:\n%s", out.String())
	}
}

// TestParse: the flags that cannot make a run are refused.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		urls, split string
		stream      float64
	}{
		{"", "", 0},
		{"http://a,http://b", "1", 0},
		{"http://a", "x", 0},
		{"http://a,http://b", "0,0", 0},
		{"http://a", "", 1.5},
	} {
		cfg := config{tenants: 1, concurrency: 1, duration: time.Second, stream: c.stream}
		if err := cfg.parse(c.urls, c.split); err == nil {
			t.Errorf("-url %q -split %q -stream %v: accepted", c.urls, c.split, c.stream)
		}
	}
}
