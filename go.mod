module github.com/ratelimit-go/ratelimit

go 1.25
