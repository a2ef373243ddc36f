#!/usr/bin/env bash
# RACE (remote, through the runtime on shm) against local-hash (dashmap in
# this process), same harness, same workload, alternating in one run, N
# rounds. Issue 5's goal: race >= 0.5x local-hash on YCSB-C, 2 threads, 1M keys.
#
#   scripts/bench-race-vs-local.sh [--rounds 3] [--duration 5s] [--workload c] [--keys 1000000]
set -euo pipefail
rounds=3
duration=5s
workload=c
keys=1000000
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --workload) workload=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
cargo build --release -q
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rate() { target/release/dmkit bench ycsb --workload "$workload" --keys "$keys" --threads 2 --duration "$duration" --quiet --json "$tmp/r.json" "$@" >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mops"])' "$tmp/r.json"; }
printf '%-6s %16s %10s %8s\n' round "local-hash Mops" "race Mops" ratio
for i in $(seq 1 "$rounds"); do
  local_=$(rate --index local-hash)
  race=$(rate --index race --coros 8)
  printf '%-6s %16.3f %10.3f %8.2f\n' "$i" "$local_" "$race" "$(python3 -c "print($race/$local_)")"
done
