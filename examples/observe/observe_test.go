package observe_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/observe"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// decide drives a Middleware with hook: three requests of a rule of 2, on a fallback
// store whose primary decides, and one shadowed denial.
func decide(t *testing.T, hook func(context.Context, ratelimit.Event)) {
	t.Helper()
	l, err := tokenbucket.New(fallback.New(localstore.New(), localstore.New(), fallback.WithTimeout(time.Minute)), ratelimit.PerHour(2), ratelimit.WithNamespace("api"))
	if err != nil {
		t.Fatal(err)
	}
	key := func(*http.Request) (string, error) { return "k", nil }
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	h := (&ratelimit.Middleware{Limiter: l, Key: key, OnDecision: hook}).Wrap(ok)
	for range 3 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	shadow := (&ratelimit.Middleware{Limiter: l, Key: key, OnDecision: hook, Shadow: true}).Wrap(ok)
	shadow.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	hook(context.Background(), ratelimit.Event{Policy: "default", Err: errors.New("down"), Latency: time.Millisecond})
}

func TestPrometheus(t *testing.T) {
	reg := prometheus.NewRegistry()
	hook, err := observe.Prometheus(reg)
	if err != nil {
		t.Fatal(err)
	}
	decide(t, hook)
	want := `
# HELP ratelimit_decisions_total Rate-limit decisions by policy, outcome (allowed, denied, shadow_denied, error) and the store that decided.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{outcome="allowed",policy="default",source="primary"} 2
ratelimit_decisions_total{outcome="denied",policy="default",source="primary"} 1
ratelimit_decisions_total{outcome="error",policy="default",source="local"} 1
ratelimit_decisions_total{outcome="shadow_denied",policy="default",source="primary"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_decisions_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "ratelimit_decision_duration_seconds"); n != 1 {
		t.Errorf("%d latency series; want 1", n)
	}
	if _, err := observe.Prometheus(reg); err == nil {
		t.Error("registering twice: no error")
	}
}

func TestOpenTelemetry(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	hook, err := observe.OpenTelemetry(provider.Meter("ratelimit"))
	if err != nil {
		t.Fatal(err)
	}
	decide(t, hook)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	var latencies uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					outcome, _ := p.Attributes.Value(attribute.Key("outcome"))
					source, _ := p.Attributes.Value(attribute.Key("source"))
					counts[outcome.AsString()+"/"+source.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					latencies += p.Count
				}
			}
		}
	}
	want := map[string]int64{"allowed/primary": 2, "denied/primary": 1, "shadow_denied/primary": 1, "error/local": 1}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("ratelimit.decisions %s = %d; want %d (all: %v)", k, counts[k], v, counts)
		}
	}
	if latencies != 5 {
		t.Errorf("%d latencies recorded; want 5", latencies)
	}
}
