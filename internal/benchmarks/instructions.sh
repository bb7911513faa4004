#!/bin/bash
# instructions.sh BENCH... prints the instructions per decision of each benchmark, counted
# by valgrind's callgrind (which does not depend on the machine's load): the benchmark
# binary runs at 100000 and 300000 iterations, and the difference is divided by 200000,
# which removes the start-up. Go's asynchronous preemption signals break callgrind, hence
# GODEBUG=asyncpreemptoff=1 and -test.cpu 1. Needs valgrind (apt-get install valgrind).
# The profiles stay in a temporary directory, for callgrind_annotate.
#
#   cd internal/benchmarks && ./instructions.sh 'Local/ratelimit-tokenbucket$/serial' 'Local/sethvargo-memorystore$/serial'
set -euo pipefail
cd "$(dirname "$0")"
. ./lib.sh
dir=$(mktemp -d)
bin=$dir/bench.test
build_bench "$dir"
i=0
for b in "$@"; do
  declare -A ir
  for n in 100000 300000; do
    out=$(mktemp)
    # a run can die of an instruction valgrind lacks (RDTSCP, in a runtime lock that
    # spins now and then): it is run again, five times at most
    for _ in 1 2 3 4 5; do
      GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.$i.$n.out" \
        "$bin" -test.run '^$' -test.bench "^Benchmark$b" -test.benchtime ${n}x -test.cpu 1 >/dev/null 2>"$out" || true
      ir[$n]=$(grep -o 'Collected : [0-9]*' "$out" | awk '{print $3}' || true)
      [ -n "${ir[$n]}" ] && ! grep -q 'SIGILL' "$out" && break
    done
    rm -f "$out"
    [ -n "${ir[$n]}" ] || { echo "$b: callgrind failed five times" >&2; exit 1; }
  done
  echo "$b: $(( (${ir[300000]} - ${ir[100000]}) / 200000 )) instructions per decision"
  echo "  (where they go: callgrind_annotate $dir/callgrind.$i.300000.out)"
  i=$((i + 1))
done
