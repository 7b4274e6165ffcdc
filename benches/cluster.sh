#!/usr/bin/env bash
# Redis CPU per 100,000 decisions on a 3-master Redis Cluster against one
# standalone redis-server, W2's shape (100,000 keys, capacity 10 at 2/s, 64
# in flight), runs interleaved: standalone, cluster, standalone, cluster...
# The cluster's figure sums used_cpu_sys + used_cpu_user over its masters
# (loadgen --stats). Prints each run, then the medians and their ratio.
#
#     benches/cluster.sh              # RUNS=5 SECONDS_PER_RUN=10 DIMENSIONS=1
#
# CONCURRENCY (default 64) sets the decisions in flight; STANDALONE_REPLICA=1
# gives the standalone Redis a replica too, as each cluster master has, so
# that both pay for feeding one.
#
# MODULE=/abs/path/libratelimit_module.so loads the native module into every
# server (cargo build --release -p ratelimit-module builds it).
#
# Needs redis-server and redis-cli; the cluster is
# benches/peers/tools/redis-cluster.sh's (3 masters, 1 replica each),
# or $CLUSTER_TOOL's.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${RUNS:=5}"
: "${SECONDS_PER_RUN:=10}"
: "${DIMENSIONS:=1}"
: "${CONCURRENCY:=64}"
: "${STANDALONE_REPLICA:=0}"
: "${MODULE:=}"
# The module's path may not hold spaces: the cluster tool splits NODE_ARGS.
export NODE_ARGS="${MODULE:+--loadmodule $MODULE}"
: "${CLUSTER_TOOL:=$(cd "$(dirname "$0")" && pwd)/peers/tools/redis-cluster.sh}"
cargo build -q --release -p ratelimit-tests --example loadgen
loadgen=${CARGO_TARGET_DIR:-target}/release/examples/loadgen

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d)
port=$(free_port)
# Six consecutive ports for the cluster's nodes, away from the ephemeral range.
base=$((20000 + RANDOM % 20000))
export CLUSTER_DIR="$dir/cluster"
cleanup() {
  kill "$(cat "$dir/redis.pid" 2>/dev/null)" 2>/dev/null || true
  kill "$(cat "$dir/replica.pid" 2>/dev/null)" 2>/dev/null || true
  "$CLUSTER_TOOL" down "$base" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --logfile "$dir/redis.log" --daemonize yes --pidfile "$dir/redis.pid" ${NODE_ARGS}
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
if [ "$STANDALONE_REPLICA" = 1 ]; then
  replica_port=$(free_port)
  mkdir -p "$dir/replica"
  redis-server --port "$replica_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir/replica" \
    --logfile "$dir/replica.log" --daemonize yes --pidfile "$dir/replica.pid" --replicaof 127.0.0.1 "$port" ${NODE_ARGS}
  until redis-cli -p "$port" info replication | grep -q 'slave0:.*state=online'; do sleep 0.05; done
fi
"$CLUSTER_TOOL" up "$base" 3 >/dev/null
standalone="redis://127.0.0.1:$port"
# The masters' URLs (loadgen skips replicas in its figures anyway).
masters=$(redis-cli -p "$base" cluster nodes | awk '/master/ {split($2,a,"[:@]"); printf "%sredis://127.0.0.1:%s", sep, a[2]; sep=","}')

shape=(--workload w2 --keys 100000 --capacity 10 --rate 2 --concurrency "$CONCURRENCY"
  --seconds "$SECONDS_PER_RUN" --dimensions "$DIMENSIONS" --stats)
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d['$1'])"; }
: >"$dir/standalone.cpu" && : >"$dir/cluster.cpu"
for run in $(seq "$RUNS"); do
  redis-cli -p "$port" flushall >/dev/null
  s=$("$loadgen" "${shape[@]}" --redis "$standalone" 2>/dev/null | tail -1)
  for m in ${masters//,/ }; do redis-cli -u "$m" flushall >/dev/null; done
  c=$("$loadgen" "${shape[@]}" --cluster "$masters" 2>/dev/null | tail -1)
  echo "run $run standalone: $s"
  echo "run $run cluster:    $c"
  echo "$s" | field redis_cpu_s_per_100k >>"$dir/standalone.cpu"
  echo "$c" | field redis_cpu_s_per_100k >>"$dir/cluster.cpu"
done
python3 - "$dir/standalone.cpu" "$dir/cluster.cpu" <<'PY'
import statistics, sys
s = [float(x) for x in open(sys.argv[1])]
c = [float(x) for x in open(sys.argv[2])]
ms, mc = statistics.median(s), statistics.median(c)
print(f"Redis CPU s per 100k decisions, median of {len(s)}: standalone {ms:.3f}, "
      f"cluster (sum over 3 masters) {mc:.3f}, ratio {mc / ms:.2f}x")
PY
