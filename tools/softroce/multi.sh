#!/usr/bin/env bash
# dmkit across hosts on Soft-RoCE: N QEMU guests booted from the same read-only kernel and
# initramfs (nothing written back: the guests' root is the initramfs in their own RAM), each with
# its own virtio NIC, IP, MAC and rxe0. Every NIC is a `-netdev socket,udp=` whose Ethernet frames
# go as UDP datagrams on the host's loopback to `dmkit switch` on the host -- the only path
# between the guests. Guest 0 is the memory node (10.77.0.1); clients are 10.77.0.11, .12, ...
# and run tools/softroce/multi_guest.sh's steps against it. Needs `run.sh setup` done once.
#
#   tools/softroce/multi.sh                      # 1 client: conformance + YCSB race/art/btree
#   CLIENTS=2 STEPS=race tools/softroce/multi.sh # two clients at once
#
# env: W (work dir, default target/softroce-multi), PROFILE (default softroce), CLIENTS (1),
#      STEPS (comma list: conformance,race,art,btree,clover,clover-shared,lockcheck), MEM (guest memory, 1G), SMP (1),
#      ACCEL (tcg; kvm where it works), BASE (UDP base port, 47900), PCAP (file:
#      capture at the switch), NOBUILD=1 (reuse the last build), DUR (YCSB seconds, 3),
#      SWITCH_ARGS (extra `dmkit switch` flags), RESTART_AT (seconds: restart the switch then),
#      RESTART_GAP (seconds the switch is down, 1), STEER (off|write|read-write: the switch's
#      steering, its control plane reading the node's region table over the management network),
#      MGMT (host TCP port of the node's control server on that network, BASE+50; BASE+51: its
#      token over HTTP), CAS2W=1 (the switch's CAS→WRITE, `--cas-to-write`: with STEPS=lockcheck),
#      OWNQP=1 (the switch's own address 10.77.0.254 and queue pair on the node, `--switch-ip`),
#      MUX=1 (clients' connections moved onto that queue pair, `--mux`; with CAS2W=1 CAS→WRITE on them)
# Results: $W/report.txt (RESULT/REPORT lines per guest), $W/switch.json (the switch's counters),
# $W/guest-*.log. Exit 0 iff every client check passed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/tools/softroce
export W=${W:-$ROOT/target/softroce-multi}
SINGLE=${SINGLE_W:-$ROOT/target/softroce-guest}
PROFILE=${PROFILE:-softroce}
CLIENTS=${CLIENTS:-1}; STEPS=${STEPS:-conformance,race,art,btree}; MEM=${MEM:-1G}; SMP=${SMP:-1}
BASE=${BASE:-47900}; DUR=${DUR:-3}
# TCG by default: on this workplace's VMs /dev/kvm exists but KVM guests die in the kernel's early
# boot (an emulation failure on cmpxchg16b; with -cx16 the boot hangs), as recipe.sh notes.
ACCEL=${ACCEL:-tcg}
mkdir -p "$W"
[ -e "$SINGLE/vmlinux" ] || { echo "multi: no guest kernel in $SINGLE -- run 'tools/softroce/run.sh setup' once" >&2; exit 2; }
ln -sfn "$SINGLE/kpkg" "$W/kpkg"; ln -sf "$SINGLE/vmlinux" "$W/vmlinux"

cd "$ROOT"
if [ -z "${NOBUILD:-}" ]; then
  echo "multi: building dmkit with the verbs backend (profile $PROFILE)" >&2
  cargo build --profile "$PROFILE" --features dmkit/verbs --bin dmkit
  TEST_BIN=$(cargo test --profile "$PROFILE" -p dmkit-verbs --features rdma --test rxe_remote --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "rxe_remote" and m.get("executable"):
        print(m["executable"])')
  [ -n "$TEST_BIN" ] || { echo "multi: could not build the rxe_remote test binary" >&2; exit 1; }
  mkdir -p "$W/bin"
  cp "target/$PROFILE/dmkit" "$W/bin/dmkit"; cp "$TEST_BIN" "$W/bin/rxe_remote"
  EXTRA_BINS="$W/bin/dmkit $W/bin/rxe_remote" GUEST_TEST=$HERE/multi_guest.sh bash "$HERE/recipe.sh" build >/dev/null
fi

pids=()
cleanup() {
  for f in "$W"/qemu-*.pid; do [ -e "$f" ] && { kill "$(cat "$f")" 2>/dev/null || true; rm -f "$f"; }; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# The management network: the memory node's guest has a second NIC (QEMU user networking,
# restricted: no route out) whose only use is two forwarded ports on the host's loopback, its
# verbs control server (MGMT) and its token (MGMT+1, busybox httpd). The switch's control plane
# reads the node's region table there -- as a rack switch's CPU reaches servers over its
# management port. RoCE traffic never takes this path: the switch is the only one between guests.
MGMT=${MGMT:-$((BASE + 50))}
STEER=${STEER:-off}
rm -f "$W/node.token"
SWITCH_CTL=()
if [ -n "${CAS2W:-}" ]; then
  [ "$STEER" = off ] || { echo "multi: CAS2W and STEER do not run together" >&2; exit 2; }
  SWITCH_CTL=(--cas-to-write --server 10.77.0.1)
fi
if [ -n "${OWNQP:-}" ]; then
  # The switch's own address (10.77.0.254) and queue pair on the node, probed with a READ a second.
  [ "$STEER" = off ] || { echo "multi: OWNQP and STEER do not run together" >&2; exit 2; }
  [ -n "${CAS2W:-}" ] || SWITCH_CTL=(--server 10.77.0.1)
  SWITCH_CTL+=(--switch-ip 10.77.0.254 --node-ctl "127.0.0.1:$MGMT" --node-token "$W/node.token")
fi
if [ -n "${MUX:-}" ]; then
  # Every client connection moves onto the switch's queue pair on the node (with CAS2W=1,
  # CAS→WRITE runs on the moved connections).
  [ "$STEER" = off ] || { echo "multi: MUX and STEER do not run together" >&2; exit 2; }
  SWITCH_CTL=(--mux --server 10.77.0.1 --switch-ip 10.77.0.254 --node-ctl "127.0.0.1:$MGMT"
              --node-token "$W/node.token")
  [ -z "${CAS2W:-}" ] || SWITCH_CTL+=(--cas-to-write)
fi
if [ "$STEER" != off ]; then
  SWITCH_CTL=(--steer "$STEER" --server 10.77.0.1 --node-ctl "127.0.0.1:$MGMT" --node-token "$W/node.token")
fi
fetch_token() { # the node's token, once it has one (the switch reads the file when it connects)
  for i in $(seq 1 1200); do
    if curl -sf --connect-timeout 2 -m 5 -o "$W/node.token.tmp" "http://127.0.0.1:$((MGMT + 1))/node.token" 2>/dev/null \
        && [ -s "$W/node.token.tmp" ]; then
      chmod 600 "$W/node.token.tmp"; mv "$W/node.token.tmp" "$W/node.token"; return 0
    fi
    sleep 0.5
  done
  return 1
}

# The switch: port i is guest i's socket netdev (it sends from 127.0.0.1:BASE+1+i).
ports=(--port "mem=127.0.0.1:$((BASE + 1))")
for c in $(seq 1 "$CLIENTS"); do ports+=(--port "c$c=127.0.0.1:$((BASE + 1 + c))"); done
start_switch() { # stats file, log
  "$W/bin/dmkit" switch --listen "127.0.0.1:$BASE" "${ports[@]}" --stats-json "$1" \
    ${PCAP:+--pcap "$PCAP"} "${SWITCH_CTL[@]}" ${SWITCH_ARGS:-} > "$2" 2>&1 &
  SWITCH_PID=$!; pids+=($SWITCH_PID); echo $SWITCH_PID > "$W/switch.pid"
  sleep 0.3
}
rm -f "$W"/switch*.json "$W"/switch*.log
start_switch "$W/switch.json" "$W/switch.log"

boot() { # index, ip, role, log
  local i=$1 ip=$2 role=$3 log=$4 cpu="" mgmt=() mgmt_arg=""
  [ "$ACCEL" = kvm ] && cpu="-cpu ${KVM_CPU:-host,-arch-capabilities,-cx16}"
  if [ "$role" = mem ]; then
    mgmt=(-netdev "user,id=m0,restrict=on,hostfwd=tcp:127.0.0.1:$MGMT-:7471,hostfwd=tcp:127.0.0.1:$((MGMT + 1))-:8000"
          -device "virtio-net-pci,romfile=,netdev=m0,mac=52:54:00:78:00:01")
    mgmt_arg="dmkit.mgmt=10.0.2.15"
  fi
  timeout ${TIMEOUT:-900} qemu-system-x86_64 -M pc -kernel "$W/vmlinux" -accel "$ACCEL" $cpu -smp "$SMP" -m "$MEM" \
    -nographic -nodefaults -serial stdio -no-reboot -initrd "$W/initrd.img" \
    -netdev "socket,id=n0,udp=127.0.0.1:$BASE,localaddr=127.0.0.1:$((BASE + 1 + i))" \
    -device "virtio-net-pci,romfile=,netdev=n0,mac=52:54:00:77:00:$(printf %02x $((i + 1)))" "${mgmt[@]}" \
    -append "console=ttyS0 quiet panic=-1 no_timer_check dmkit.ip=$ip dmkit.role=$role dmkit.server=10.77.0.1 dmkit.steps=$STEPS dmkit.dur=$DUR dmkit.clients=$CLIENTS $mgmt_arg" \
    -device isa-debug-exit,iobase=0xf4,iosize=0x04 < /dev/null > "$log" 2>&1 &
  echo $! > "$W/qemu-$i.pid"; wait $!
}

echo "multi: switch on udp:127.0.0.1:$BASE; booting 1 memory node + $CLIENTS client(s) ($ACCEL, $MEM, smp $SMP)" >&2
t0=$(date +%s.%N)
boot 0 10.77.0.1 mem "$W/guest-mem.log" & pids+=($!)
fetch_token & pids+=($!)
cpids=()
for c in $(seq 1 "$CLIENTS"); do
  boot "$c" "10.77.0.$((10 + c))" client "$W/guest-c$c.log" & cpids+=($!); pids+=($!)
done
if [ -n "${RESTART_AT:-}" ]; then
  # A switch restart mid-run: stop it (its soft state is gone), leave the link down for
  # RESTART_GAP seconds (frames sent meanwhile are lost), start a fresh one. RC retransmits.
  ( sleep "$RESTART_AT"; kill -INT "$(cat "$W/switch.pid")"; sleep "${RESTART_GAP:-1}"
    echo "multi: switch restarted at +${RESTART_AT}s" >&2
    start_switch "$W/switch-2.json" "$W/switch-2.log"; wait ) &
  pids+=($!)
fi
rc=0
for c in $(seq 1 "$CLIENTS"); do
  r=0; wait "${cpids[$((c - 1))]}" || r=$?
  # qemu's exit status: 1 = guest test exit 0; 2n+1 = guest exit n
  if [ $r -ne 1 ]; then echo "multi: client c$c FAILED (qemu rc=$r)" >&2; rc=1; fi
done
t1=$(date +%s.%N)
SWITCH_PID=$(cat "$W/switch.pid"); kill -INT "$SWITCH_PID" 2>/dev/null || true
for i in $(seq 1 20); do kill -0 "$SWITCH_PID" 2>/dev/null || break; sleep 0.1; done
cleanup
: > "$W/report.txt"
for g in mem $(seq -f 'c%g' 1 "$CLIENTS"); do
  grep -E "^(GUEST|RESULT|REPORT|TIMING|  )" "$W/guest-$g.log" | tr -d '\r' | sed "s/^/[$g] /" >> "$W/report.txt" || true
done
echo "[host] wall $(python3 -c "print(round($t1-$t0,1))") s" >> "$W/report.txt"
for l in "$W"/switch*.log; do sed "s/^/[host] $(basename "$l" .log): /" "$l" >> "$W/report.txt"; done
cat "$W/report.txt"
if [ $rc -eq 0 ]; then echo "multi: all client checks PASSED"; else echo "multi: FAILED (logs: $W/guest-*.log)"; fi
exit $rc
