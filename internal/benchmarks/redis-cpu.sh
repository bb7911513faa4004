#!/bin/bash
# redis-cpu.sh BENCH N prints what one of this module's Redis benchmarks costs per decision
# in CPU time, on each side: the benchmark process (user and system) and a redis-server
# started for it on a free port (from /proc), with the server's own count of script calls
# and their time (INFO commandstats). Together with the benchmark's ns/op they tell whether
# the two CPUs were busy or waiting. Needs redis-server and redis-cli.
#
#   cd internal/benchmarks
#   ./redis-cpu.sh 'Redis$/ratelimit-tokenbucket$/parallel-32' 200000
set -euo pipefail
cd "$(dirname "$0")"
. ./lib.sh
redis_bench_setup "$@"

redis-server --port "$port" --save '' --appendonly no >/dev/null &
server=$!
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$server" || true' EXIT
wait_up "$port" 100
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$server/stat"; } # the server's user and system ticks
before=$(cpu)
TIMEFORMAT='%U %S'
client=$( { time REDIS_ADDR=127.0.0.1:$port "$dir/bench.test" -test.run '^$' -test.bench "^Benchmark$bench" \
  -test.benchtime "${n}x" >"$dir/out" ; } 2>&1 )
after=$(cpu)
grep Benchmark "$dir/out"
redis-cli -p "$port" info commandstats | tr -d '\r' | grep -E '^cmdstat_evalsha:' | cut -d, -f1-3
awk -v c="$client" -v s="$((after - before))" -v t="$ticks" -v n="$n" 'BEGIN {
  split(c, u, " ")
  printf "client %.2f us of CPU per decision, server %.2f us\n", (u[1] + u[2]) * 1e6 / n, s / t * 1e6 / n
}'
