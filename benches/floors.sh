#!/usr/bin/env bash
# Where Redis spends its time per decision: the limiter's script beside
# scripts that do less (benches/floors/), each sent by redis-benchmark with
# the arguments the limiter sends, rows interleaved round by round. Prints
# Redis CPU (used_cpu_user + used_cpu_sys) per decision, or per check of
# three keys, in µs: each row's median over the rounds, and the ratios the
# README quotes.
#
#     benches/floors.sh              # ROUNDS=3 CALLS=15000
#     ONLY='limiter' ROUNDS=10 benches/floors.sh   # the rows whose name matches
#
# The limiter runs as the function library it loads (FCALL), and by EVALSHA
# beside it, as where functions are refused. Rows on one redis-server: 18
# decisions a call (W2's ~17-19), 9 (a cluster master's share of 64 in
# flight) and 1; 18 checks a call of a user, an
# IP and one global key of an ample quota, as `loadgen --dimensions 3`. Rows
# on one cluster-mode redis-server owning every slot (no replica, as the
# standalone one): 9 and 18 keys of many slots a call, as a cluster batch.
# Keys are drawn from 100,000 (`redis-benchmark -r`); each row starts from
# an empty Redis. Needs redis-server, redis-cli and redis-benchmark; pins
# Redis to CPU 0 and redis-benchmark to CPU 1 when `taskset` exists.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${ROUNDS:=3}"
: "${CALLS:=15000}"
: "${ONLY:=.}"
floors=$PWD/benches/floors
dir=$(mktemp -d)
pin() { if command -v taskset >/dev/null; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cleanup() {
  for pid in "$dir"/*.pid; do kill "$(cat "$pid")" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

# The limiter's script, its files in the order of `script_body!`
# (ratelimit-core/src/backend/redis.rs): as the function library the limiter
# loads (called by FCALL), and as the script it sends by EVALSHA where
# functions are refused, plain and flagged for a cluster.
for file in $(grep -o 'scripts/[a-z_]*\.lua' ratelimit-core/src/backend/redis.rs); do
  cat "ratelimit-core/$file"
done > "$dir/body.lua"
{
  echo '#!lua name=ratelimit_floors'
  cat "$dir/body.lua"
  echo "redis.register_function{function_name='ratelimit_floors', callback=decide_call, flags={'allow-cross-slot-keys'}}"
} > "$dir/library.lua"
{ cat "$dir/body.lua"; echo 'return decide_call(_G.KEYS, ARGV)'; } > "$dir/limiter.lua"
{ echo '#!lua flags=allow-cross-slot-keys'; cat "$dir/limiter.lua"; } > "$dir/limiter-cluster.lua"

standalone=$(free_port)
# A cluster node also listens on its port + 10000 (the cluster bus), so both
# are taken below the ephemeral range (32768 on).
cluster=$((10000 + RANDOM % 10000))
pin 0 redis-server --port "$standalone" --save '' --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/standalone.pid" >/dev/null
mkdir "$dir/node"
pin 0 redis-server --port "$cluster" --save '' --appendonly no --dir "$dir/node" \
  --cluster-enabled yes --cluster-config-file "$dir/node/nodes.conf" \
  --daemonize yes --pidfile "$dir/cluster.pid" >/dev/null
for port in "$standalone" "$cluster"; do
  for _ in $(seq 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
done
redis-cli -p "$cluster" info cluster 2>/dev/null | grep -q 'cluster_enabled:1' || {
  echo "benches/floors.sh: no cluster-mode redis-server came up on port $cluster" >&2
  exit 1
}
redis-cli -p "$cluster" cluster addslotsrange 0 16383 >/dev/null
for _ in $(seq 100); do
  redis-cli -p "$cluster" cluster info | grep -q 'cluster_state:ok' && break
  sleep 0.1
done
redis-cli -p "$cluster" cluster info | grep -q 'cluster_state:ok' || {
  echo "benches/floors.sh: the one-node cluster on port $cluster did not come up" >&2
  exit 1
}

keys() { local s=""; for _ in $(seq 1 "$1"); do s="$s $2:__rand_int__"; done; echo "$s"; }
# A group of W2's quota (10 at 2/s): count, token bucket, cost 1, Redis's
# clock, 2 tokens a second, capacity 10.
w2() { echo "$1 0 1 '' 2 1000000 10"; }
checks_keys="" checks_args="runs 18"
for _ in $(seq 1 18); do
  checks_keys="$checks_keys u:__rand_int__ i:__rand_int__ global"
  checks_args="$checks_args -3"
done
for _ in $(seq 1 18); do checks_args="$checks_args $(w2 2) 1 0 1 '' 1000000 1000 1000000"; done

# name|server|decisions or checks a call|script, or `fcall` for the
# limiter's function|the call's keys and arguments
rows="decision:nothing|$standalone|18|$floors/nothing.lua|18 $(keys 18 k) each $(w2 18)
decision:read_write|$standalone|18|$floors/read_write.lua|18 $(keys 18 k) each $(w2 18)
decision:least_gcra|$standalone|18|$floors/least_gcra.lua|18 $(keys 18 k) each $(w2 18)
decision:limiter|$standalone|18|fcall|18 $(keys 18 k) each $(w2 18)
decision:limiter_evalsha|$standalone|18|$dir/limiter.lua|18 $(keys 18 k) each $(w2 18)
check:nothing|$standalone|18|$floors/nothing.lua|54 $checks_keys $checks_args
check:read_write|$standalone|18|$floors/read_write.lua|54 $checks_keys $checks_args
check:read_write_distinct|$standalone|18|$floors/read_write_distinct.lua|54 $checks_keys $checks_args
check:limiter|$standalone|18|fcall|54 $checks_keys $checks_args
1:limiter|$standalone|1|fcall|1 $(keys 1 k) each $(w2 1)
1:limiter_evalsha|$standalone|1|$dir/limiter.lua|1 $(keys 1 k) each $(w2 1)
9:read_write|$standalone|9|$floors/read_write.lua|9 $(keys 9 k) each $(w2 9)
9:limiter|$standalone|9|fcall|9 $(keys 9 k) each $(w2 9)
cluster9:read_write|$cluster|9|$floors/cluster_read_write.lua|1 r:__rand_int__ batch 9 $(keys 9 k) $(w2 9)
cluster9:limiter|$cluster|9|fcall|1 r:__rand_int__ batch 9 $(keys 9 k) $(w2 9)
cluster9:limiter_evalsha|$cluster|9|$dir/limiter-cluster.lua|1 r:__rand_int__ batch 9 $(keys 9 k) $(w2 9)
cluster18:read_write|$cluster|18|$floors/cluster_read_write.lua|1 r:__rand_int__ batch 18 $(keys 18 k) $(w2 18)
cluster18:limiter|$cluster|18|fcall|1 r:__rand_int__ batch 18 $(keys 18 k) $(w2 18)"

for port in "$standalone" "$cluster"; do
  redis-cli -p "$port" -x function load replace < "$dir/library.lua" >/dev/null
done

cpu() { redis-cli -p "$1" info cpu | awk -F: '/used_cpu_(user|sys):/ { s += $2 } END { printf "%.6f", s }'; }
results="$dir/results"
for round in $(seq 1 "$ROUNDS"); do
  while IFS='|' read -r name port per_call script args; do
    [[ $name =~ $ONLY ]] || continue
    if [ "$script" = fcall ]; then
      command="fcall ratelimit_floors" stat=fcall
    else
      command="evalsha $(redis-cli -p "$port" -x script load < "$script")" stat=evalsha
    fi
    # FLUSHALL leaves functions and scripts loaded.
    redis-cli -p "$port" flushall >/dev/null
    redis-cli -p "$port" config resetstat >/dev/null
    before=$(cpu "$port")
    eval "pin 1 redis-benchmark -p $port -r 100000 -n $CALLS -c 4 -P 8 -q $command $args" >/dev/null
    after=$(cpu "$port")
    stats=$(redis-cli -p "$port" info commandstats | grep "^cmdstat_$stat:")
    calls=$(sed 's/.*:calls=\([0-9]*\),.*/\1/' <<<"$stats")
    failed=$(sed 's/.*rejected_calls=\([0-9]*\),failed_calls=\([0-9]*\).*/\1 \2/' <<<"$stats")
    if [ "$failed" != "0 0" ]; then
      echo "benches/floors.sh: $name: calls rejected and failed: $failed (of $calls):" >&2
      eval "redis-cli -p $port $command $args" >&2 || true
      exit 1
    fi
    us=$(python3 -c "print('%.3f' % (($after - $before) * 1e6 / $calls / $per_call))")
    echo "round $round  $name  $us" | tee -a "$results"
  done <<<"$rows"
done

python3 - "$results" <<'PY'
import collections, statistics, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    _, _, name, us = line.split()
    rows.setdefault(name, []).append(float(us))
median = {name: statistics.median(v) for name, v in rows.items()}
print("\nRedis CPU µs per decision (check: per check of three keys), medians:")
for name, v in median.items():
    print(f"  {name:28} {v:7.3f}")
print("\nratios of medians:")
ratios = [
    ("check of 3 / decision, read_write", "check:read_write", "decision:read_write"),
    ("check of 3 / decision, read_write_distinct", "check:read_write_distinct", "decision:read_write"),
    ("check of 3 / decision, limiter", "check:limiter", "decision:limiter"),
    ("limiter / least_gcra, decisions", "decision:limiter", "decision:least_gcra"),
    ("limiter / read_write, decisions", "decision:limiter", "decision:read_write"),
    ("limiter by FCALL / by EVALSHA, 18 a call", "decision:limiter", "decision:limiter_evalsha"),
    ("limiter by FCALL / by EVALSHA, 1 a call", "1:limiter", "1:limiter_evalsha"),
    ("limiter by FCALL / by EVALSHA, cluster node, 9 a call", "cluster9:limiter", "cluster9:limiter_evalsha"),
    ("cluster node / one Redis, 9 a call, read_write", "cluster9:read_write", "9:read_write"),
    ("cluster node / one Redis, 9 a call, limiter", "cluster9:limiter", "9:limiter"),
    ("9 / 18 a call, limiter, one Redis", "9:limiter", "decision:limiter"),
    ("cluster node 9 a call / one Redis 18 a call, limiter", "cluster9:limiter", "decision:limiter"),
]
for what, a, b in ratios:
    if a in median and b in median:
        print(f"  {what:55} {median[a] / median[b]:.2f}x")
PY
