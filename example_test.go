package ratelimit_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

func Example() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) // or leave the real clock out
	limiter, err := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerSecond(2))
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		d, err := limiter.Allow(context.Background(), "tenant-42")
		switch {
		case err != nil:
			fmt.Println("limiter failed:", err)
		case d.Allowed:
			fmt.Printf("allowed, %d of %d left\n", d.Remaining, d.Limit)
		default:
			fmt.Printf("denied, retry after %v\n", d.RetryAfter)
		}
	}
	// Output:
	// allowed, 1 of 2 left
	// allowed, 0 of 2 left
	// denied, retry after 500ms
}

// The README's quickstart.
func Example_quickstart() {
	limiter, err := tokenbucket.New(localstore.New(), ratelimit.PerSecond(10), ratelimit.WithNamespace("api"))
	if err != nil {
		panic(err) // an invalid rule: errors.Is(err, ratelimit.ErrInvalidRule)
	}
	d, err := limiter.Allow(context.Background(), "tenant-42")
	fmt.Println(d.Allowed, d.Remaining, d.RetryAfter, err) // true 9 0s <nil>
	// Output: true 9 0s <nil>
}

func ExampleRule_String() {
	fmt.Println(ratelimit.PerMinute(60))
	fmt.Println(ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 200})
	// Output:
	// 60 per 1m0s
	// 100 per 1s, burst 200
}

// Rules as text, from a flag (or JSON, YAML, the environment): the form String writes.
func ExampleRule_UnmarshalText() {
	fs := flag.NewFlagSet("api", flag.ContinueOnError)
	var rule ratelimit.Rule
	fs.TextVar(&rule, "rule", ratelimit.PerSecond(10), "each tenant's rate")
	fs.Parse([]string{"-rule", "100 per 1m, burst 20"})
	fmt.Println(rule.Limit, rule.Period, rule.Burst)
	err := rule.UnmarshalText([]byte("100 per fortnight"))
	fmt.Println(err)
	// Output:
	// 100 1m0s 20
	// ratelimit: invalid rule: "100 per fortnight": the period "fortnight" is not a duration (1s, 1m0s, 1h30m) or second, minute, hour or day
}

// Two limiters on one store and one key count apart: each has its own namespace, the
// rule's by default, or one named with WithNamespace.
func ExampleWithNamespace() {
	store := localstore.New()
	logins, _ := tokenbucket.New(store, ratelimit.PerHour(5), ratelimit.WithNamespace("login"))
	resets, _ := tokenbucket.New(store, ratelimit.PerHour(5), ratelimit.WithNamespace("password-reset"))
	ctx := context.Background()
	logins.AllowN(ctx, "alice", 5)
	d, _ := resets.Allow(ctx, "alice")
	fmt.Println("password reset allowed:", d.Allowed, d.Remaining, "left")
	d, _ = logins.Allow(ctx, "alice")
	fmt.Println("login allowed:", d.Allowed)
	// Output:
	// password reset allowed: true 4 left
	// login allowed: false
}

// A rule chosen per call: each tenant's plan, looked up per request.
func ExampleAlgorithmLimiter_AllowRule() {
	plans := map[string]ratelimit.Rule{"gold": ratelimit.PerMinute(1000), "free": ratelimit.PerMinute(2)}
	limiter, _ := fixedwindow.New(localstore.New(), ratelimit.PerMinute(10), ratelimit.WithNamespace("plans"))
	for range 3 {
		d, err := limiter.AllowRule(context.Background(), "tenant-7", plans["free"], 1)
		fmt.Println(d.Allowed, d.Limit, err)
	}
	// Output:
	// true 2 <nil>
	// true 2 <nil>
	// false 2 <nil>
}

// A tenant's daily plan and its per-second rate, decided together: a request the rate
// denies takes nothing from the plan.
func ExampleAllowAll() {
	store := localstore.New()
	plan, _ := tokenbucket.New(store, ratelimit.PerDay(10_000), ratelimit.WithNamespace("plan"))
	rate, _ := tokenbucket.New(store, ratelimit.PerSecond(2), ratelimit.WithNamespace("rate"))
	ctx := context.Background()
	for range 3 {
		d, _ := ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: plan, Key: "shop-a"}, ratelimit.Part{Limiter: rate, Key: "shop-a"})
		fmt.Println(d.Allowed, d.Remaining)
	}
	d, _ := plan.PeekN(ctx, "shop-a", 1)
	fmt.Println("left in the plan:", d.Remaining+1)
	// Output:
	// true 1
	// true 0
	// false 0
	// left in the plan: 9998
}

// The middleware limits each client IP to 2 requests a second; the third gets 429.
func ExampleMiddleware() {
	limiter, _ := tokenbucket.New(localstore.New(), ratelimit.PerSecond(2), ratelimit.WithNamespace("per-ip"))
	mw := &ratelimit.Middleware{
		Limiter: limiter,
		Key: func(r *http.Request) (string, error) {
			ip, err := ratelimit.ClientIP(r, nil) // nil: no trusted proxy in front
			return ip.String(), err
		},
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		fmt.Printf("%d remaining=%s retry-after=%q\n", w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=1 retry-after=""
	// 200 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="1"
}

// Two limits on one request, decided together: a key's 20 a second, and 3 exports a
// minute on the export route. The headers list both and name the one that binds.
func ExampleMiddleware_policies() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) // a window's start
	store := localstore.New(localstore.WithClock(clk))
	perKey, _ := tokenbucket.New(store, ratelimit.PerSecond(20), ratelimit.WithNamespace("per-key"))
	export, _ := fixedwindow.New(store, ratelimit.PerMinute(3), ratelimit.WithNamespace("export"))
	mw := &ratelimit.Middleware{
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil },
		Policies: []ratelimit.Policy{
			{Name: "per-key", Limiter: perKey},
			{Name: "export", Limiter: export, Match: func(r *http.Request) bool { return r.URL.Path == "/export" }},
		},
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "done") }))
	for range 4 {
		r := httptest.NewRequest("GET", "/export", nil)
		r.Header.Set("X-Api-Key", "shop-a")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"), "|", w.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "per-key";q=20;w=1, "export";q=3;w=60 | "export";r=2;t=60
	// 200 "per-key";q=20;w=1, "export";q=3;w=60 | "export";r=1;t=60
	// 200 "per-key";q=20;w=1, "export";q=3;w=60 | "export";r=0;t=60
	// 429 "per-key";q=20;w=1, "export";q=3;w=60 | "export";r=0;t=60
}

// A tenant's monthly quota beside a rate per (tenant, route): the quota on the tenant's
// own key (Policy.For), the rate on the Middleware's, all or none. X-RateLimit-* and
// RateLimit are the binding policy's: here the quota, once it is the tighter.
func ExamplePolicy_For() {
	clk := clock.NewFake(time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC)) // an hour before the month ends
	store := localstore.New(localstore.WithClock(clk))
	rate, _ := tokenbucket.New(store, ratelimit.PerSecond(20), ratelimit.WithNamespace("rate"))
	month, _ := fixedwindow.NewQuota(store, fixedwindow.Quota{Limit: 2, Per: fixedwindow.Month})
	tenant := func(r *http.Request) string { return r.Header.Get("X-Tenant") }
	mw := &ratelimit.Middleware{
		Key: func(r *http.Request) (string, error) { return tenant(r) + ":" + r.URL.Path, nil },
		Policies: []ratelimit.Policy{
			{Name: "rate", Limiter: rate},
			{Name: "month", Limiter: month, For: func(r *http.Request) (ratelimit.PolicyLimit, error) {
				return ratelimit.PolicyLimit{Key: tenant(r)}, nil
			}},
		},
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, path := range []string{"/orders", "/invoices", "/orders"} {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-Tenant", "shop-a")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"),
			w.Header().Get("X-RateLimit-Reset"), "|", w.Header().Get("RateLimit"))
	}
	// Output:
	// 200 2 1 3600 | "month";r=1;t=3600
	// 200 2 0 3600 | "month";r=0;t=3600
	// 429 2 0 3600 | "month";r=0;t=3600
}

// A new limit tried on live traffic: Shadow counts and reports, denies no one; the
// health check is exempt; OnDecision sees each decision (here printed; a metric in
// production).
func ExampleMiddleware_shadow() {
	limiter, _ := tokenbucket.New(localstore.New(), ratelimit.PerHour(2), ratelimit.WithNamespace("trial"))
	mw := &ratelimit.Middleware{
		Limiter: limiter,
		Key:     func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil },
		Shadow:  true,
		Exempt:  func(r *http.Request) bool { return r.URL.Path == "/healthz" },
		OnDecision: func(ctx context.Context, e ratelimit.Event) {
			fmt.Printf("key %s: allowed %v, shadowed %v\n", e.Key, e.Decision.Allowed, e.Shadowed)
		},
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, path := range []string{"/orders", "/orders", "/orders", "/healthz"} {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-Api-Key", "shop-a")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(path, w.Code)
	}
	// Output:
	// key shop-a: allowed true, shadowed true
	// /orders 200
	// key shop-a: allowed true, shadowed true
	// /orders 200
	// key shop-a: allowed false, shadowed true
	// /orders 200
	// /healthz 200
}

// A limit for gRPC: an interceptor calls Limit, and answers a *DeniedError with
// ResourceExhausted and its RetryAfter (in google.rpc.RetryInfo and the
// grpc-retry-pushback-ms trailer), and ErrInvalidKey, no rate limit, with
// Unauthenticated (examples/grpcservice has the interceptors). Here the key is a context
// value; a service reads it from the call's metadata.
func ExampleContextLimiter() {
	type apiKey struct{}
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	limiter, _ := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerMinute(2), ratelimit.WithNamespace("grpc"))
	limit := &ratelimit.ContextLimiter{
		Limiter: limiter,
		Key: func(ctx context.Context) (string, error) {
			if key, ok := ctx.Value(apiKey{}).(string); ok {
				return key, nil
			}
			return "", errors.New("no API key")
		},
	}
	ctx := context.WithValue(context.Background(), apiKey{}, "shop-a")
	for range 3 {
		var denied *ratelimit.DeniedError
		switch err := limit.Limit(ctx); {
		case errors.As(err, &denied):
			fmt.Println("ResourceExhausted, retry in", denied.RetryAfter())
		case err != nil:
			fmt.Println(err)
		default:
			fmt.Println("OK")
		}
	}
	err := limit.Limit(context.Background())
	fmt.Println(errors.Is(err, ratelimit.ErrInvalidKey), err)
	// Output:
	// OK
	// OK
	// ResourceExhausted, retry in 30s
	// true ratelimit: no valid key: no API key
}

// Behind a load balancer at 10.0.0.0/8, the client is the address it saw, not what the
// client wrote into X-Forwarded-For itself.
func ExampleInFlightLimiter() {
	ctx := context.Background()
	// at most 2 requests of a tenant in progress; a lease not released comes back after 30s
	inflight, _ := ratelimit.NewInFlight(localstore.New(), 2, 30*time.Second)
	first, _, _ := inflight.Acquire(ctx, "tenant-42")
	second, _, _ := inflight.Acquire(ctx, "tenant-42")
	third, d, _ := inflight.Acquire(ctx, "tenant-42")
	fmt.Println(third == nil, d.Remaining) // all held: no lease

	first.Release(ctx) // the work is done; releasing twice would change nothing
	third, _, _ = inflight.Acquire(ctx, "tenant-42")
	fmt.Println(third != nil)
	second.Release(ctx)
	third.Release(ctx)
	// Output:
	// true 0
	// true
}

func ExampleClientIP() {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.5:41000"
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 203.0.113.7")
	ip, _ := ratelimit.ClientIP(r, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	fmt.Println(ip)
	// Output: 203.0.113.7
}

// Priority load shedding: a bucket of 100 keeps 20% back from normal requests and 50%
// from sheddable ones, for the more important. Each class takes what the ones above it
// leave; 100ms later (10 tokens back) only a critical request fits, and the others are
// told how long until theirs would.
func ExampleWithReserves() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	limiter, err := tokenbucket.New(localstore.New(localstore.WithClock(clk)),
		ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 100},
		ratelimit.WithNamespace("api"), ratelimit.WithReserves(0, 20, 50))
	if err != nil {
		fmt.Println(err)
		return
	}
	classes := []ratelimit.Priority{ratelimit.Sheddable, ratelimit.Normal, ratelimit.Critical}
	for _, p := range classes {
		ctx := ratelimit.WithPriority(context.Background(), p)
		admitted := 0
		for range 100 {
			if d, _ := limiter.Allow(ctx, "tenant-42"); d.Allowed {
				admitted++
			}
		}
		fmt.Printf("%s: %d of 100 admitted\n", p, admitted)
	}
	clk.Advance(100 * time.Millisecond)
	for _, p := range classes {
		d, _ := limiter.Allow(ratelimit.WithPriority(context.Background(), p), "tenant-42")
		fmt.Println(p, d.Allowed, d.RetryAfter)
	}
	// Output:
	// sheddable: 50 of 100 admitted
	// normal: 30 of 100 admitted
	// critical: 20 of 100 admitted
	// sheddable false 410ms
	// normal false 110ms
	// critical true 0s
}

// A language model's API limited in tokens a minute per API key: a request is admitted on
// an estimate (100 tokens), and charged what the upstream reports it used once the
// answer is done: 800 each. The second request leaves the key 600 in debt, and the
// third waits 42s, until 700 tokens (the debt and the estimate) are back.
func ExampleCost() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tokens, _ := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerMinute(1000), ratelimit.WithNamespace("tokens"))
	mw := &ratelimit.Middleware{
		Limiter: tokens,
		Key:     func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
		Cost: &ratelimit.Cost{
			Estimate: func(*http.Request) int64 { return 100 },
			Actual:   ratelimit.CostHeader("X-Usage-Tokens"), // set by the upstream
			Unit:     "tokens",
		},
	}
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Usage-Tokens", "800")
		fmt.Fprintln(w, "a completion of 800 tokens")
	})
	h := mw.Wrap(upstream)
	for range 3 {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/v1/completions", nil)
		r.Header.Set("Authorization", "Bearer key-1")
		h.ServeHTTP(w, r)
		fmt.Printf("%d remaining=%s retry-after=%q\n", w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=900 retry-after=""
	// 200 remaining=100 retry-after=""
	// 429 remaining=0 retry-after="42"
}

// A language model's API behind one Middleware: a request rate, a token budget admitted
// on an estimate and charged the usage after the answer, and requests in progress, all
// decided together (a request one limit refuses costs the others nothing), on a store
// whose busy keys are decided from leases held in memory.
func ExampleMiddleware_languageModel() {
	// Instances sharing Redis: f, _ := fleet.New(ctx, client, fleet.Config{Instances: n}),
	// and every limit on f.Store(). Here, memory on a clock that stands still, for the
	// output below.
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store, _ := hotkey.NewLeases(localstore.New(localstore.WithClock(clk)))
	requests, _ := tokenbucket.New(store, ratelimit.PerMinute(60), ratelimit.WithNamespace("requests"))
	tokens, _ := tokenbucket.New(store, ratelimit.PerMinute(40_000), ratelimit.WithNamespace("tokens"))
	inflight, _ := ratelimit.NewInFlight(store, 4, time.Minute, ratelimit.WithNamespace("in-flight"))
	mw := &ratelimit.Middleware{ // one Middleware: never one wrapped in another
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil },
		Policies: []ratelimit.Policy{
			{Name: "requests", Limiter: requests},
			{Name: "tokens", Limiter: tokens, Cost: &ratelimit.Cost{
				// the prompt's tokens and max_tokens, read from the body (examples/llmlimit)
				Estimate: func(r *http.Request) int64 {
					n, _ := strconv.ParseInt(r.Header.Get("X-Estimate"), 10, 64)
					return n
				},
				// the usage the answer reports, JSON or streamed, once it is served
				Actual: ratelimit.CostHeader("X-Usage-Total-Tokens"),
				Unit:   "tokens",
			}},
		},
		InFlight: inflight,
	}
	model := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Usage-Total-Tokens", "1200") // of 4,000 estimated: 2,800 given back
	})
	h := mw.Wrap(model)
	for range 2 {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		r.Header.Set("X-Api-Key", "key-1")
		r.Header.Set("X-Estimate", "4000")
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"))
	}
	// what the leases hold goes back; a peek before might find part of it on loan
	store.Close(context.Background())
	d, _ := tokens.PeekN(context.Background(), "key-1", 1)
	fmt.Println("tokens left:", d.Remaining+1)
	// Output:
	// 200 "requests";q=60;w=60, "tokens";q=40000;w=60;qu="tokens", "in-flight";q=4;qu="concurrent-requests"
	// 200 "requests";q=60;w=60, "tokens";q=40000;w=60;qu="tokens", "in-flight";q=4;qu="concurrent-requests"
	// tokens left: 37600
}

// A batch consumer takes what is left, up to its batch; a job charges its cost once done,
// past zero if need be: the next take waits until the debt is repaid.
func ExampleAlgorithmLimiter_AllowAtMost() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	limiter, _ := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerSecond(10), ratelimit.WithNamespace("rows"))
	ctx := context.Background()
	for range 2 {
		granted, d, _ := limiter.AllowAtMost(ctx, "exporter", 8)
		fmt.Println("granted", granted, "of 8, remaining", d.Remaining)
	}
	d, _ := limiter.Debit(ctx, "exporter", 15) // the rows a query scanned, known after it ran
	fmt.Println("after a debit of 15:", d.Allowed, d.RetryAfter)
	// Output:
	// granted 8 of 8, remaining 2
	// granted 2 of 8, remaining 0
	// after a debit of 15: false 1.6s
}

// A request admitted on an estimate (a completion's max_tokens) is charged what it really
// cost once known: what it did not use comes back, but a refund never gives back more than
// the key still lacks: a request that ends after the key has filled up again gives back
// nothing, whatever it did not use.
func ExampleAlgorithmLimiter_Charge() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tokens, _ := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerMinute(1000), ratelimit.WithNamespace("tokens"))
	ctx := context.Background()
	left := func() int64 { d, _ := tokens.PeekN(ctx, "key-1", 1); return d.Remaining + 1 }

	c, d, _ := tokens.Charge(ctx, "key-1", 800) // admitted on its max_tokens
	fmt.Println("admitted on 800:", d.Allowed, "left", left())
	c.Settle(ctx, 300) // it used 300
	fmt.Println("settled at 300: left", left())

	long, _, _ := tokens.Charge(ctx, "key-1", 500)
	clk.Advance(2 * time.Minute) // a long stream: the key fills up meanwhile
	long.Settle(ctx, 100)
	fmt.Println("settled at 100, two minutes later: left", left())
	// Output:
	// admitted on 800: true left 200
	// settled at 300: left 700
	// settled at 100, two minutes later: left 1000
}

// Who is being limited right now: Denials as the Middleware's hook, read from an admin
// endpoint.
func ExampleDenials() {
	denials := &ratelimit.Denials{}
	limiter, _ := tokenbucket.New(localstore.New(), ratelimit.PerHour(1))
	mw := &ratelimit.Middleware{Limiter: limiter, Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil },
		OnDecision: denials.Observe}
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, key := range []string{"a", "a", "a", "b", "b", "c"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Api-Key", key)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	for _, d := range denials.Top(10) {
		fmt.Println(d.Key, d.Count)
	}
	// Output:
	// a 2
	// b 1
}
