#!/usr/bin/env bash
# What one write costs Redis on a 3-master Redis Cluster against one
# standalone redis-server: Redis CPU (used_cpu_user + used_cpu_sys, summed
# over the cluster's masters) per 100,000 commands of a bare
# `SET key value PX 5000` (a W2 bucket's value and expiry), sent by
# `redis-benchmark -c 64 -P 16` over W2's 100,000 keys (to the cluster with
# `--cluster`, which gives each node keys of its own slots: 33,334 a node,
# `-r 33334`, as W2's 100,000 keys spread over three masters), rounds
# interleaved: one Redis, one Redis with a replica, the cluster. A decision on a cluster
# writes its key as a decision on one Redis does: the ratio of the bare
# writes is the floor of `benches/cluster.sh`'s ratio for any limiter.
# Prints each row, then the medians and their ratios.
#
#     benches/cluster_floor.sh          # ROUNDS=5 COMMANDS=2000000
#
# Needs redis-server, redis-cli and redis-benchmark; the cluster is
# benches/peers/tools/redis-cluster.sh's (3 masters, 1 replica each), or
# $CLUSTER_TOOL's. Nothing is pinned, as in benches/cluster.sh: six servers
# share the machine's cores with redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${ROUNDS:=5}"
: "${COMMANDS:=2000000}"
: "${CLUSTER_TOOL:=$(cd "$(dirname "$0")" && pwd)/peers/tools/redis-cluster.sh}"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu() { redis-cli -p "$1" info cpu | awk -F: '/used_cpu_(sys|user):/{s+=$2} END{printf "%.6f", s}'; }
sum_cpu() { local total=0 p; for p in "$@"; do total=$(python3 -c "print($total + $(cpu "$p"))"); done; echo "$total"; }
dir=$(mktemp -d)
base=$((20000 + RANDOM % 20000))
export CLUSTER_DIR="$dir/cluster"
cleanup() {
  for f in "$dir"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  "$CLUSTER_TOOL" down "$base" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
server() { # name port [args...]
  mkdir -p "$dir/$1"
  redis-server --port "$2" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir/$1" \
    --logfile "$dir/$1.log" --daemonize yes --pidfile "$dir/$1.pid" "${@:3}"
  until redis-cli -p "$2" ping >/dev/null 2>&1; do sleep 0.05; done
}
one=$(free_port)
server one "$one"
primary=$(free_port)
server primary "$primary"
replica=$(free_port)
server replica "$replica" --replicaof 127.0.0.1 "$primary"
until redis-cli -p "$primary" info replication | grep -q 'slave0:.*state=online'; do sleep 0.05; done
"$CLUSTER_TOOL" up "$base" 3 >/dev/null
read -r -a masters <<<"$(redis-cli -p "$base" cluster nodes | awk '/master/ {split($2,a,"[:@]"); printf "%s ", a[2]}')"

write=(SET "rl:{tag}:__rand_int__" 1796305279252249:4 PX 5000)
measure() { # label "ports measured" redis-benchmark arguments...
  local label=$1 ports=$2 before after
  shift 2
  for p in $ports; do redis-cli -p "$p" flushall >/dev/null; done
  before=$(sum_cpu $ports)
  redis-benchmark -c 64 -P 16 -n "$COMMANDS" "$@" "${write[@]}" >/dev/null 2>&1
  after=$(sum_cpu $ports)
  python3 -c "print(f'{($after - $before) * 100000 / $COMMANDS:.3f}')" | tee -a "$dir/$label.cpu" | sed "s/^/$label: /"
}
for round in $(seq "$ROUNDS"); do
  echo "round $round"
  measure one "$one" -p "$one" -r 100000
  measure one-with-replica "$primary" -p "$primary" -r 100000
  measure cluster "${masters[*]}" -p "$base" --cluster -r 33334
done
python3 - "$dir" <<'PY'
import statistics, sys
def median(label):
    return statistics.median(float(x) for x in open(f"{sys.argv[1]}/{label}.cpu"))
one, replica, cluster = median("one"), median("one-with-replica"), median("cluster")
print(f"Redis CPU s per 100k bare writes, medians: one Redis {one:.3f}, one Redis with a replica "
      f"{replica:.3f}, cluster (sum over 3 masters) {cluster:.3f}; cluster / one Redis "
      f"{cluster / one:.2f}x, cluster / one Redis with a replica {cluster / replica:.2f}x")
PY
