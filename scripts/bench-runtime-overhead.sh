#!/usr/bin/env bash
# The runtime's own overhead on shm, side by side in one run: 8-byte READs
# through tasks and sync().await (1 worker, 8 tasks, depth 8) against the raw
# queue-pair loop (batch 8), alternating, N rounds.
#
#   scripts/bench-runtime-overhead.sh [--rounds 3] [--duration 3s]
set -euo pipefail
rounds=3
duration=3s
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
cargo build --release -q
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rate() { target/release/dmkit bench micro --verb read --size 8 --region-size 4KiB --threads 1 --duration "$duration" --quiet --json "$tmp/r.json" "$@" >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mops"])' "$tmp/r.json"; }
printf '%-6s %12s %16s %8s\n' round "raw b8 Mops" "runtime 8x8 Mops" ratio
for i in $(seq 1 "$rounds"); do
  raw=$(rate --batch 8)
  rt=$(rate --coros 8 --depth 8)
  printf '%-6s %12.2f %16.2f %8.2f\n' "$i" "$raw" "$rt" "$(python3 -c "print($rt/$raw)")"
done
