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
echo "## KV hand-off over an emulated link: $RATE, $MODEL, $TOKENS tokens, $LAYER_MS ms compute per layer"
echo
echo "| RTT | loss | ideal (link only) | whole-cache exposed | layer-wise exposed | kv-bench WRITE 1 MiB × 2 QPs |"
echo "|---|---|---|---|---|---|"
for rtt in $RTTS; do
  for loss in $LOSSES; do
    delay=$(awk -v r="$rtt" 'BEGIN { printf "%gms", r / 2 }')
    # The bottleneck queue: one BDP, at least 1 MiB (the emulator's own floor, 64 KiB, made
    # a 10 Gbit/s link with no delay drop most of every burst: seconds per hand-off).
    queue=$(awk -v b="$BPS" -v r="$rtt" 'BEGIN { q = b / 8 * r / 1000; if (q < 1048576) q = 1048576; printf "%d", q }')
    wan="delay=$delay,rate=$RATE,loss=$loss%,queue=$queue"
    port=$((port + 1))
    SOFTRDMA_WAN="$wan" timeout 300 "$B/bin/softrdma" run -- "$B/bin/kv-demo" --role both \
      --model "$MODEL" --tokens "$TOKENS" --layer_ms "$LAYER_MS" --requests "$REQS" \
      --metadata "tcp://127.0.0.1:$port" >"$OUT/demo" 2>&1
    cache_mib=$(awk '/cache/ { for (i = 1; i < NF; i++) if ($(i + 1) == "MiB") { print $i; exit } }' "$OUT/demo")
    whole=$(awk '$1 == "whole" && $NF == "ms" { print $2; exit }' "$OUT/demo")
    lw=$(awk '$1 == "layerwise" && /layer transfers/ { print $2; exit }' "$OUT/demo")
    per=$(awk '$1 == "layerwise" && /layer transfers/ { gsub(/\(/, "", $8); print $8; exit }' "$OUT/demo")
    ideal=$(awk -v m="${cache_mib:-0}" -v b="$BPS" -v r="$rtt" 'BEGIN { printf "%.1f", m * 1048576 * 8 / b * 1000 + r }')
    port=$((port + 1))
    SOFTRDMA_WAN="$wan" "$B/bin/softrdma" run --addr 127.0.32.1 -- "$B/bin/kv-bench" --mode target \
      --serve-metadata --metadata "tcp://127.0.0.1:$port" --buffer_size 128m >"$OUT/target" 2>&1 &
    SOFTRDMA_WAN="$wan" timeout 120 "$B/bin/softrdma" run --addr 127.0.32.2 -- "$B/bin/kv-bench" \
      --mode initiator --metadata "tcp://127.0.0.1:$port" --operation write --block_size 1m \
      --qps 2 --batch_size 64 --buffer_size 128m --duration "$SECS" >"$OUT/bench" 2>&1
    wait
    gbps=$(awk '$1 == "write" { print $6; exit }' "$OUT/bench")
    if [[ -z $whole ]]; then
      echo "kv-demo failed at RTT $rtt ms, loss $loss %:" >&2
      tail -5 "$OUT/demo" >&2
    fi
    echo "| ${rtt} ms | ${loss} % | ${ideal} ms | ${whole:-failed} ms | ${lw:-failed} ms (${per:-?} ms per layer) | ${gbps:-failed} GB/s |"
    csv+=$'\n'"$rtt,$loss,$cache_mib,$ideal,${whole:-},${lw:-},${per:-},${gbps:-}"
  done
done
if [[ ${KV_WAN_CSV:-0} == 1 ]]; then
  printf '%s\n' "$csv" >docs/kv_wan.csv
  echo
  echo "(CSV: docs/kv_wan.csv)"
fi
