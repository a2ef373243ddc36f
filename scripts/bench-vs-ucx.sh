#!/usr/bin/env bash
# Side-by-side per-thread message rate: dmkit's shm backend vs UCX's
# ucx_perftest over posix shared memory, 8-byte READ/WRITE/CAS/FAA, in one run.
#
#   scripts/bench-vs-ucx.sh [--region-size 4KiB] [--duration 5s] [--out results.json]
#
# Needs ucx_perftest (Debian: apt-get install ucx-utils). dmkit is run with
# batch 1 / every request signaled (each op waits for its completion) and with
# batch 16 / last request signaled (the streaming shape of ucp_put_bw).
set -euo pipefail
region=4KiB
duration=5s
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --region-size) region=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found: apt-get install ucx-utils" >&2; exit 1; }
cd "$(dirname "$0")/.."
cargo build --release -q
dmkit=target/release/dmkit
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=$((20000 + RANDOM % 20000))

ucx_rate() { # $1 = test name; prints overall msg/s of the client
  UCX_TLS=posix,self,cma ucx_perftest -p "$port" >"$tmp/srv.log" 2>&1 &
  local srv=$!
  sleep 0.5
  UCX_TLS=posix,self,cma ucx_perftest 127.0.0.1 -p "$port" -t "$1" -s 8 -n 4000000 2>"$tmp/cli.err" \
    | awk '/^Final:/ {print $NF}'
  wait "$srv" || true
  port=$((port + 1))
}

dmkit_rate() { # $1 verb, $2 batch, $3 signal; prints Mops per thread
  "$dmkit" bench micro --verb "$1" --size 8 --region-size "$region" --threads 1 \
    --batch "$2" --signal "$3" --duration "$duration" --quiet --json "$tmp/d.json" >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mops_per_thread"])' "$tmp/d.json"
}

printf '%-6s %-12s %14s %16s %8s %18s %8s\n' verb ucx-test "ucx Mmsg/s" "dmkit b1 Mops" ratio "dmkit b16/last" ratio
rows=()
for pair in read:ucp_get write:ucp_put_bw cas:ucp_cswap faa:ucp_fadd; do
  verb=${pair%%:*}; test=${pair#*:}
  u=$(ucx_rate "$test")
  um=$(python3 -c "print(${u}/1e6)")
  d1=$(dmkit_rate "$verb" 1 all)
  d16=$(dmkit_rate "$verb" 16 last)
  r1=$(python3 -c "print(round(${d1}/${um},2))")
  r16=$(python3 -c "print(round(${d16}/${um},2))")
  printf '%-6s %-12s %14.2f %16.2f %8s %18.2f %8s\n' "$verb" "$test" "$um" "$d1" "${r1}x" "$d16" "${r16}x"
  rows+=("{\"verb\":\"$verb\",\"ucx_test\":\"$test\",\"ucx_mmsgs\":$um,\"dmkit_batch1_mops\":$d1,\"ratio_batch1\":$r1,\"dmkit_batch16_last_mops\":$d16,\"ratio_batch16\":$r16}")
done
if [ -n "$out" ]; then
  (IFS=,; echo "{\"region_size\":\"$region\",\"duration\":\"$duration\",\"rows\":[${rows[*]}]}") >"$out"
fi
