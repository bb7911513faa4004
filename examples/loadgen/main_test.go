package main

import (
	"bytes"
	"context"
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
	stats := run(ctx, config{url: srv.URL, method: "GET", tenants: 3, concurrency: 4, duration: time.Second}, &progress)
	sent, ok, limited, bad := 0, 0, 0, 0
	for _, s := range stats {
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
	report(&out, stats)
	if !strings.Contains(out.String(), "tenant-3") || !strings.Contains(progress.String(), "done") {
		t.Errorf("report:\n%s\nprogress: %q", out.String(), progress.String())
	}
}
