package observe_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/observe"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// A Middleware's decisions as Prometheus metrics: one line.
func ExamplePrometheus() {
	reg := prometheus.NewRegistry() // prometheus.DefaultRegisterer in a service
	limiter, _ := tokenbucket.New(localstore.New(), ratelimit.PerHour(2))
	mw := &ratelimit.Middleware{Limiter: limiter, Key: func(*http.Request) (string, error) { return "k", nil }}
	var err error
	if mw.OnDecision, err = observe.Prometheus(reg); err != nil {
		fmt.Println(err)
		return
	}
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 3 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ratelimit_decisions_total Rate-limit decisions by policy, outcome (allowed, denied, shadow_denied, error) and the store that decided.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{outcome="allowed",policy="default",source="local"} 2
ratelimit_decisions_total{outcome="denied",policy="default",source="local"} 1
`), "ratelimit_decisions_total")
	fmt.Println("metrics as expected:", err == nil)
	// Output: metrics as expected: true
}
