package localstore_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
	"github.com/ratelimit-go/ratelimit/localstore"
)

func TestConformance(t *testing.T) {
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return localstore.New(localstore.WithClock(clk))
	})
}
