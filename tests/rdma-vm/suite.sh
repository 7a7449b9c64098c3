#!/usr/bin/env bash
# tests/rdma-vm/suite.sh BUILD_DIR: the RDMA suite, run inside the guest of tests/rdma-vm/run
# (ctest's rdma_vm). Shows the device, checks plain rdma_cm traffic (rping) on it, then runs
# the build's RDMA tests (test_rdma*) against real Soft-RoCE. Non-zero if anything failed.
set -uo pipefail
BUILD=${1:?usage: suite.sh BUILD_DIR}
ADDR=${TESSERA_RDMA_ADDR:-10.0.2.15}
export TESSERA_RDMA_ADDR=$ADDR
bad=0

echo "== RDMA device"
ibv_devinfo -d rxe0 | grep -E 'hca_id|transport|state|active_mtu' || bad=1

echo "== rping on $ADDR (rdma_cm + verbs, no tessera)"
rping -s -a "$ADDR" -C 3 >/dev/null 2>&1 &
server=$!
sleep 0.5
if rping -c -a "$ADDR" -C 3 -S 1024 >/dev/null 2>&1; then echo "rping: ok"; else echo "rping: FAILED"; bad=1; fi
wait "$server" 2>/dev/null

shopt -s nullglob
tests=("$BUILD"/bin/test_rdma*)
((${#tests[@]})) || { echo "no RDMA tests in $BUILD/bin"; exit 1; }
for t in "${tests[@]}"; do
  echo "== $(basename "$t")"
  start=$(date +%s)
  "$t"
  rc=$?
  echo "== $(basename "$t"): exit $rc in $(($(date +%s) - start)) s"
  ((rc == 0)) || bad=1
done
exit $bad
