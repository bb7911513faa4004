package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/localstore"
)

const testRules = `
default: {capacity: 20, refill_per_second: 10}
routes:
  - {id: create-order, method: POST, prefix: /orders}
  - {id: list-orders, method: GET, prefix: /orders}
rules:
  - {tenant_id: shop-a, route_id: create-order, capacity: 2, refill_per_second: 1}
`

func newGateway(t *testing.T, store ratelimit.Store) (*limit, *atomic.Int64) {
	t.Helper()
	rules, err := parseRules([]byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	var current atomic.Pointer[Rules]
	current.Store(rules)
	var upstreamCalls atomic.Int64
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamCalls.Add(1)
		w.Write([]byte("ok"))
	})
	return &limit{next: next, store: store, rules: &current, metrics: newMetrics(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}, &upstreamCalls
}

func do(h http.Handler, method, path, tenant string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	if tenant != "" {
		r.Header.Set("X-Api-Key", tenant)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestRateLimitedRoute(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	g, upstream := newGateway(t, localstore.New(localstore.WithClock(clk)))
	want := []struct {
		status                                int
		remaining, reset, retry, policy, rate string
	}{
		{200, "1", "1", "", `"create-order";q=2;w=2`, `"create-order";r=1;t=1`},
		{200, "0", "2", "", `"create-order";q=2;w=2`, `"create-order";r=0;t=2`},
		{429, "0", "2", "1", `"create-order";q=2;w=2`, `"create-order";r=0;t=2`},
	}
	for i, w := range want {
		res := do(g, "POST", "/orders", "shop-a")
		h := res.Header()
		if res.Code != w.status || h.Get("X-RateLimit-Limit") != "2" || h.Get("X-RateLimit-Remaining") != w.remaining ||
			h.Get("X-RateLimit-Reset") != w.reset || h.Get("Retry-After") != w.retry ||
			h.Get("RateLimit-Policy") != w.policy || h.Get("RateLimit") != w.rate {
			t.Errorf("request %d: %d %v; want %+v", i+1, res.Code, h, w)
		}
	}
	if res := do(g, "POST", "/orders", "shop-a"); res.Header().Get("Content-Type") != "application/json" {
		t.Errorf("a 429 without a JSON body: %v", res.Header())
	}
	if upstream.Load() != 2 {
		t.Errorf("the upstream saw %d requests; want 2", upstream.Load())
	}
	clk.Advance(time.Second)
	if res := do(g, "POST", "/orders", "shop-a"); res.Code != 200 {
		t.Errorf("a second later: %d; want 200", res.Code)
	}
}

func TestNoAPIKey(t *testing.T) {
	g, upstream := newGateway(t, localstore.New())
	if res := do(g, "GET", "/orders", ""); res.Code != 401 || upstream.Load() != 0 {
		t.Errorf("no X-Api-Key: %d, upstream called %d times; want 401 and none", res.Code, upstream.Load())
	}
}

func TestDefaultRule(t *testing.T) {
	g, _ := newGateway(t, localstore.New())
	for _, tc := range []struct{ tenant, method, path string }{
		{"shop-z", "POST", "/orders"}, // a tenant without rules
		{"shop-a", "GET", "/orders"},  // shop-a on a route without its own rule
		{"shop-a", "GET", "/else"},    // the default route
	} {
		res := do(g, tc.method, tc.path, tc.tenant)
		if res.Code != 200 || res.Header().Get("X-RateLimit-Limit") != "20" || res.Header().Get("X-RateLimit-Remaining") != "19" {
			t.Errorf("%+v: %d %v; want the default rule, 20", tc, res.Code, res.Header())
		}
	}
}

// TestCraftedNamesNeverCollide: tenants whose names mimic other tenants' keys each get
// their own limit; the characters of keys (":", "{", "}", "%") are not a tenant's.
func TestCraftedNamesNeverCollide(t *testing.T) {
	g, _ := newGateway(t, localstore.New())
	for _, tenant := range []string{"shop-a:create-order", "{shop-a}", "shop-a}:create-order:{x", "shop-a%3Acreate-order"} {
		if res := do(g, "POST", "/orders", tenant); res.Code != 400 {
			t.Errorf("%q: %d; want 400", tenant, res.Code)
		}
	}
	tenants := []string{"shop-a", "shop-a/create-order", "shop-a.create-order", "shop-a=create-order", "shop-a_create-order", "create-order/shop-a"}
	for _, tenant := range tenants {
		if res := do(g, "POST", "/orders", tenant); res.Code != 200 {
			t.Fatalf("%q: first request %d", tenant, res.Code)
		}
	}
	for _, tenant := range tenants[1:] {
		if rem := do(g, "POST", "/orders", tenant).Header().Get("X-RateLimit-Remaining"); rem != "18" {
			t.Errorf("tenant %q: %s left after 2 of 20: it shares a key", tenant, rem)
		}
	}
}

type failing struct{}

func (failing) Apply(context.Context, core.Request) (core.Outcome, error) {
	return core.Outcome{}, errors.New("the store is broken")
}

// TestStoreErrorPasses: a limiter error never becomes an error for the client.
func TestStoreErrorPasses(t *testing.T) {
	g, upstream := newGateway(t, failing{})
	if res := do(g, "POST", "/orders", "shop-a"); res.Code != 200 || upstream.Load() != 1 {
		t.Errorf("with the store failing: %d, upstream %d; want the request passed", res.Code, upstream.Load())
	}
}

func TestPerClientIP(t *testing.T) {
	g, _ := newGateway(t, localstore.New())
	g.trusted = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	send := func(xff string) string {
		r := httptest.NewRequest("POST", "/orders", nil)
		r.RemoteAddr = "10.0.0.1:4000"
		r.Header.Set("X-Api-Key", "shop-a")
		r.Header.Set("X-Forwarded-For", xff)
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		return w.Header().Get("X-RateLimit-Remaining")
	}
	if a, b := send("203.0.113.7"), send("203.0.113.8"); a != "1" || b != "1" {
		t.Errorf("two clients behind the proxy: %s and %s left; want a limit each", a, b)
	}
	if again := send("198.51.100.1, 203.0.113.7"); again != "0" {
		t.Errorf("a spoofed left-hand address moved the client: %s left", again)
	}
}

// TestIdentityCanonical: an X-Api-Key padded with spaces and tabs is the same tenant, and
// the upstream sees it as the limit counted it; two keys, a key with anything but
// letters, digits and "-._~+/=" (control characters, bytes that are not UTF-8, Unicode
// spaces, an inner space) and an oversized key are refused before any decision.
func TestIdentityCanonical(t *testing.T) {
	g, upstream := newGateway(t, localstore.New())
	var seen atomic.Pointer[string]
	next := g.next
	g.next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("X-Api-Key")
		seen.Store(&k)
		next.ServeHTTP(w, r)
	})
	for i, key := range []string{"shop-a", "shop-a ", "shop-a" + strings.Repeat(" ", 5), "  shop-a\t"} {
		res := do(g, "POST", "/orders", key)
		if i < 2 && (res.Code != 200 || *seen.Load() != "shop-a") {
			t.Errorf("X-Api-Key %q: %d, the upstream saw %q; want 200 and shop-a", key, res.Code, *seen.Load())
		}
		if i >= 2 && res.Code != 429 {
			t.Errorf("X-Api-Key %q: %d; want 429: the same tenant as shop-a, whose 2 are spent", key, res.Code)
		}
	}
	calls := upstream.Load()
	for key, want := range map[string]int{
		"shop-a\x00x":                400,
		"shop\x7f":                   400,
		"shop-a\x85":                 400, // not UTF-8
		"shop-a\xff":                 400,
		"shop-a\u0085":               400, // NEL, a Unicode space
		"shop\u200b-a":               400, // a zero-width space
		"shop-a x":                   400, // as a header folded over two lines arrives
		"shöp-a":                     400,
		strings.Repeat("k", 129):     431,
		strings.Repeat("k", 900<<10): 431,
	} {
		if res := do(g, "POST", "/orders", key); res.Code != want {
			t.Errorf("X-Api-Key %q (%d bytes): %d; want %d", key[:min(len(key), 20)], len(key), res.Code, want)
		}
	}
	r := httptest.NewRequest("POST", "/orders", nil)
	r.Header.Add("X-Api-Key", "shop-b")
	r.Header.Add("X-Api-Key", "shop-c")
	w := httptest.NewRecorder()
	g.ServeHTTP(w, r)
	if w.Code != 400 {
		t.Errorf("two X-Api-Key headers: %d; want 400", w.Code)
	}
	if upstream.Load() != calls {
		t.Errorf("refused identities reached the upstream")
	}
	for _, key := range []string{"Zm9vYmFy+/==", "tenant_7.eu~1"} { // base64 and the URL's unreserved
		if res := do(g, "POST", "/orders", key); res.Code != 200 {
			t.Errorf("X-Api-Key %q: %d; want 200", key, res.Code)
		}
	}
}

// TestMethodCase: a method is matched as HTTP defines it, case-sensitively; "post" does
// not slip past the POST route's rule to an upstream that folds case: it is refused.
func TestMethodCase(t *testing.T) {
	g, upstream := newGateway(t, localstore.New())
	for _, m := range []string{"post", "Post", "get"} {
		if res := do(g, m, "/orders", "shop-a"); res.Code != http.StatusNotImplemented {
			t.Errorf("method %q: %d; want 501", m, res.Code)
		}
	}
	if upstream.Load() != 0 {
		t.Errorf("a lower-case method reached the upstream")
	}
	if res := do(g, "POST", "/orders", "shop-a"); res.Code != 200 || res.Header().Get("X-RateLimit-Limit") != "2" {
		t.Errorf("POST /orders: %d %v; want shop-a's create-order rule", res.Code, res.Header())
	}
}

// TestInFlightRoute: a rule's in_flight bounds its (tenant, route)'s requests in progress
// at once; one too many gets a JSON 429, counted; other tenants and routes are not held.
func TestInFlightRoute(t *testing.T) {
	rules, err := parseRules([]byte(`
default: {capacity: 100, refill_per_second: 100}
routes:
  - {id: export, prefix: /export}
rules:
  - {tenant_id: shop-a, route_id: export, capacity: 100, refill_per_second: 100, in_flight: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	var current atomic.Pointer[Rules]
	current.Store(rules)
	started, release := make(chan struct{}, 10), make(chan struct{})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") != "" {
			started <- struct{}{}
			<-release
		}
		w.Write([]byte("ok"))
	})
	g := &limit{next: next, store: localstore.New(), rules: &current, metrics: newMetrics(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	done := make(chan int, 2)
	for range 2 {
		go func() { done <- do(g, "GET", "/export?slow=1", "shop-a").Code }()
		<-started
	}
	res := do(g, "GET", "/export", "shop-a")
	if res.Code != http.StatusTooManyRequests || res.Header().Get("Retry-After") != "1" ||
		!strings.Contains(res.Body.String(), `"error":"too many requests in progress"`) ||
		!strings.Contains(res.Body.String(), `"in_flight_limit":2`) {
		t.Errorf("a third export in progress: %d %v %s; want a JSON 429", res.Code, res.Header(), res.Body)
	}
	if res := do(g, "GET", "/export", "shop-b"); res.Code != 200 {
		t.Errorf("another tenant: %d", res.Code)
	}
	if res := do(g, "GET", "/other", "shop-a"); res.Code != 200 {
		t.Errorf("another route: %d", res.Code)
	}
	close(release)
	for range 2 {
		if code := <-done; code != 200 {
			t.Errorf("a slow export: %d", code)
		}
	}
	if res := do(g, "GET", "/export", "shop-a"); res.Code != 200 {
		t.Errorf("after the slow ones ended: %d; want 200", res.Code)
	}
	metrics := httptest.NewRecorder()
	g.metrics.handler().ServeHTTP(metrics, httptest.NewRequest("GET", "/metrics", nil))
	if want := `ratelimit_decisions_total{outcome="in_flight_denied",route="export"} 1`; !strings.Contains(metrics.Body.String(), want) {
		t.Errorf("metrics hold no %q", want)
	}
}

// TestEnvoyRules: with -envoy-rules, a request's descriptors are its api_key, route,
// path and method as the file's tree names them, decided all or none.
func TestEnvoyRules(t *testing.T) {
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, []byte(`
domain: public-api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := localstore.New(localstore.WithClock(clk))
	g, upstream := newGateway(t, store)
	var err error
	if g.envoy, err = newEnvoyRules(path, store); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if res := do(g, "POST", "/login", "shop-a"); res.Code != 200 {
			t.Fatalf("login %d: %d", i+1, res.Code)
		}
	}
	res := do(g, "POST", "/login", "shop-b") // 5 a minute on /login, for everyone
	if res.Code != http.StatusTooManyRequests || res.Header().Get("X-RateLimit-Limit") != "5" || res.Header().Get("Retry-After") != "60" {
		t.Errorf("a sixth login: %d %v; want 429 under /login's 5 a minute", res.Code, res.Header())
	}
	res = do(g, "GET", "/orders", "shop-b") // shop-b's own 100 lost nothing to the denied login
	if res.Code != 200 || res.Header().Get("X-RateLimit-Remaining") != "99" {
		t.Errorf("shop-b elsewhere: %d %v; want 200 with 99 of its 100 left", res.Code, res.Header())
	}
	if upstream.Load() != 6 {
		t.Errorf("upstream saw %d requests; want 6", upstream.Load())
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 1}}\n"), 0o644)
	if _, err := newEnvoyRules(bad, store); err == nil || !strings.Contains(err.Error(), "remote_address") {
		t.Errorf("a key the gateway cannot fill: %v", err)
	}
}

// TestPathForms: shop-a's create-order (2 at once) cannot be reached past its rule by
// path forms the upstream reads as /orders: an encoded slash and a path parameter are
// refused, another case and dot segments count as create-order, and the upstream gets
// the path the limit counted.
func TestPathForms(t *testing.T) {
	g, upstream := newGateway(t, localstore.New())
	var paths []string
	next := g.next
	g.next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		next.ServeHTTP(w, r)
	})
	admitted := 0
	for _, c := range []struct {
		path string
		code int // 0: 200 or 429, under create-order
	}{
		{"/orders", 0}, {"/search%2F..%2Forders", 400}, {"/search%2f..%2forders", 400}, {"/orders%5C", 400},
		{"/orders;x", 400}, {"/orders\\", 400}, {"/ORDERS", 0}, {"/Orders/", 0}, {"/search/../orders", 0},
		{"//orders", 0}, {"/./orders", 0}, {"/orders/%2e%2e/orders", 0},
	} {
		for range 10 {
			res := do(g, "POST", c.path, "shop-a")
			switch {
			case c.code != 0 && res.Code != c.code:
				t.Errorf("POST %s: %d; want %d", c.path, res.Code, c.code)
			case c.code == 0 && res.Code == 200:
				admitted++
			case c.code == 0 && (res.Code != 429 || res.Header().Get("RateLimit-Policy") != `"create-order";q=2;w=2`):
				t.Errorf("POST %s: %d, %q; want 429 under create-order", c.path, res.Code, res.Header().Get("RateLimit-Policy"))
			}
		}
	}
	if admitted != 2 || upstream.Load() != 2 {
		t.Errorf("%d admitted, %d reached the upstream over every path form; want 2 (create-order's burst)", admitted, upstream.Load())
	}
	for _, p := range paths {
		if strings.ToLower(strings.TrimSuffix(p, "/")) != "/orders" {
			t.Errorf("the upstream got %q; want the cleaned path", p)
		}
	}
}

// With -reserves 0,20,50, a route's priority chooses each request's class within one
// (tenant, route) limit: /report's GET is sheddable and its POST critical, both of the
// route "report" (a bucket of 10). Sheddable GETs take 5, then a GET that asks for
// X-Priority: sheddable on a normal route is shed as well, and a POST still gets the
// rest; a client cannot raise its class with the header.
func TestPriorityByRouteAndHeader(t *testing.T) {
	const rules = `
default: {capacity: 10, refill_per_second: 1}
routes:
  - {id: report, method: GET, prefix: /report, priority: sheddable}
  - {id: report, method: POST, prefix: /report, priority: critical}
  - {id: search, prefix: /search}
`
	rs, err := parseRules([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	reserves, err := parseReserves("0, 20, 50")
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	g, _ := newGateway(t, localstore.New(localstore.WithClock(clk)))
	g.rules.Store(rs)
	g.reserves = reserves
	count := func(method, path, priority string, n int) (ok int) {
		for range n {
			r := httptest.NewRequest(method, path, nil)
			r.Header.Set("X-Api-Key", "shop-a")
			if priority != "" {
				r.Header.Set("X-Priority", priority)
			}
			w := httptest.NewRecorder()
			g.ServeHTTP(w, r)
			if w.Code == http.StatusOK {
				ok++
			}
		}
		return ok
	}
	if got := count("GET", "/report", "critical", 10); got != 5 { // the header cannot raise it
		t.Errorf("sheddable GETs (claiming critical) admitted %d of 10; want 5", got)
	}
	if got := count("POST", "/report", "", 10); got != 5 {
		t.Errorf("critical POSTs admitted %d of 10; want the other 5", got)
	}
	if got := count("GET", "/search", "sheddable", 10); got != 5 {
		t.Errorf("GETs of a normal route asking to be sheddable admitted %d of 10; want 5", got)
	}
	if got := count("GET", "/search", "", 10); got != 3 {
		t.Errorf("normal GETs after them admitted %d of 10; want 3", got)
	}
	for _, bad := range []string{"0,x", "120", "50,20"} {
		if _, err := parseReserves(bad); err == nil {
			t.Errorf("-reserves %q accepted", bad)
		}
	}
	if _, err := parseRules([]byte("default: {capacity: 1, refill_per_second: 1}\nroutes:\n  - {id: a, prefix: /a, priority: urgent}\n")); err == nil {
		t.Error("a route of priority urgent accepted")
	}
}

// A rule's quota beside its rate: 3 a month for shop-q, decided with the route's rate
// all or none; the fourth request of January is a 429 whose headers name both
// policies, the quota binding (1 minute to February); in February it passes again. A
// request the rate denies takes nothing from the quota.
func TestQuotaBesideRate(t *testing.T) {
	const rules = `
default: {capacity: 10, refill_per_second: 5}
routes:
  - {id: search, prefix: /search}
rules:
  - {tenant_id: shop-q, route_id: search, capacity: 2, refill_per_second: 1, quota: "3 per month in UTC"}
`
	rs, err := parseRules([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2027, 1, 31, 23, 58, 0, 0, time.UTC))
	g, _ := newGateway(t, localstore.New(localstore.WithClock(clk)))
	g.rules.Store(rs)
	codes := func(n int) (ok, denied int, last *httptest.ResponseRecorder) {
		for range n {
			last = do(g, "GET", "/search", "shop-q")
			if last.Code == http.StatusOK {
				ok++
			} else {
				denied++
			}
		}
		return ok, denied, last
	}
	if ok, _, _ := codes(3); ok != 2 { // the rate's 2 at once; the third denied by the rate
		t.Fatalf("3 requests at once: %d passed; want the rate's 2", ok)
	}
	clk.Advance(time.Minute) // 23:59: the rate refilled; the quota has 1 left, not 0
	ok, _, _ := codes(1)
	_, denied, w := codes(1)
	if ok != 1 || denied != 1 {
		t.Fatalf("at 23:59: %d passed, %d denied; want the quota's third, then a 429", ok, denied)
	}
	if got, want := w.Header().Get("RateLimit-Policy"), `"search";q=2;w=2, "quota";q=3;w=2592000`; got != want {
		t.Errorf("RateLimit-Policy %q; want %q", got, want)
	}
	if got, want := w.Header().Get("RateLimit"), `"quota";r=0;t=60`; got != want {
		t.Errorf("RateLimit %q; want %q", got, want)
	}
	if got := w.Header().Get("Retry-After"); got != "60" {
		t.Errorf("Retry-After %q; want 60", got)
	}
	clk.Set(time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC))
	if w := do(g, "GET", "/search", "shop-q"); w.Code != http.StatusOK || w.Header().Get("RateLimit") != `"search";r=1;t=1` {
		t.Errorf("in February: %d, RateLimit %q; want 200, the rate binding", w.Code, w.Header().Get("RateLimit"))
	}
	if _, err := parseRules([]byte("default: {capacity: 1, refill_per_second: 1, quota: \"3 per fortnight\"}\n")); err == nil {
		t.Error("a quota per fortnight accepted")
	}
}

// TestDenied: /denied names the (tenant, route) keys denied most over the last minute.
func TestDenied(t *testing.T) {
	g, _ := newGateway(t, localstore.New())
	for range 5 { // shop-a's create-order allows 2 at once: 3 denied
		do(g, "POST", "/orders", "shop-a")
	}
	for range 21 { // the default allows 20 at once: 1 denied
		do(g, "GET", "/orders", "shop-b")
	}
	res := httptest.NewRecorder()
	g.metrics.deniedHandler().ServeHTTP(res, httptest.NewRequest("GET", "/denied?n=5", nil))
	want := `{"denied":[{"key":"{shop-a}:create-order","count":3,"error":0},{"key":"{shop-b}:list-orders","count":1,"error":0}],"window_seconds":60}` + "\n"
	if res.Code != 200 || res.Body.String() != want {
		t.Errorf("/denied: %d %s; want %s", res.Code, res.Body.String(), want)
	}
}
