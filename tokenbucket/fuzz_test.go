package tokenbucket_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

func FuzzTokenBucket(f *testing.F) { limitertest.Fuzz(f, tokenbucket.Algorithm()) }
