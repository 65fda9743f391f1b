#!/usr/bin/env bash
# KV-cache hand-off across an emulated wide-area link (issue 10, item 5): kv-demo (whole-cache
# vs layer-wise hand-off exposed to TTFT) and kv-bench (WRITE throughput) under
# SOFTRDMA_WAN, over a sweep of round-trip times and loss rates. Feeds the inference half of
# the wide-area study (docs/wide-area.md, docs/kv.md).
#
#   bash bench/kv_wan.sh [BUILD_DIR]
#
# Environment:
#   KV_WAN_RATE    link rate, each direction (10gbit)
#   KV_WAN_RTTS    round-trip times in ms; one-way delay = RTT / 2 ("0 2 10 50")
#   KV_WAN_LOSSES  random loss in %, each direction ("0 0.1")
#   KV_WAN_MODEL   kv-demo --model (llama3-8b); KV_WAN_TOKENS prompt tokens (2048)
#   KV_WAN_LAYER_MS synthetic compute per layer, ms (4)
#   KV_WAN_REQS    kv-demo requests per mode (2)
#   KV_WAN_QPS     kv-bench's QPs per peer (2; kv-demo uses the engine's default, 2)
#   KV_WAN_MAX_CACHE_MIB  the largest cache kv-demo allocates (4096: its two processes hold a
#                  copy each, on this machine's 24 GiB). A larger cache (Llama-3-70B at 32 K
#                  tokens is 10 GiB) is handed off by kv-bench instead: one WRITE per block
#                  and K/V part and layer, as kv-demo's whole-cache mode posts them
#                  (`kv-demo --describe` gives the block's bytes and the count), in batches of
#                  at most 65,536 all submitted at once, into a region of KV_WAN_REGION_MIB
#                  (1024) on each side written again and again (kv-bench --iterations: its
#                  source bytes never change, so no byte on the target depends on the order
#                  the WRITEs land in; decode's blocks lie in order there, not scattered).
#                  The whole-cache column is then kv-bench's first submit to last
#                  completion; layer-wise is not measured (it needs kv-demo's per-layer
#                  compute), nor is the separate 1 MiB throughput run
#   KV_WAN_CSV     1: write the table as CSV to docs/kv_wan.csv; any other non-empty value:
#                  to that path
#   SOFTRDMA_TDF   time dilation K (1; docs/wide-area.md): every figure is virtual; the
#                  real-time bounds on each run (timeout) are K times the virtual ones
#
# Each point: both processes carry SOFTRDMA_WAN="delay=RTT/2,rate=…,loss=…,queue=…" (queue:
# one BDP, at least 1 MiB),
# SOFTRDMA_KV_IB_TIMEOUT=17 (537 ms: above the loaded round trip of the longest link; at 14,
# 67 ms, a 50 ms link would time out spuriously). kv-demo prints the median exposed hand-off
# (prefill's view: last WRITE acknowledged after the last layer's compute); kv-bench runs
# 1 MiB WRITEs over 2 QPs for KV_WAN_SECS seconds (2). The "ideal" column is what the link
# alone needs for the whole cache: bytes × 8 / rate + one RTT. GB/s = 1e9 B/s. Prints a
# markdown table and writes it, as CSV, to docs/kv_wan.csv when KV_WAN_CSV=1.
# Nothing here is a test: figures depend on the machine and its load.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
B=${1:-build}
RATE=${KV_WAN_RATE:-10gbit}
RTTS=${KV_WAN_RTTS:-"0 2 10 50"}
LOSSES=${KV_WAN_LOSSES:-"0 0.1"}
MODEL=${KV_WAN_MODEL:-llama3-8b}
TOKENS=${KV_WAN_TOKENS:-2048}
LAYER_MS=${KV_WAN_LAYER_MS:-4}
REQS=${KV_WAN_REQS:-2}
SECS=${KV_WAN_SECS:-2}
QPS=${KV_WAN_QPS:-2}
MAX_CACHE_MIB=${KV_WAN_MAX_CACHE_MIB:-4096}
REGION_MIB=${KV_WAN_REGION_MIB:-1024}
K=${SOFTRDMA_TDF:-1}
# A real-time bound for a run that needs at most SECONDS of virtual time.
bound() { awk -v s="$1" -v k="$K" 'BEGIN { printf "%d", s * k + 0.5 }'; }
[[ -x $B/bin/kv-demo && -x $B/bin/kv-bench ]] || { echo "build first (kv-demo, kv-bench)" >&2; exit 1; }
OUT=$(mktemp -d /tmp/softrdma-kv-wan.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$OUT"' EXIT
export SOFTRDMA_KV_IB_TIMEOUT=17

rate_bps() {
  awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u);
    m = (u ~ /^g/) ? 1e9 : (u ~ /^m/) ? 1e6 : (u ~ /^k/) ? 1e3 : 1; print n * m }'
}
BPS=$(rate_bps "$RATE")
port=17850
csv="rtt_ms,loss_pct,cache_mib,ideal_ms,whole_ms,layerwise_ms,layer_transfer_ms,write_gbps"
# The cache's layout, without allocating it.
"$B/bin/kv-demo" --describe --model "$MODEL" --tokens "$TOKENS" >"$OUT/describe" ||
  { cat "$OUT/describe" >&2; exit 1; }
layout() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" "$OUT/describe"; }
CACHE_BYTES=$(layout cache_bytes)
BLOCK_BYTES=$(layout block_bytes)
TRANSFERS=$(layout transfers)
BIG=0
moved=$CACHE_BYTES
if ((CACHE_BYTES > MAX_CACHE_MIB * 1048576)); then
  BIG=1
  # Batches of at most 65,536 WRITEs (kv-bench's --batch_size bound), all in flight at once.
  ITERS=$(((TRANSFERS + 65535) / 65536))
  BATCH=$(((TRANSFERS + ITERS - 1) / ITERS))
  moved=$((ITERS * BATCH * BLOCK_BYTES))
  echo "(cache $((CACHE_BYTES / 1048576)) MiB > KV_WAN_MAX_CACHE_MIB $MAX_CACHE_MIB: handed off by kv-bench, $ITERS batches of $BATCH WRITEs of $BLOCK_BYTES B = $((moved / 1048576)) MiB, through $REGION_MIB MiB registered on each side; layer-wise not measured)"
fi
# kv_bench_run BUFFER SECONDS ARGS… → a kv-bench target and initiator through the point's link
# ($wan, store on $port), each registering BUFFER, the initiator writing with ARGS, bounded by
# SECONDS of virtual time (the target by a minute more); the initiator's rows in $OUT/bench.
kv_bench_run() {
  local buffer=$1 secs=$2
  shift 2
  SOFTRDMA_WAN="$wan" timeout "$(bound $((secs + 60)))" "$B/bin/softrdma" run --addr 127.0.32.1 -- \
    "$B/bin/kv-bench" --mode target --serve-metadata --metadata "tcp://127.0.0.1:$port" \
    --buffer_size "$buffer" >"$OUT/target" 2>&1 &
  SOFTRDMA_WAN="$wan" timeout "$(bound "$secs")" "$B/bin/softrdma" run --addr 127.0.32.2 -- \
    "$B/bin/kv-bench" --mode initiator --metadata "tcp://127.0.0.1:$port" --operation write \
    --qps "$QPS" --buffer_size "$buffer" "$@" >"$OUT/bench" 2>&1
  wait
}

echo "## KV hand-off over an emulated link: $RATE, $MODEL, $TOKENS tokens, $LAYER_MS ms compute per layer"
echo
echo "| RTT | loss | ideal (link only) | whole-cache exposed | layer-wise exposed | kv-bench WRITE 1 MiB × $QPS QPs |"
echo "|---|---|---|---|---|---|"
for rtt in $RTTS; do
  for loss in $LOSSES; do
    delay=$(awk -v r="$rtt" 'BEGIN { printf "%gms", r / 2 }')
    # The bottleneck queue: one BDP, at least 1 MiB (the emulator's own floor, 64 KiB, made
    # a 10 Gbit/s link with no delay drop most of every burst: seconds per hand-off).
    queue=$(awk -v b="$BPS" -v r="$rtt" 'BEGIN { q = b / 8 * r / 1000; if (q < 1048576) q = 1048576; printf "%d", q }')
    wan="delay=$delay,rate=$RATE,loss=$loss%,queue=$queue"
    port=$((port + 1))
    # The link alone: the bytes moved at the rate, plus one RTT.
    ideal=$(awk -v m="$moved" -v b="$BPS" -v r="$rtt" 'BEGIN { printf "%.1f", m * 8 / b * 1000 + r }')
    cache_mib=$(awk -v m="$CACHE_BYTES" 'BEGIN { printf "%.1f", m / 1048576 }')
    if ((BIG)); then
      kv_bench_run "${REGION_MIB}m" 540 --block_size "$BLOCK_BYTES" --batch_size "$BATCH" \
        --iterations "$ITERS" --inflight "$ITERS"
      whole=$(awk '$1 == "write" { print $10; exit }' "$OUT/bench")
      gbps=$(awk '$1 == "write" { print $6; exit }' "$OUT/bench")
      if [[ -z $whole ]]; then
        echo "kv-bench failed at RTT $rtt ms, loss $loss %:" >&2
        tail -5 "$OUT/bench" "$OUT/target" >&2
      fi
      echo "| ${rtt} ms | ${loss} % | ${ideal} ms | ${whole:-failed} ms | not measured | ${gbps:-failed} GB/s (the hand-off) |"
      csv+=$'\n'"$rtt,$loss,$cache_mib,$ideal,${whole:-},,,${gbps:-}"
      continue
    fi
    SOFTRDMA_WAN="$wan" timeout "$(bound 300)" "$B/bin/softrdma" run -- "$B/bin/kv-demo" --role both \
      --model "$MODEL" --tokens "$TOKENS" --layer_ms "$LAYER_MS" --requests "$REQS" \
      --metadata "tcp://127.0.0.1:$port" >"$OUT/demo" 2>&1
    whole=$(awk '$1 == "whole" && $NF == "ms" { print $2; exit }' "$OUT/demo")
    lw=$(awk '$1 == "layerwise" && /layer transfers/ { print $2; exit }' "$OUT/demo")
    per=$(awk '$1 == "layerwise" && /layer transfers/ { gsub(/\(/, "", $8); print $8; exit }' "$OUT/demo")
    port=$((port + 1))
    kv_bench_run 128m 120 --block_size 1m --batch_size 64 --duration "$SECS"
    gbps=$(awk '$1 == "write" { print $6; exit }' "$OUT/bench")
    if [[ -z $whole ]]; then
      echo "kv-demo failed at RTT $rtt ms, loss $loss %:" >&2
      tail -5 "$OUT/demo" >&2
    fi
    echo "| ${rtt} ms | ${loss} % | ${ideal} ms | ${whole:-failed} ms | ${lw:-failed} ms (${per:-?} ms per layer) | ${gbps:-failed} GB/s |"
    csv+=$'\n'"$rtt,$loss,$cache_mib,$ideal,${whole:-},${lw:-},${per:-},${gbps:-}"
  done
done
CSV_OUT=${KV_WAN_CSV:-}
[[ $CSV_OUT == 1 ]] && CSV_OUT=docs/kv_wan.csv
[[ $CSV_OUT == 0 ]] && CSV_OUT=
if [[ -n $CSV_OUT ]]; then
  printf '%s\n' "$csv" >"$CSV_OUT"
  echo
  echo "(CSV: $CSV_OUT)"
fi
