package tokenbucket_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/tokenbucket"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
)

func FuzzTokenBucket(f *testing.F) { limitertest.Fuzz(f, tokenbucket.Algorithm()) }
