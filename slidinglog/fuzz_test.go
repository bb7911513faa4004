package slidinglog_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/slidinglog"
)

func FuzzSlidingLog(f *testing.F) { limitertest.Fuzz(f, slidinglog.Algorithm()) }
