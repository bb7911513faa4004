package leakybucket_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/leakybucket"
)

func FuzzLeakyBucket(f *testing.F) { limitertest.Fuzz(f, leakybucket.Algorithm()) }
