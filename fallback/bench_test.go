package fallback_test

import (
	"context"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// BenchmarkOpenBreaker: with the primary down and the breaker open, a decision costs what
// the local store costs, measured side by side.
func BenchmarkOpenBreaker(b *testing.B) {
	p := newPrimary()
	p.fail(errDown)
	open := fallback.New(p, localstore.New(), fallback.WithInstances(20))
	for range fallback.DefaultMinCalls {
		open.Apply(context.Background(), req("k", ratelimit.PerSecond(1e6)))
	}
	if open.BreakerState() != fallback.Open {
		b.Fatal("the breaker did not open")
	}
	for _, bc := range []struct {
		name  string
		store ratelimit.Store
	}{{"localstore", localstore.New()}, {"fallback-open", open}} {
		b.Run(bc.name, func(b *testing.B) {
			r := req("k", ratelimit.PerSecond(1e6))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.store.Apply(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
