package slidinglog_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
)

func FuzzSlidingLog(f *testing.F) { limitertest.Fuzz(f, slidinglog.Algorithm()) }
