// Package benchmarks measures this library side by side with its peers in one run. It is
// a nested module so that the peers never enter the library's go.mod.
//
//	cd internal/benchmarks && go test -run '^$' -bench . -benchmem
package benchmarks
