package ratelimit_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// completion answers as a language model's API would: its cost in the X-Tokens header,
// from the request's "used" query parameter.
var completion = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Tokens", r.URL.Query().Get("used"))
	w.Write([]byte("a completion"))
})

// ask sends a request for key that is estimated at estimate tokens and uses used.
func ask(h http.Handler, key string, estimate, used int) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/chat?used="+strconv.Itoa(used), nil)
	r.Header.Set("X-Api-Key", key)
	r.Header.Set("X-Estimate", strconv.Itoa(estimate))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func estimateHeader(r *http.Request) int64 {
	n, _ := strconv.ParseInt(r.Header.Get("X-Estimate"), 10, 64)
	return n
}

// tokensLeft is what key has left of l, peeked.
func tokensLeft(t *testing.T, l *ratelimit.AlgorithmLimiter, key string) int64 {
	t.Helper()
	d, err := l.PeekN(context.Background(), key, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed {
		return 0
	}
	return d.Remaining + 1
}

// TestMiddlewareCost: a request is admitted on its estimate and charged its real cost
// once its handler has returned: past zero when it cost more, so that the next request
// waits until the debt is repaid, and refunded when it cost less.
func TestMiddlewareCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tpm, _ := tokenbucket.New(localstore.New(), ratelimit.PerMinute(1000), ratelimit.WithNamespace("tokens"))
		h := (&ratelimit.Middleware{Limiter: tpm, Key: headerKey,
			Cost: &ratelimit.Cost{Estimate: estimateHeader, Actual: ratelimit.CostHeader("X-Tokens"), Unit: "tokens"}}).Wrap(completion)
		w := ask(h, "a", 100, 700)
		if w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "900" ||
			w.Header().Get("RateLimit-Policy") != `"default";q=1000;w=60;qu="tokens"` {
			t.Fatalf("the first request: %d %v; want admitted on its estimate of 100, 900 left, in tokens", w.Code, w.Header())
		}
		if got := tokensLeft(t, tpm, "a"); got != 300 {
			t.Fatalf("after a request of 700 tokens: %d left; want 300", got)
		}
		if w := ask(h, "a", 100, 700); w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "200" {
			t.Fatalf("the second request: %d %v; want admitted, 200 left", w.Code, w.Header())
		}
		// 300 - 700 = -400: a request of 100 waits for 500 tokens, 30s at 1000 a minute
		w = ask(h, "a", 100, 700)
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "30" {
			t.Fatalf("a request of a key 400 in debt: %d, Retry-After %q; want 429 for 30s", w.Code, w.Header().Get("Retry-After"))
		}
		time.Sleep(30 * time.Second)
		// 100 left: admitted on 100, and it used 10: 90 back
		if w := ask(h, "a", 100, 10); w.Code != 200 {
			t.Fatalf("once the debt is repaid: %d; want 200", w.Code)
		}
		if got := tokensLeft(t, tpm, "a"); got != 90 {
			t.Errorf("after a request estimated at 100 that used 10: %d left; want 90", got)
		}
		// an upstream that does not say what it cost: the estimate stands
		r := httptest.NewRequest("POST", "/v1/chat", nil)
		r.Header.Set("X-Api-Key", "b")
		r.Header.Set("X-Estimate", "50")
		h.ServeHTTP(httptest.NewRecorder(), r)
		if got := tokensLeft(t, tpm, "b"); got != 950 {
			t.Errorf("a request of unknown cost estimated at 50: %d left; want 950", got)
		}
		// an estimate above what the key can ever hold is admitted as 1000, and charged the rest
		if w := ask(h, "c", 5000, 1200); w.Code != 200 {
			t.Fatalf("a request estimated above the limit: %d; want admitted on the whole limit", w.Code)
		}
		if d, _ := tpm.PeekN(context.Background(), "c", 1); d.Allowed || d.RetryAfter != 12060*time.Millisecond {
			t.Errorf("after a request of 1200 on a key of 1000: %+v; want 201 tokens to earn, 12.06s", d)
		}
	})
}

// TestMiddlewareCostBytes: without Actual, a request costs the bytes of its answer.
func TestMiddlewareCostBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bytes, _ := tokenbucket.New(localstore.New(), ratelimit.PerSecond(1<<20))
		h := (&ratelimit.Middleware{Limiter: bytes, Key: headerKey, Cost: &ratelimit.Cost{Unit: "content-bytes"}}).Wrap(
			http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(make([]byte, 4096)) }))
		w := get(h, "/", "a")
		if w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"default";q=1048576;w=1;qu="content-bytes"` {
			t.Fatalf("%d %v", w.Code, w.Header())
		}
		if got := tokensLeft(t, bytes, "a"); got != 1<<20-4096 {
			t.Errorf("after an answer of 4096 bytes: %d left; want %d", got, 1<<20-4096)
		}
	})
}

// TestPolicyCost: a policy with a Cost is charged it; the others count requests.
func TestPolicyCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := localstore.New()
		rps, _ := tokenbucket.New(store, ratelimit.PerSecond(10), ratelimit.WithNamespace("requests"))
		tpm, _ := tokenbucket.New(store, ratelimit.PerMinute(1000), ratelimit.WithNamespace("tokens"))
		shadow, _ := tokenbucket.New(store, ratelimit.PerMinute(500), ratelimit.WithNamespace("tried"))
		cost := &ratelimit.Cost{Estimate: estimateHeader, Actual: ratelimit.CostHeader("X-Tokens"), Unit: "tokens"}
		h := (&ratelimit.Middleware{Key: headerKey, Policies: []ratelimit.Policy{
			{Name: "requests", Limiter: rps},
			{Name: "tokens", Limiter: tpm, Cost: cost},
			{Name: "tried", Limiter: shadow, Cost: cost, Shadow: true},
		}}).Wrap(completion)
		w := ask(h, "a", 100, 300)
		if want := `"requests";q=10;w=1, "tokens";q=1000;w=60;qu="tokens"`; w.Code != 200 || w.Header().Get("RateLimit-Policy") != want {
			t.Fatalf("%d, RateLimit-Policy %q; want %q", w.Code, w.Header().Get("RateLimit-Policy"), want)
		}
		for _, c := range []struct {
			l    *ratelimit.AlgorithmLimiter
			want int64
		}{{rps, 9}, {tpm, 700}, {shadow, 200}} {
			if got := tokensLeft(t, c.l, "a"); got != c.want {
				t.Errorf("%s: %d left; want %d", c.l.Namespace(), got, c.want)
			}
		}
	})
}

// TestCostClientGone: a client that leaves before its answer is done still pays for what
// it was served: the charge outlives the request's context.
func TestCostClientGone(t *testing.T) {
	tpm, _ := tokenbucket.New(localstore.New(), ratelimit.PerMinute(1000))
	ctx, cancel := context.WithCancel(context.Background())
	h := (&ratelimit.Middleware{Limiter: tpm, Key: headerKey, Cost: &ratelimit.Cost{Actual: ratelimit.CostHeader("X-Tokens")}}).Wrap(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cancel() // the client hangs up while the answer is made
			w.Header().Set("X-Tokens", "400")
		}))
	r := httptest.NewRequest("POST", "/", nil).WithContext(ctx)
	r.Header.Set("X-Api-Key", "a")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if got := tokensLeft(t, tpm, "a"); got != 600 {
		t.Errorf("%d left; want 600", got)
	}
}

// TestCostMisconfigured: Wrap refuses a Cost it cannot charge.
func TestCostMisconfigured(t *testing.T) {
	leaky, _ := leakybucket.New(localstore.New(), ratelimit.PerSecond(10))
	tb, _ := tokenbucket.New(localstore.New(), ratelimit.PerSecond(10))
	for name, m := range map[string]*ratelimit.Middleware{
		"a leaky bucket":  {Limiter: leaky, Key: headerKey, Cost: &ratelimit.Cost{}},
		"no limiter":      {InFlight: mustInFlight(t), Key: headerKey, Cost: &ratelimit.Cost{}},
		"a policy's":      {Key: headerKey, Policies: []ratelimit.Policy{{Name: "p", Limiter: leaky, Cost: &ratelimit.Cost{}}}},
		"a bad unit":      {Limiter: tb, Key: headerKey, Cost: &ratelimit.Cost{Unit: "tok\nens"}},
		"a bound below 0": {Limiter: tb, Key: headerKey, Cost: &ratelimit.Cost{Max: -1}},
		"decided by hand": {Limiter: tb, Key: headerKey, Cost: &ratelimit.Cost{}, Decide: func(*http.Request, string) (ratelimit.Decision, ratelimit.Rule, error) {
			return ratelimit.Decision{}, ratelimit.Rule{}, nil
		}},
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(p.(string), "Cost") {
					t.Errorf("%s: Wrap panicked with %v; want the Cost named", name, p)
				}
			}()
			m.Wrap(ok)
		}()
	}
}

func mustInFlight(t *testing.T) *ratelimit.InFlightLimiter {
	l, err := ratelimit.NewInFlight(localstore.New(), 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestPolicyCostUnderItsRule: a policy whose rule is chosen per request is charged under
// that rule: 150 tokens on a plan of 100 a minute leave the key 50 in debt, 30s to wait
// for one more.
func TestPolicyCostUnderItsRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tpm, _ := tokenbucket.New(localstore.New(), ratelimit.PerMinute(1000), ratelimit.WithNamespace("tokens"))
		plan := ratelimit.PerMinute(100)
		h := (&ratelimit.Middleware{Key: headerKey, Policies: []ratelimit.Policy{{Name: "tokens", Limiter: tpm,
			Cost: &ratelimit.Cost{Actual: ratelimit.CostHeader("X-Tokens")},
			For:  func(*http.Request) (ratelimit.PolicyLimit, error) { return ratelimit.PolicyLimit{Rule: plan}, nil },
		}}}).Wrap(completion)
		if w := ask(h, "a", 1, 150); w.Code != 200 || w.Header().Get("X-Ratelimit-Limit") != "100" {
			t.Fatalf("%d %v; want admitted under the plan of 100", w.Code, w.Header())
		}
		if d, err := tpm.AllowRule(context.Background(), "a", plan, 1); err != nil || d.Allowed || d.RetryAfter != 30600*time.Millisecond {
			t.Errorf("under the plan after 150 of 100: %+v, %v; want 51 tokens to earn, 30.6s", d, err)
		}
	})
}

// TestCostFromTrailer: a streamed answer (flushed as it goes) reports its cost in a
// trailer once it is done, as a model's stream reports its usage last.
func TestCostFromTrailer(t *testing.T) {
	tpm, _ := tokenbucket.New(localstore.New(), ratelimit.PerMinute(1000))
	h := (&ratelimit.Middleware{Limiter: tpm, Key: headerKey, Cost: &ratelimit.Cost{Actual: ratelimit.CostHeader("X-Tokens")}}).Wrap(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for range 3 {
				w.Write([]byte("data: a token\n\n"))
				if err := http.NewResponseController(w).Flush(); err != nil {
					t.Errorf("flushing through the Middleware: %v", err)
				}
			}
			w.Header().Set(http.TrailerPrefix+"X-Tokens", "250")
		}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL, nil)
	req.Header.Set("X-Api-Key", "a")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.Trailer.Get("X-Tokens") != "250" || strings.Count(string(body), "data:") != 3 {
		t.Fatalf("trailer %v, body %q", res.Trailer, body)
	}
	if got := tokensLeft(t, tpm, "a"); got != 750 {
		t.Errorf("after a stream of 250 tokens: %d left; want 750", got)
	}
}

// TestCostBounded: an upstream's cost is charged no more than Cost.Max (by default ten
// times the limit's Limit, or the estimate if more), and the excess is logged; a cost
// given twice, or as a list, is no cost: the estimate stands.
func TestCostBounded(t *testing.T) {
	for _, c := range []struct {
		name   string
		max    int64
		header []string
		left   int64 // of 1000 a minute after the request, estimated at 100
		logged bool
	}{
		{"2^63-1, by default", 0, []string{"9223372036854775807"}, -9000, true},
		{"2^63-1, Max 1500", 1500, []string{"9223372036854775807"}, -500, true},
		{"within Max", 1500, []string{"1200"}, -200, false},
		{"two headers", 0, []string{"100000", "1"}, 900, false},
		{"a list", 0, []string{"100000,1"}, 900, false},
		{"a sign", 0, []string{"+5"}, 900, false},
		{"a space", 0, []string{" 5"}, 900, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tpm, _ := tokenbucket.New(localstore.New(), ratelimit.PerMinute(1000))
			var log strings.Builder
			h := (&ratelimit.Middleware{Limiter: tpm, Key: headerKey, Logger: slog.New(slog.NewTextHandler(&log, nil)),
				Cost: &ratelimit.Cost{Estimate: estimateHeader, Actual: ratelimit.CostHeader("X-Tokens"), Max: c.max}}).Wrap(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					for _, v := range c.header {
						w.Header().Add("X-Tokens", v)
					}
				}))
			ask(h, "a", 100, 0)
			d, err := tpm.PeekN(context.Background(), "a", 1)
			if err != nil {
				t.Fatal(err)
			}
			left := d.Remaining + 1
			if !d.Allowed { // in debt: the tokens to earn before one is left, from the wait (60ms each)
				left = 1 - int64((d.RetryAfter+30*time.Millisecond)/(60*time.Millisecond))
			}
			if left != c.left {
				t.Errorf("%d left after the request (%+v); want %d", left, d, c.left)
			}
			if got := strings.Contains(log.String(), "Cost.Max"); got != c.logged {
				t.Errorf("logged %v: %q", got, log.String())
			}
		})
	}
}

// TestInFlightRefusalCostsNothing: a request refused for being one too many in progress
// gives back what the rate limits took of it, its estimate included: a request rate and a
// daily token budget charged after the answer, as Policies, with an in-flight limit of 1.
func TestInFlightRefusalCostsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := localstore.New()
		rps, _ := tokenbucket.New(store, ratelimit.PerMinute(10), ratelimit.WithNamespace("requests"))
		daily, _ := fixedwindow.New(store, ratelimit.PerDay(10_000), ratelimit.WithNamespace("tokens"))
		inflight, _ := ratelimit.NewInFlight(store, 1, time.Minute)
		g := newGate()
		h := (&ratelimit.Middleware{Key: headerKey, InFlight: inflight, Policies: []ratelimit.Policy{
			{Name: "requests", Limiter: rps},
			{Name: "tokens", Limiter: daily, Cost: &ratelimit.Cost{Estimate: estimateHeader, Actual: ratelimit.CostHeader("X-Tokens")}},
		}}).Wrap(g)
		send := func(path string) *httptest.ResponseRecorder {
			r := httptest.NewRequest("POST", path, nil)
			r.Header.Set("X-Api-Key", "a")
			r.Header.Set("X-Estimate", "1000")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if w := send("/slow"); w.Code != 200 {
				t.Errorf("the slow request: %d", w.Code)
			}
		}()
		<-g.started
		for i := range 5 {
			if w := send("/"); w.Code != http.StatusTooManyRequests || w.Header().Get("RateLimit") != `"in-flight";r=0` {
				t.Errorf("request %d beside the slow one: %d, RateLimit %q; want refused as in progress", i, w.Code, w.Header().Get("RateLimit"))
			}
		}
		if got := tokensLeft(t, rps, "a"); got != 9 {
			t.Errorf("requests: %d left; want 9, the slow one's alone", got)
		}
		if got := tokensLeft(t, daily, "a"); got != 9000 {
			t.Errorf("tokens: %d left; want 9000, the slow one's estimate alone", got)
		}
		close(g.release)
		<-done
	})
}

// TestMiddlewareHeadersFunc: a Headers function gets every enforced policy's part of the
// decision (its key, rule, unit and own decision, the binding one marked) and writes the
// headers instead of the defaults; Retry-After stays the Middleware's; a request the
// in-flight limit refuses loses what Headers wrote.
func TestMiddlewareHeadersFunc(t *testing.T) {
	store := localstore.New()
	rpm, _ := tokenbucket.New(store, ratelimit.PerMinute(10), ratelimit.WithNamespace("requests"))
	tpm, _ := tokenbucket.New(store, ratelimit.PerMinute(1000), ratelimit.WithNamespace("tokens"))
	var got []ratelimit.PolicyDecision
	inflight, _ := ratelimit.NewInFlight(store, 1, time.Minute)
	started, release := make(chan struct{}), make(chan struct{})
	h := (&ratelimit.Middleware{Key: headerKey, InFlight: inflight,
		Policies: []ratelimit.Policy{
			{Name: "requests", Limiter: rpm},
			{Name: "tokens", Limiter: tpm, Cost: &ratelimit.Cost{Estimate: estimateHeader, Actual: ratelimit.CostHeader("X-Tokens"), Unit: "tokens"},
				For: func(*http.Request) (ratelimit.PolicyLimit, error) { return ratelimit.PolicyLimit{Key: "org-1"}, nil }},
		},
		Headers: func(h http.Header, limits []ratelimit.PolicyDecision) {
			got = limits
			for _, l := range limits {
				h.Set("X-Left-"+l.Name, strconv.FormatInt(l.Decision.Remaining, 10))
			}
		},
	}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			close(started)
			<-release
		}
		completion(w, r)
	}))

	w := ask(h, "a", 995, 995)
	if w.Code != 200 || w.Header().Get("X-Left-requests") != "9" || w.Header().Get("X-Left-tokens") != "5" ||
		w.Header().Get("X-RateLimit-Remaining") != "" || w.Header().Get("RateLimit") != "" {
		t.Fatalf("%d %v; want 200 with X-Left-requests 9 and X-Left-tokens 5, and no default headers", w.Code, w.Header())
	}
	want := []ratelimit.PolicyDecision{
		{Name: "requests", Key: "a", Rule: rpm.Rule(), Unit: "requests", Decision: got[0].Decision},
		{Name: "tokens", Key: "org-1", Rule: tpm.Rule(), Unit: "tokens", Decision: got[1].Decision, Binding: true},
	}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] || got[0].Decision.Remaining != 9 || got[1].Decision.Remaining != 5 {
		t.Fatalf("Headers got %+v; want %+v", got, want)
	}

	w = ask(h, "a", 10, 10) // the tokens deny: Retry-After from them, 10-5 tokens at 1000 a minute
	if w.Code != 429 || w.Header().Get("Retry-After") != "1" || !got[1].Binding || got[1].Decision.Allowed || !got[0].Decision.Allowed {
		t.Fatalf("%d, Retry-After %q, %+v; want 429 after 1s, bound by the tokens", w.Code, w.Header().Get("Retry-After"), got)
	}
	if w.Header().Get("X-Left-requests") != "9" { // nothing taken of a request refused
		t.Errorf("the requests' limit of a refused request: %q left; want the 9 it had", w.Header().Get("X-Left-requests"))
	}

	done := make(chan struct{})
	go func() { // holds the one in-flight lease of "b"
		defer close(done)
		r := httptest.NewRequest("POST", "/v1/chat?hold=1&used=1", nil)
		r.Header.Set("X-Api-Key", "b")
		r.Header.Set("X-Estimate", "1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	<-started
	w = ask(h, "b", 1, 1)
	close(release)
	<-done
	if w.Code != 429 || w.Header().Get("X-Left-requests") != "" || w.Header().Get("X-Left-tokens") != "" || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("%d %v; want 429 from the in-flight limit, without the headers Headers wrote", w.Code, w.Header())
	}
}
