#!/bin/sh
# Runs inside the Soft-RoCE guest after /init created rxe0 on dum0 (10.77.0.1) and exported
# $GIDX. Runs dmkit's own binaries: the verbs backend's device tests (the fabric conformance
# suite, NIC error recovery, page migration, threads), a memory node process with a YCSB run
# against it, the verbs micro-benchmark next to perftest, and a CoRM store on a node process
# with its YCSB object benchmark (one-sided and RPC reads). Lines starting with RESULT /
# REPORT are collected by run.sh.
fail=0
export DMKIT_RDMA_DEVICE=rxe0 DMKIT_GID_INDEX=$GIDX RUST_BACKTRACE=1
up() { cut -d' ' -f1 /proc/uptime; }
t0=$(up)

# 1. The device tests (same conformance checks the shm backend passes).
if /usr/local/bin/rxe_tests --ignored --test-threads=1 > /tmp/rxe.log 2>&1; then
  echo "RESULT device-tests PASS"
else
  echo "RESULT device-tests FAIL"; fail=1
fi
grep -E "^test |test result|panicked|device rxe0" /tmp/rxe.log | sed 's/^/  /'
[ $fail = 0 ] || grep -v "^   *[0-9]*: \|^  *at " /tmp/rxe.log | tail -80
t1=$(up)

# 2. A memory node process on TCP, an index run against it from another process.
/usr/local/bin/dmkit memnode --size 128MiB --listen tcp:127.0.0.1:7471 --rdma-device rxe0 \
    --gid-index $GIDX > /tmp/node.log 2>&1 &
np=$!
for i in 1 2 3 4 5 6 7 8 9 10; do [ -e /tmp/dmkit-memnode-7471.token ] && break; sleep 0.5; done
sleep 0.5
if /usr/local/bin/dmkit bench ycsb --backend verbs --connect tcp:127.0.0.1:7471 --rdma-device rxe0 \
     --gid-index $GIDX --index race --workload a --keys 2000 --threads 1 --coros 4 --duration 3s \
     --json /tmp/ycsb.json --quiet > /tmp/ycsb.log 2>&1; then
  echo "RESULT ycsb-race-over-verbs PASS"; sed 's/^/  /' /tmp/ycsb.log
  echo "REPORT ycsb $(tr -d '\n ' < /tmp/ycsb.json)"
else
  echo "RESULT ycsb-race-over-verbs FAIL"; fail=1; cat /tmp/ycsb.log; cat /tmp/node.log
fi
t2=$(up)

# 3. The verbs micro-benchmark next to perftest on the same device (sanity ratio only:
#    both are software RDMA under instruction emulation).
for v in read faa; do
  if /usr/local/bin/dmkit bench micro --backend verbs --connect tcp:127.0.0.1:7471 --rdma-device rxe0 \
       --gid-index $GIDX --verb $v --size 8 --region-size 64MiB --threads 1 --batch 1 --duration 3s \
       --json /tmp/micro-$v.json --quiet > /tmp/micro-$v.log 2>&1; then
    echo "RESULT micro-$v PASS"; echo "REPORT micro-$v $(tr -d '\n ' < /tmp/micro-$v.json)"
  else
    echo "RESULT micro-$v FAIL"; fail=1; cat /tmp/micro-$v.log
  fi
done
kill $np 2>/dev/null; wait $np 2>/dev/null
t25=$(up)

# 4. CoRM (issue 32): a memory node process hosting the compacting object store, served by its
#    RPC workers over two-sided verbs; the object benchmark reads one-sidedly (DirectRead,
#    ScanRead on a moved object) and through RPC, writes through RPC, then frees its objects.
/usr/local/bin/dmkit memnode --size 128MiB --listen tcp:127.0.0.1:7472 --rdma-device rxe0 \
    --gid-index $GIDX --corm --workers 2 > /tmp/corm-node.log 2>&1 &
cp=$!
for i in 1 2 3 4 5 6 7 8 9 10; do [ -e /tmp/dmkit-memnode-7472.token ] && break; sleep 0.5; done
sleep 0.5
for r in direct rpc; do
  if /usr/local/bin/dmkit bench corm --backend verbs --connect tcp:127.0.0.1:7472 --rdma-device rxe0 \
       --gid-index $GIDX --read $r --workload 50:50 --objects 2000 --threads 1 --coros 4 \
       --duration 2s --warmup 200ms --json /tmp/corm-$r.json --quiet > /tmp/corm-$r.log 2>&1; then
    echo "RESULT corm-$r-over-verbs PASS"; sed 's/^/  /' /tmp/corm-$r.log
    echo "REPORT corm-$r $(tr -d '\n ' < /tmp/corm-$r.json)"
  else
    echo "RESULT corm-$r-over-verbs FAIL"; fail=1; cat /tmp/corm-$r.log; cat /tmp/corm-node.log
  fi
done
kill $cp 2>/dev/null; wait $cp 2>/dev/null
perf_pair() { # name, server cmd, client cmd
  $2 > /tmp/ps.log 2>&1 & sp=$!
  sleep 1
  timeout 120 $3 > /tmp/pc.log 2>&1; crc=$?
  wait $sp
  if [ $crc = 0 ]; then echo "REPORT $1 $(grep -A1 -E '^ #bytes' /tmp/pc.log | tr -s ' ' | tr '\n' '|')"; else echo "REPORT $1 failed"; cat /tmp/pc.log; fi
}
perf_pair ib_read_lat "ib_read_lat -d rxe0 -x $GIDX -s 8 -D 3" "ib_read_lat -d rxe0 -x $GIDX -s 8 -D 3 localhost"
perf_pair ib_atomic_bw "ib_atomic_bw -d rxe0 -x $GIDX -A FETCH_AND_ADD -q 1 -D 3" "ib_atomic_bw -d rxe0 -x $GIDX -A FETCH_AND_ADD -q 1 -D 3 localhost"
t3=$(up)
echo "TIMING device-tests $t0->$t1 s; ycsb $t1->$t2 s; micro $t2->$t25 s; corm+perftest $t25->$t3 s (guest uptime)"
exit $fail
