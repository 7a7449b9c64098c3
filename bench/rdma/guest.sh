#!/usr/bin/env bash
# bench/rdma/guest.sh BUILD TSPLANREAD: runs INSIDE the RDMA guest (bench/rdma/run starts it):
# tessera's plan reader over rdma:// against ib_write_bw on the same rxe device, the same
# message size, alternating, and prints one JSON line per run plus a summary line
#   rdma_ratio=<median tessera / median ib_write_bw>
# Sizes and rounds come from the environment: SIZE (1M), TOTAL (64M), ROUNDS (3), SECS (5).
set -euo pipefail
BUILD=$1 TSPLANREAD=$2
ADDR=${TESSERA_RDMA_ADDR:-10.0.2.15}
SIZE=${SIZE:-1M} TOTAL=${TOTAL:-64M} ROUNDS=${ROUNDS:-3} SECS=${SECS:-5}
DEV=$(ibv_devices | awk 'NR > 2 && $1 != "" {print $1; exit}')
[[ -n $DEV ]] || { echo "bench/rdma: no RDMA device in the guest" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT

bytes() { numfmt --from=iec "$1"; }

"$BUILD/bin/tesserad" --listen 127.0.0.1:0 --rdma-listen "$ADDR:0" --data-dir "$TMP/data" \
  --workers 1 --sync none --log-level warn >"$TMP/tesserad.log" 2>&1 &
for _ in $(seq 100); do grep -q 'tesserad ready' "$TMP/tesserad.log" && break; sleep 0.1; done
CTL=$(sed -n 's/.* listen=\([^ ]*\) tls_listen.*/\1/p' "$TMP/tesserad.log")
[[ -n $CTL ]] || { cat "$TMP/tesserad.log" >&2; exit 1; }
"$TSPLANREAD" load --addr "$CTL" --name bench --dir "$TMP/local" --size "$SIZE" --total "$TOTAL" \
  --shards 4 2>/dev/null

tessera_run() {
  "$TSPLANREAD" tessera --addr "rdma://$CTL" --name bench --dir "$TMP/local" --min-seconds "$SECS" \
    --warmup 1 --label rdma 2>/dev/null | sed -n 's/.*"gb_per_s":\([0-9.]*\).*/\1/p'
}

# ib_write_bw's average for SIZE messages, as GB/s (10^9 bytes; perftest's MB is 2^20 bytes);
# its clock check can fail under TCG ("r^2 < 0.9"): tried up to 3 times.
ibwb_run() {
  local n=$(bytes "$SIZE") out try
  for try in 1 2 3; do
    ib_write_bw -d "$DEV" -s "$n" -D "$SECS" -F >"$TMP/ibs.log" 2>&1 &
    local spid=$!
    sleep 1
    out=$(ib_write_bw -d "$DEV" -s "$n" -D "$SECS" -F "$ADDR" 2>&1 || true)
    wait "$spid" 2>/dev/null || true
    # the result line: #bytes #iterations BW peak BW average MsgRate
    local bw=$(awk -v n="$n" '$1 == n && NF >= 5 {print $4}' <<<"$out" | tail -1)
    if [[ -n $bw ]]; then
      awk -v m="$bw" 'BEGIN {printf "%.4f\n", m * 1048576 / 1e9}' # GB/s
      return 0
    fi
  done
  echo "bench/rdma: ib_write_bw gave no figure:" >&2
  echo "$out" >&2
  return 1
}

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

: >"$TMP/t" && : >"$TMP/i"
for r in $(seq "$ROUNDS"); do
  t=$(tessera_run)
  i=$(ibwb_run)
  echo "{\"round\": $r, \"size\": \"$SIZE\", \"tessera_gbps\": ${t:-null}, \"ib_write_bw_gbps\": ${i:-null}}"
  [[ -n $t ]] && echo "$t" >>"$TMP/t"
  [[ -n $i ]] && echo "$i" >>"$TMP/i"
done
mt=$(median <"$TMP/t") mi=$(median <"$TMP/i")
awk -v t="$mt" -v i="$mi" -v s="$SIZE" 'BEGIN {
  printf "rdma size=%s tessera_gbps=%s ib_write_bw_gbps=%s rdma_ratio=%.2f\n", s, t, i, (i > 0 ? t / i : 0) }'
