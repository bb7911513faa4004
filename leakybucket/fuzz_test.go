package leakybucket_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
)

func FuzzLeakyBucket(f *testing.F) { limitertest.Fuzz(f, leakybucket.Algorithm()) }
