module github.com/ratelimit-go/ratelimit/examples/llmlimit

go 1.25.0

require github.com/ratelimit-go/ratelimit v0.0.0

replace github.com/ratelimit-go/ratelimit => ../../
