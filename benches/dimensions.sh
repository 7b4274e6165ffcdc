#!/usr/bin/env bash
# Redis CPU per check of three dimensions (user, IP, global) against one
# decision, W2's shape (100,000 users, capacity 10 at 2/s, 64 in flight), on
# one redis-server with the native module and one without it, runs
# interleaved. The IP dimension takes the ample quota of the global one
# (loadgen --ample-ip), so every check reaches Redis and writes its three
# keys. Prints each run, then the medians and their ratios.
#
#     benches/dimensions.sh           # RUNS=3 SECONDS_PER_RUN=8
#
# MODULE defaults to target/release/libratelimit_module.so (built here).
# BASELINE=/abs/path/libratelimit_module.so adds a third server loading
# another build of the module (an earlier commit's), run in turn with the
# other two; BASELINE_LOADGEN=/abs/path/loadgen drives it with that build's
# load generator (needed when the wire version differs: a module refuses
# calls of another version, and the limiter then calls the function).
# Needs redis-server and redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${RUNS:=3}"
: "${SECONDS_PER_RUN:=8}"
cargo build -q --release -p ratelimit-tests --example loadgen
if [ -z "${MODULE:-}" ]; then
  cargo build -q --release -p ratelimit-module
  MODULE=$PWD/${CARGO_TARGET_DIR:-target}/release/libratelimit_module.so
fi
loadgen=${CARGO_TARGET_DIR:-target}/release/examples/loadgen

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d)
cleanup() {
  for pid in "$dir"/*.pid; do [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
start() { # name port [args...]
  local name=$1 port=$2
  shift 2
  mkdir -p "$dir/$name"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir/$name" \
    --logfile "$dir/$name/log" --daemonize yes --pidfile "$dir/$name.pid" "$@"
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
}
module_port=$(free_port)
function_port=$(free_port)
start module "$module_port" --loadmodule "$MODULE"
start function "$function_port"
servers="module function"
if [ -n "${BASELINE:-}" ]; then
  baseline_port=$(free_port)
  start baseline "$baseline_port" --loadmodule "$BASELINE"
  servers="module baseline function"
fi

shape=(--workload w2 --keys 100000 --capacity 10 --rate 2 --concurrency 64
  --seconds "$SECONDS_PER_RUN" --ample-ip --stats)
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d['$1'])"; }
for run in $(seq "$RUNS"); do
  for server in $servers; do
    port=${server}_port
    for dimensions in 1 3; do
      redis-cli -p "${!port}" flushall >/dev/null
      driver=$loadgen
      if [ "$server" = baseline ] && [ -n "${BASELINE_LOADGEN:-}" ]; then driver=$BASELINE_LOADGEN; fi
      out=$("$driver" "${shape[@]}" --dimensions "$dimensions" --redis "redis://127.0.0.1:${!port}" 2>/dev/null | tail -1)
      echo "run $run $server, $dimensions dimension(s): $out"
      echo "$out" | field redis_cpu_s_per_100k >>"$dir/$server.$dimensions"
    done
  done
done
python3 - "$dir" $servers <<'PY'
import statistics, sys
d, servers = sys.argv[1], sys.argv[2:]
m = {(s, n): statistics.median(float(x) for x in open(f"{d}/{s}.{n}"))
     for s in servers for n in (1, 3)}
for s in servers:
    print(f"{s}: Redis CPU s per 100k, median: one decision {m[s, 1]:.3f}, "
          f"a check of three {m[s, 3]:.3f}, ratio {m[s, 3] / m[s, 1]:.2f}x")
print(f"module / function: one decision {m['module', 1] / m['function', 1]:.2f}x, "
      f"a check of three {m['module', 3] / m['function', 3]:.2f}x")
PY
