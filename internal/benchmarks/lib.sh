# lib.sh: what the measuring scripts of this folder share. They source it from this
# folder (". ./lib.sh" after cd-ing here); it is not run on its own.

# build_bench DIR builds this module's benchmark binary as DIR/bench.test.
build_bench() {
  GOWORK=off go test -c -o "$1/bench.test" .
}

# free_port prints a port in 20000-39999 that no redis-server answers on.
free_port() {
  local port=$((20000 + RANDOM % 20000))
  while redis-cli -p "$port" ping >/dev/null 2>&1; do port=$((20000 + RANDOM % 20000)); done
  echo "$port"
}

# redis_bench_setup BENCH N sets what the Redis scripts start from: bench and n (their
# arguments), dir (a new temporary directory, with the benchmark binary built in it) and
# port (free, for the redis-server they start).
redis_bench_setup() {
  bench=$1
  n=$2
  dir=$(mktemp -d)
  port=$(free_port)
  build_bench "$dir"
}

# wait_up PORT TRIES polls the redis-server on PORT every tenth of a second until it
# answers, TRIES times at most.
wait_up() {
  for _ in $(seq "$2"); do
    redis-cli -p "$1" ping >/dev/null 2>&1 && return
    sleep 0.1
  done
}
