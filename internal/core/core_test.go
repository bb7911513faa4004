package core_test

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

func TestCapacity(t *testing.T) {
	if c := core.Capacity(ratelimit.PerSecond(5)); c != 5 {
		t.Errorf("Capacity without burst = %d; want the limit, 5", c)
	}
	if c := core.Capacity(ratelimit.Rule{Limit: 5, Period: time.Second, Burst: 8}); c != 8 {
		t.Errorf("Capacity with burst 8 = %d", c)
	}
}

func TestShare(t *testing.T) {
	if got := core.Share(ratelimit.Rule{Limit: 10, Period: time.Second, Burst: 7}, 4); got != (ratelimit.Rule{Limit: 3, Period: time.Second, Burst: 2}) {
		t.Errorf("Share = %+v", got)
	}
	if got := core.Share(ratelimit.PerSecond(1), 20); got.Limit != 1 {
		t.Errorf("Share of 1 among 20 = %+v; want at least 1", got)
	}
	if got := core.Share(ratelimit.PerSecond(7), 1); got != ratelimit.PerSecond(7) {
		t.Errorf("Share among 1 = %+v; want the rule", got)
	}
}
