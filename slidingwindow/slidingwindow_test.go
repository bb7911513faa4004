package slidingwindow_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
)

func FuzzSlidingWindow(f *testing.F) { limitertest.Fuzz(f, slidingwindow.Algorithm()) }

// FuzzReceipts: refunds of charges parked and settled later never create allowance.
func FuzzReceipts(f *testing.F) { limitertest.FuzzReceipts(f, slidingwindow.Algorithm()) }

// TestSteps: the numbers of the package doc, and the table every store runs, on the step
// alone.
func TestSteps(t *testing.T) { limitertest.RunSteps(t, slidingwindow.Algorithm()) }
