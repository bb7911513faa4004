package llmlimit

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// DefaultMaxWait is how long a request may wait at most when a Waiter's Max is 0.
const DefaultMaxWait = 30 * time.Second

// Waiter lets a request the limits deny wait for them instead of failing, when its client
// asks to (RFC 7240's Prefer: wait=N, in seconds) and the limits say it will be admitted
// in time: it is decided again once its RetryAfter has passed, as often as need be,
// until it is admitted or its wait would pass the time asked (or Max), when it gets its
// 429. A client that asks nothing gets its 429 at once.
//
// Waiting is fair across keys: each key's waiting requests go one at a time, in the
// order they came (the first is decided again, the others wait behind it), and a key has
// at most PerKey of them, so that no key takes every place; at most Total wait in all.
// A request over those bounds gets its 429 at once.
//
// A Waiter serves the requests of a Gate (Gate.Waiter) whose Middleware's Denied is its
// Denied.
type Waiter struct {
	// Max bounds any request's wait, whatever its client asks: DefaultMaxWait when 0.
	Max time.Duration
	// PerKey bounds the requests of one key waiting at once: 4 when 0.
	PerKey int
	// Total bounds the requests waiting at once: 256 when 0.
	Total int
	// Key is the key whose requests wait one at a time: APIKey when nil.
	Key func(r *http.Request) (string, error)

	mu      sync.Mutex
	keys    map[string]*queue
	waiting int
}

// queue is one key's waiting requests: turn is held by the one decided again.
type queue struct {
	waiting int
	turn    chan struct{}
}

// waitState is a request's through the Waiter: the handler that decides it again, when
// it came, and what its last decision was.
type waitState struct {
	decide   http.Handler
	start    time.Time
	retrying bool
	denied   *ratelimit.Decision
}

type waitKey struct{}

// wrap returns next (the Middleware's handler) with the state Denied needs to decide a
// request again.
func (wt *Waiter) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := &waitState{decide: next, start: time.Now()}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), waitKey{}, st)))
	})
}

// Denied is the Middleware's Denied: it holds a denied request that asked to wait, and
// decides it again, or answers 429 Too Many Requests.
func (wt *Waiter) Denied(w http.ResponseWriter, r *http.Request, d ratelimit.Decision) {
	st, _ := r.Context().Value(waitKey{}).(*waitState)
	switch {
	case st == nil:
	case st.retrying: // decided again, and denied: the wait below goes on
		st.denied = &d
		return
	default:
		if wt.wait(w, r, st, d) {
			return
		}
	}
	tooMany(w, r, w.Header().Get("Retry-After"))
}

// wait holds r until its limits admit it and serves it (true), or says it cannot wait
// (false): its 429 is to be answered.
func (wt *Waiter) wait(w http.ResponseWriter, r *http.Request, st *waitState, d ratelimit.Decision) bool {
	deadline := st.start.Add(min(askedWait(r), wt.maxWait()))
	if d.RetryAfter > time.Until(deadline) {
		return false
	}
	keyOf := wt.Key
	if keyOf == nil {
		keyOf = APIKey
	}
	key, err := keyOf(r)
	if err != nil {
		return false
	}
	q := wt.enter(key)
	if q == nil {
		return false
	}
	defer wt.leave(key, q)
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	select {
	case q.turn <- struct{}{}: // first of its key's waiting requests
		defer func() { <-q.turn }()
	case <-ctx.Done():
		return r.Context().Err() != nil // the client left: nothing to answer
	}
	x := ExchangeOf(r)
	for {
		if d.RetryAfter > time.Until(deadline) {
			return false
		}
		t := time.NewTimer(d.RetryAfter)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return true // the client left: nothing to answer
		}
		if x != nil {
			x.rewind(r)
		}
		w.Header().Del("Retry-After")
		st.retrying, st.denied = true, nil
		st.decide.ServeHTTP(w, r)
		st.retrying = false
		if st.denied == nil { // admitted and served, or answered otherwise
			return true
		}
		d = *st.denied
	}
}

// enter counts one more waiting request of key, and returns its key's queue; nil when
// the request may not wait (PerKey or Total reached).
func (wt *Waiter) enter(key string) *queue {
	perKey, total := wt.PerKey, wt.Total
	if perKey <= 0 {
		perKey = 4
	}
	if total <= 0 {
		total = 256
	}
	wt.mu.Lock()
	defer wt.mu.Unlock()
	q := wt.keys[key]
	if wt.waiting >= total || q != nil && q.waiting >= perKey {
		return nil
	}
	if q == nil {
		if wt.keys == nil {
			wt.keys = map[string]*queue{}
		}
		q = &queue{turn: make(chan struct{}, 1)}
		wt.keys[key] = q
	}
	q.waiting++
	wt.waiting++
	return q
}

// leave counts a waiting request of key out of q.
func (wt *Waiter) leave(key string, q *queue) {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	q.waiting--
	wt.waiting--
	if q.waiting == 0 {
		delete(wt.keys, key)
	}
}

func (wt *Waiter) maxWait() time.Duration {
	if wt.Max > 0 {
		return wt.Max
	}
	return DefaultMaxWait
}

// askedWait is how long r's client asks to wait (Prefer: wait=N), 0 for none.
func askedWait(r *http.Request) time.Duration {
	for _, v := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, val, _ := strings.Cut(strings.TrimSpace(pref), "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.ParseInt(strings.Trim(strings.TrimSpace(val), `"`), 10, 64)
			if err == nil && n > 0 && n < 1<<31 {
				return time.Duration(n) * time.Second
			}
		}
	}
	return 0
}
