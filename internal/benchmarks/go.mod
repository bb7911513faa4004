module github.com/ratelimit-go/ratelimit/internal/benchmarks

go 1.26.0

require (
	github.com/ratelimit-go/ratelimit v0.0.0
	github.com/sethvargo/go-limiter v0.7.1
	golang.org/x/time v0.16.0
)

replace github.com/ratelimit-go/ratelimit => ../..
