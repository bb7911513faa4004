package slidingwindow_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
)

func FuzzSlidingWindow(f *testing.F) { limitertest.Fuzz(f, slidingwindow.Algorithm()) }
