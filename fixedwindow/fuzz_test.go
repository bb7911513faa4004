package fixedwindow_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
)

func FuzzFixedWindow(f *testing.F) { limitertest.Fuzz(f, fixedwindow.Algorithm()) }
