package llmlimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// waiting is a gateway of 600 tokens a minute per key (10 a second), each request
// estimated at its max_tokens and using all of it, whose denied requests may wait, before
// a model that answers at once.
func waiting(t *testing.T, w *Waiter) http.Handler {
	t.Helper()
	ps, err := Table{"": {TokensPerMinute: 600}}.Policies(localstore.New(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	model := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		x := ExchangeOf(r)
		x.Settle(Usage{Input: x.Request.Input, Output: x.Request.MaxTokens}, true)
	})
	mw := &ratelimit.Middleware{Key: APIKey, Policies: ps, Denied: w.Denied, Headers: OpenAIHeaders()}
	return (&Gate{Waiter: w}).Wrap(mw.Wrap(model))
}

// send sends a completion of max_tokens n as key, asking to wait wait (none when ""), and
// returns its status and how long it took.
func send(h http.Handler, key string, n int, wait string) (int, time.Duration) {
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"max_tokens":`+strconv.Itoa(n)+`,"messages":[]}`))
	r.Header.Set("Authorization", "Bearer "+key)
	if wait != "" {
		r.Header.Set("Prefer", wait)
	}
	start := time.Now()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, time.Since(start)
}

// TestWaiter: a key that spent its 600 tokens is refused a request of 100 at once unless
// it asks to wait (Prefer: wait=N); asking 30s, it is admitted when its tokens are back,
// 10s later; asking 5s, less than the 10s it would need, it is refused at once. Three of
// one key's requests wait at most two at a time (PerKey): the third is refused at once,
// the two others are admitted in turn, 10s apart, while another key's request goes on.
// A Waiter's Max bounds what a client asks.
func TestWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := waiting(t, &Waiter{PerKey: 2})
		if code, _ := send(h, "k", 600, ""); code != 200 {
			t.Fatalf("the first: %d", code)
		}
		for _, c := range []struct {
			wait string
			code int
			took time.Duration
		}{
			{"", 429, 0},
			{"wait=5", 429, 0},
			{"respond-async, wait=30", 200, 10 * time.Second},
		} {
			if code, took := send(h, "k", 100, c.wait); code != c.code || took != c.took {
				t.Errorf("Prefer %q: %d after %v; want %d after %v", c.wait, code, took, c.code, c.took)
			}
		}

		var wg sync.WaitGroup
		results := make([]struct {
			code int
			took time.Duration
		}, 3)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i].code, results[i].took = send(h, "k", 100, "wait=60")
			}()
			synctest.Wait() // in this order
		}
		if code, took := send(h, "other", 100, ""); code != 200 || took != 0 {
			t.Errorf("another key: %d after %v; want 200 at once", code, took)
		}
		wg.Wait()
		want := []struct {
			code int
			took time.Duration
		}{{200, 10 * time.Second}, {200, 20 * time.Second}, {429, 0}}
		for i := range want {
			if results[i] != want[i] {
				t.Errorf("the %d of three waiting: %+v; want %+v", i+1, results[i], want[i])
			}
		}

		capped := waiting(t, &Waiter{Max: 5 * time.Second}) // whatever the client asks
		send(capped, "k", 600, "")
		if code, took := send(capped, "k", 100, "wait=30"); code != 429 || took != 0 {
			t.Errorf("asking 30s of a Waiter of 5s at most, 10s short: %d after %v; want 429 at once", code, took)
		}
	})
}
