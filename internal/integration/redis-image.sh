#!/usr/bin/env bash
# Builds a Redis image from this machine's redis-server, for a Docker engine that cannot
# pull one (CI's machine reaches no registry): the binary and the shared libraries ldd
# lists, under their own paths, imported as an image whose entrypoint is redis-server.
# About 18 MB; it takes seconds. It has no shell, so it serves the host network only
# (RATELIMIT_REDIS_NETWORK=host; see package containers).
#
#   ./redis-image.sh [TAG]      # TAG defaults to ratelimit-test/redis-server:local
#   RATELIMIT_REDIS=container RATELIMIT_REDIS_IMAGE=ratelimit-test/redis-server:local \
#     RATELIMIT_REDIS_NETWORK=host GOWORK=off go test ./...
set -euo pipefail
tag=${1:-ratelimit-test/redis-server:local}
# Debian's redis-server is a link to redis-check-rdb, which acts by the name it is run by:
# copy the file under the name redis-server.
bin=$(readlink -f "$(command -v redis-server)")
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/bin" "$root/data" "$root/tmp"
chmod 1777 "$root/tmp"
cp "$bin" "$root/usr/bin/redis-server"
for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done
tar -C "$root" -c . | docker import \
	--change 'ENTRYPOINT ["/usr/bin/redis-server"]' --change 'WORKDIR /data' - "$tag" >/dev/null
echo "$tag"
