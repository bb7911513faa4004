package fixedwindow_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
)

func FuzzFixedWindow(f *testing.F) { limitertest.Fuzz(f, fixedwindow.Algorithm()) }

// FuzzReceipts: refunds of charges parked and settled later never create allowance.
func FuzzReceipts(f *testing.F) { limitertest.FuzzReceipts(f, fixedwindow.Algorithm()) }

// TestSteps: the numbers of the package doc, and the table every store runs, on the step
// alone.
func TestSteps(t *testing.T) { limitertest.RunSteps(t, fixedwindow.Algorithm()) }
