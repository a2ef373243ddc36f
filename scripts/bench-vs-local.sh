#!/usr/bin/env bash
# A remote index (through the runtime on shm) against its in-process peer,
# same harness, same workload, alternating in one run, N rounds:
#   race vs local-hash (dashmap)  — issue 5's goal: race >= 0.5x on YCSB-C
#   art  vs local-art  (congee)   — issue 6's goal: art  >= 0.5x on YCSB-C
# 2 threads, 1M keys by default.
#
#   scripts/bench-vs-local.sh [--index race|art] [--rounds 3] [--duration 5s]
#                             [--workload c] [--keys 1000000] [-- EXTRA BENCH FLAGS]
set -euo pipefail
index=race
rounds=3
duration=5s
workload=c
keys=1000000
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --index) index=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --workload) workload=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
case "$index" in
  race) peer=local-hash ;;
  art) peer=local-art ;;
  *) echo "--index race|art" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
cargo build --release -q
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rate() { target/release/dmkit bench ycsb --workload "$workload" --keys "$keys" --threads 2 --duration "$duration" --quiet --json "$tmp/r.json" "$@" >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mops"])' "$tmp/r.json"; }
printf '%-6s %14s %14s %8s\n' round "$peer Mops" "$index Mops" ratio
for i in $(seq 1 "$rounds"); do
  local_=$(rate --index "$peer")
  remote=$(rate --index "$index" --coros 8 "${extra[@]}")
  printf '%-6s %14.3f %14.3f %8.2f\n' "$i" "$local_" "$remote" "$(python3 -c "print($remote/$local_)")"
done
