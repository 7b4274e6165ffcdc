#!/usr/bin/env bash
# Per-algorithm figures against a private redis-server: Redis memory per key
# after 100,000 keys, Redis commands per decision, and decisions per second
# with 64 decisions in flight. Prints a Markdown table.
#
#     benches/algorithms.sh            # SECONDS_PER_RUN=5 KEYS=100000 by default
set -euo pipefail
cd "$(dirname "$0")/.."
: "${SECONDS_PER_RUN:=5}"
: "${KEYS:=100000}"
cargo build -q --release -p ratelimit-tests --example loadgen
loadgen=target/release/examples/loadgen

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --logfile "$dir/redis.log" --daemonize yes --pidfile "$dir/redis.pid"
trap 'kill "$(cat "$dir/redis.pid")" 2>/dev/null; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
url="redis://127.0.0.1:$port"
pin() { if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then taskset -c 1 "$@"; else "$@"; fi; }
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then taskset -p -c 0 "$(cat "$dir/redis.pid")" >/dev/null; fi

json() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d['$1'])"; }
echo "| algorithm | bytes per key (100k keys, 10-char key + \`rl:\`) | Redis commands per decision | Redis CPU s per 100k | decisions/s (64 in flight) | p50 µs | p99 µs | Redis busy |"
echo "|---|---|---|---|---|---|---|---|"
for algorithm in token_bucket gcra leaky_bucket fixed_window sliding_window sliding_log; do
  redis-cli -p "$port" flushall >/dev/null
  # Memory: one decision per key; a slow refill keeps every key alive.
  fill=$(pin "$loadgen" --fill --keys "$KEYS" --capacity 10 --rate 0.001 --algorithm "$algorithm" \
    --concurrency 64 --redis "$url" --stats 2>/dev/null)
  redis-cli -p "$port" flushall >/dev/null
  # Throughput: W2's shape (100,000 users, capacity 10 at 2/s).
  run=$(pin "$loadgen" --workload w2 --keys "$KEYS" --capacity 10 --rate 2 --algorithm "$algorithm" \
    --concurrency 64 --seconds "$SECONDS_PER_RUN" --redis "$url" --stats 2>/dev/null)
  rate=$(echo "$run" | python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(round(d['decisions']/d['elapsed_s']))")
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$algorithm" \
    "$(echo "$fill" | json redis_bytes_per_key)" "$(echo "$run" | json redis_cmds_per_decision)" \
    "$(echo "$run" | json redis_cpu_s_per_100k)" \
    "$rate" "$(echo "$run" | json p50_us)" "$(echo "$run" | json p99_us)" "$(echo "$run" | json redis_busy)"
done
