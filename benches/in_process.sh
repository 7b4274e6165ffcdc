#!/usr/bin/env bash
# Instructions per in-process decision, counted by callgrind (repeatable
# whatever else the machine runs): `Limiter::check(..).await` on the memory
# backend, and in it the decision itself (`MemoryBackend::decide`: the clock,
# the key's hash, the shard's lock, the table and the arithmetic), the same
# with a Prometheus recorder installed (metrics-exporter-prometheus), a
# `#[rate_limit]` function (its key built from a `u64`), and governor's keyed
# limiter (`check_key`), on 10,000 keys. Each figure is the
# difference between runs of N and 2N decisions, divided by N, so that
# start-up is not counted.
#
#     benches/in_process.sh          # N=500000
#
# Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${N:=500000}"
cargo build -q --release -p ratelimit-tests --example in_process
bin=${CARGO_TARGET_DIR:-target}/release/examples/in_process
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Inclusive instructions of each function named, and the program's total.
count() { # mode n
  valgrind --tool=callgrind --callgrind-out-file="$dir/$1.$2" "$bin" "$1" "$2" >/dev/null 2>&1
  callgrind_annotate --inclusive=yes --threshold=100 "$dir/$1.$2" 2>/dev/null
}
per_decision() { # mode pattern
  local small large
  small=$(count "$1" "$N" | grep -E "$2" | head -n 1 | awk '{gsub(",", "", $1); print $1}')
  large=$(count "$1" $((2 * N)) | grep -E "$2" | head -n 1 | awk '{gsub(",", "", $1); print $1}')
  echo $(((${large:-0} - ${small:-0}) / N))
}

check=$(per_decision check 'PROGRAM TOTALS')
recorded=$(per_decision check-recorded 'PROGRAM TOTALS')
decide=$(per_decision check 'MemoryBackend::decide \[')
attribute=$(per_decision attribute 'PROGRAM TOTALS')
governor=$(per_decision governor 'PROGRAM TOTALS')
printf '%-44s %6s\n' "instructions per admitted decision" ""
printf '%-44s %6d\n' "Limiter::check(..).await, memory backend" "$check"
printf '%-44s %6d\n' "  of which MemoryBackend::decide" "$decide"
printf '%-44s %6d\n' "the same, a Prometheus recorder installed" "$recorded"
printf '%-44s %6d\n' "#[rate_limit] function, memory backend" "$attribute"
printf '%-44s %6d\n' "governor check_key" "$governor"
