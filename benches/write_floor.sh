#!/usr/bin/env bash
# What one write costs Redis on W2's keys, beside redis-cell: Redis CPU
# (used_cpu_user + used_cpu_sys) per 100,000 commands of a bare
# `SET key value PX 5000` (a W2 bucket's value and expiry) and of
# redis-cell's `CL.THROTTLE` (W2's quota), each sent by
# `redis-benchmark -c 64 -P 16 -r 100000` to a fresh redis-server, rounds
# interleaved. A decision reads, decides and writes one key: the bare write
# is the floor of any limiter's decision, and `SET key value PX 5000 GET`
# (one command that reads the key's value and writes the new one with its
# expiry, Redis 6.2 and later) the floor of one that reads as well. Prints
# each row, then the medians and their ratios to redis-cell's.
#
#     CELL=/abs/path/libredis_cell.so benches/write_floor.sh   # ROUNDS=5
#
# The shared harness's setup.sh builds redis-cell. Needs redis-server,
# redis-cli and redis-benchmark; pins Redis to CPU 0 and redis-benchmark to
# CPU 1 when `taskset` exists.
set -euo pipefail
: "${ROUNDS:=5}"
: "${COMMANDS:=2000000}"
: "${CELL:?set CELL to the path of redis-cell libredis_cell.so, which setup.sh of the shared harness builds}"
pin() { if command -v taskset >/dev/null; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu() { redis-cli -p "$1" info cpu | awk -F: '/used_cpu_(sys|user):/{s+=$2} END{printf "%.6f", s}'; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() { # label command...
  local label=$1 port
  shift
  port=$(free_port)
  mkdir -p "$dir/$label"
  pin 0 redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir/$label" \
    --loadmodule "$CELL" --daemonize yes --pidfile "$dir/$label/pid" --logfile "$dir/$label/log"
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
  local before after
  before=$(cpu "$port")
  pin 1 redis-benchmark -p "$port" -c 64 -P 16 -r 100000 -n "$COMMANDS" "$@" >/dev/null 2>&1
  after=$(cpu "$port")
  local pid
  pid=$(cat "$dir/$label/pid")
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -rf "${dir:?}/$label"
  python3 -c "print(f'{($after - $before) * 100000 / $COMMANDS:.3f}')" | tee -a "$dir/$label.cpu" | sed "s/^/$label: /"
}
for round in $(seq "$ROUNDS"); do
  echo "round $round"
  run redis-cell CL.THROTTLE "rl:cell:__rand_int__" 9 2 1
  run set SET "rl:set:__rand_int__" 1796305279252249:4 PX 5000
  run set-get SET "rl:set:__rand_int__" 1796305279252249:4 PX 5000 GET
done
python3 - "$dir" <<'PY'
import statistics, sys
def median(label):
    return statistics.median(float(x) for x in open(f"{sys.argv[1]}/{label}.cpu"))
cell, bare, read = median("redis-cell"), median("set"), median("set-get")
print(f"Redis CPU s per 100k, medians: redis-cell {cell:.3f}, bare SET PX {bare:.3f} "
      f"({bare / cell:.2f}x), SET PX GET {read:.3f} ({read / cell:.2f}x)")
PY
