#!/bin/bash
# redis-instructions.sh BENCH N prints the instructions redis-server spends per decision
# while one of this module's Redis benchmarks runs, counted by valgrind's callgrind (which
# does not depend on the machine's load): a redis-server runs under callgrind on a free
# port, the benchmark runs N and then 3N decisions against it (REDIS_ADDR), and the
# difference of the two totals is divided by 2N, which removes the server's start-up.
# Under callgrind the server is slow, so batches are larger than at full speed; compare
# implementations with each other, in the same run. Needs valgrind and redis-server.
#
#   cd internal/benchmarks
#   ./redis-instructions.sh 'Redis$/ratelimit-tokenbucket$/parallel-32' 20000
#   ./redis-instructions.sh 'Redis$/redis_rate$/parallel-32' 20000
set -euo pipefail
cd "$(dirname "$0")"
. ./lib.sh
redis_bench_setup "$@"

# count N: the server's instructions for a run of the benchmark at N decisions
count() {
  valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.$1.out" \
    redis-server --port "$port" --save '' --appendonly no >/dev/null 2>"$dir/valgrind.$1" &
  local server=$!
  wait_up "$port" 600 # up within a minute, under valgrind
  REDIS_ADDR=127.0.0.1:$port "$dir/bench.test" -test.run '^$' -test.bench "^Benchmark$bench" \
    -test.benchtime "${1}x" >/dev/null
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$server" || true
  grep -o 'Collected : [0-9]*' "$dir/valgrind.$1" | awk '{print $3}'
}
a=$(count "$n")
b=$(count $((3 * n)))
echo "$bench: $(((b - a) / (2 * n))) server instructions per decision"
echo "  (where they go: callgrind_annotate $dir/callgrind.$((3 * n)).out)"
