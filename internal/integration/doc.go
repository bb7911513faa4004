// Package integration holds the tests of redisstore that need what the library's own
// module must not require: Redis in containers (testcontainers-go), miniredis, testify.
// It is a module of its own, outside the workspace (run with GOWORK=off), so that none of
// its dependencies reaches the library's go.mod or its users' go.sum.
//
// The tests run the suite every Redis must pass (internal/testkit/redissuite) on the servers
// RATELIMIT_REDIS chooses:
//   - "process": redis-server processes of this machine, as the library's own tests do;
//   - "container": containers of RATELIMIT_REDIS_IMAGE (redis:7-alpine by default),
//     through package containers;
//   - unset: processes when redis-server is on the PATH, else containers when a Docker
//     engine answers, else the tests are skipped (or fail, with RATELIMIT_REQUIRE_REDIS=1).
//
// and the conformance and parity tests on miniredis, whose TTLs move with the fake clock.
package integration
