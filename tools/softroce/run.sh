#!/usr/bin/env bash
# dmkit on Soft-RoCE: builds dmkit with the verbs backend, boots a QEMU guest whose kernel has
# rdma_rxe, and runs the verbs backend's tests, a YCSB run and the micro-benchmark there
# (guest_test.sh). Exit 0 iff every guest check passed. Needs, once, as root: `run.sh setup`
# (Debian packages: qemu-system-x86, busybox-static, rdma-core, libibverbs-dev, libclang-dev,
# perftest ...; and the Debian kernel package, ~89 MB). No root at run time.
#
#   tools/softroce/run.sh setup    # one time (root): packages + kernel
#   tools/softroce/run.sh          # build + boot + test; report in target/softroce-guest/
#
# env: W (work dir, default target/softroce-guest), PROFILE (cargo profile, default softroce)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/tools/softroce
export W=${W:-$ROOT/target/softroce-guest}
PROFILE=${PROFILE:-softroce}
mkdir -p "$W"

if [ "${1:-}" = setup ]; then
  bash "$HERE/recipe.sh" setup
  exit 0
fi
missing=()
for t in qemu-system-x86_64 cpio busybox ibv_devices ib_read_lat; do command -v $t >/dev/null || missing+=($t); done
[ -e /usr/include/infiniband/verbs.h ] || missing+=(libibverbs-dev)
[ -e "$W/vmlinux" ] || missing+=("guest kernel ($W/vmlinux)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "softroce: missing: ${missing[*]} -- run '$0 setup' once as root" >&2
  exit 2
fi

cd "$ROOT"
echo "softroce: building dmkit with the verbs backend (profile $PROFILE)" >&2
cargo build --profile "$PROFILE" --features dmkit/verbs --bin dmkit
TEST_BIN=$(cargo test --profile "$PROFILE" -p dmkit-verbs --features rdma --test rxe --no-run \
  --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "rxe" and m.get("executable"):
        print(m["executable"])')
[ -n "$TEST_BIN" ] || { echo "softroce: could not build the rxe test binary" >&2; exit 1; }
mkdir -p "$W/bin"
cp "target/$PROFILE/dmkit" "$W/bin/dmkit"
cp "$TEST_BIN" "$W/bin/rxe_tests"
export EXTRA_BINS="$W/bin/dmkit $W/bin/rxe_tests" GUEST_TEST=$HERE/guest_test.sh
bash "$HERE/recipe.sh" build >/dev/null
rc=0
bash "$HERE/recipe.sh" run > "$W/run.log" 2>&1 || rc=$?
grep -E "^(RESULT|REPORT|TIMING|  )" "$W/guest.log" | tr -d '\r' | tee "$W/report.txt"
if [ $rc -eq 0 ]; then echo "softroce: all guest checks PASSED"; else
  echo "softroce: FAILED (guest log: $W/guest.log)"; tail -60 "$W/guest.log" | tr -d '\r'; fi
exit $rc
