#!/bin/sh
# Runs inside each guest of tools/softroce/multi.sh after /init put rxe0 on eth0 (the kernel
# command line gave dmkit.ip, dmkit.role, dmkit.server). Roles:
#   mem    : a memory node (verbs, tcp:0.0.0.0:7471) and busybox httpd on :8000 serving its
#            token file to the clients; runs until the host stops the guest.
#   client : fetches the token, then runs dmkit's checks against the memory node across the
#            switch (DMKIT_GUEST_steps: conformance, ycsb indexes, clover-shared: every client
#            on one Clover store). RESULT/REPORT lines are
#            collected by multi.sh.
export DMKIT_RDMA_DEVICE=rxe0 DMKIT_GID_INDEX=$GIDX RUST_BACKTRACE=1
role=${DMKIT_GUEST_role:-client}; srv=${DMKIT_GUEST_server:-10.77.0.1}
echo "GUEST role=$role ip=$DMKIT_GUEST_ip gid-index=$GIDX"
ip -br addr show eth0; ip -br link show eth0
if [ "$role" = mem ]; then
  if [ -n "${DMKIT_GUEST_mgmt:-}" ] && [ -e /sys/class/net/eth1 ]; then
    # The management NIC (multi.sh): the host's switch reads the node's region table here.
    ip link set eth1 up && ip addr add "$DMKIT_GUEST_mgmt/24" dev eth1 \
      && echo "RESULT mgmt-nic PASS" || echo "RESULT mgmt-nic FAIL"
  fi
  mkdir -p /tmp/share
  httpd -p 8000 -h /tmp/share
  /usr/local/bin/dmkit memnode --size 512MiB --listen tcp:0.0.0.0:7471 --rdma-device rxe0 \
      --gid-index $GIDX --token-file /tmp/share/node.token 2>&1 | sed 's/^/  node: /' &
  for i in $(seq 1 40); do [ -e /tmp/share/node.token ] && break; sleep 0.25; done
  [ -e /tmp/share/node.token ] && echo "RESULT memnode-up PASS" || echo "RESULT memnode-up FAIL"
  touch /tmp/share/ready
  while :; do sleep 3600; done
fi

fail=0
up() { cut -d' ' -f1 /proc/uptime; }
for i in $(seq 1 240); do
  wget -q -O /tmp/node.token "http://$srv:8000/node.token" 2>/dev/null && [ -s /tmp/node.token ] && break
  sleep 0.5
done
[ -s /tmp/node.token ] || { echo "RESULT fetch-token FAIL"; exit 1; }
echo "RESULT fetch-token PASS ($(up) s uptime)"
chmod 600 /tmp/node.token
ping -c 1 -W 2 $srv > /dev/null 2>&1 && echo "RESULT ping PASS" || echo "RESULT ping FAIL"
C="--connect tcp:$srv:7471 --token-file /tmp/node.token --rdma-device rxe0 --gid-index $GIDX"
for step in $(echo "${DMKIT_GUEST_steps:-conformance,race,art,btree}" | tr ',' ' '); do
  t0=$(up)
  case "$step" in
    conformance)
      if DMKIT_REMOTE_NODE=$srv:7471 DMKIT_REMOTE_TOKEN=/tmp/node.token \
           /usr/local/bin/rxe_remote --ignored --test-threads=1 > /tmp/conf.log 2>&1; then
        echo "RESULT remote-conformance PASS"
      else
        echo "RESULT remote-conformance FAIL"; fail=1; tail -40 /tmp/conf.log
      fi
      grep -E "^test |test result|device rxe0" /tmp/conf.log | sed 's/^/  /';;
    race|art|btree|clover)
      if /usr/local/bin/dmkit bench ycsb --backend verbs $C --index $step --workload a --keys 2000 \
           --threads 1 --coros 4 --duration ${DMKIT_GUEST_dur:-3}s --json /tmp/ycsb-$step.json --quiet \
           > /tmp/ycsb-$step.log 2>&1; then
        echo "RESULT ycsb-$step-across-switch PASS"; sed 's/^/  /' /tmp/ycsb-$step.log
        echo "REPORT ycsb-$step $(tr -d '\n ' < /tmp/ycsb-$step.json)"
      else
        echo "RESULT ycsb-$step-across-switch FAIL"; fail=1; tail -30 /tmp/ycsb-$step.log
      fi;;
    clover-shared)
      # Every client guest on one Clover store (multi.sh's CLIENTS): the first creates it, the
      # others open it; the last to finish checks every chain against all clients' linked
      # versions ("chains intact" in its log) and removes the store.
      if /usr/local/bin/dmkit bench ycsb --backend verbs $C --index clover --gc off \
           --clover-store ycsb-shared --clover-clients "${DMKIT_GUEST_clients:-1}" --workload a \
           --keys 2000 --threads 1 --coros 4 --duration ${DMKIT_GUEST_dur:-3}s \
           --json /tmp/ycsb-$step.json --quiet > /tmp/ycsb-$step.log 2>&1; then
        echo "RESULT ycsb-$step-across-switch PASS"; sed 's/^/  /' /tmp/ycsb-$step.log
        echo "REPORT ycsb-$step $(tr -d '\n ' < /tmp/ycsb-$step.json)"
      else
        echo "RESULT ycsb-$step-across-switch FAIL"; fail=1; tail -30 /tmp/ycsb-$step.log
      fi;;
    lockcheck)
      # Every client guest on one spinlock word (multi.sh's CLIENTS), 2 threads (QPs) each: the
      # last to finish checks the counter the lock guards ("mutual exclusion held" in its log).
      # With CAS2W=1 the switch turns the CASes it knows succeed into WRITEs.
      if /usr/local/bin/dmkit bench lockcheck --backend verbs $C --clients "${DMKIT_GUEST_clients:-1}" \
           --threads 2 --duration ${DMKIT_GUEST_dur:-3}s > /tmp/lockcheck.log 2>&1; then
        echo "RESULT lockcheck-across-switch PASS"; sed 's/^/  /' /tmp/lockcheck.log
      else
        echo "RESULT lockcheck-across-switch FAIL"; fail=1; tail -30 /tmp/lockcheck.log
      fi;;
    *) echo "RESULT $step FAIL (unknown step)"; fail=1;;
  esac
  echo "TIMING $step $t0->$(up) s"
done
exit $fail
