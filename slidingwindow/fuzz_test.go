package slidingwindow_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
)

func FuzzSlidingWindow(f *testing.F) { limitertest.Fuzz(f, slidingwindow.Algorithm()) }
