#!/usr/bin/env bash
# wan_study.sh — the training-vs-inference study over an emulated wide-area link
# (docs/wide-area.md, "The study"). Two sites on this machine: A = 127.0.0.1–2 (prefill,
# ranks 0–1), B = 127.0.0.3–4 (decode, ranks 2–3); one link A <-> B whose one-way delay is
# RTT/2, with random loss on each direction, a rate limit and a queue of max(1 BDP, 4 MiB).
#
#   Training: 4 ranks of build/bin/wan_study train, per point and per mode (ring, hier,
#     hier-bf16, local-sgd); each step = compute sleep + AllReduce (sum→avg, float32).
#   Inference: 2 ranks (127.0.0.1 at A, 127.0.0.3 at B) of wan_study kv: whole cache vs
#     layer by layer, for Llama-3-8B (32 layers, 128 KiB/token) and Qwen2.5-7B (28 layers,
#     56 KiB/token).
#   Each with go-back-N and selective retransmission (SOFTRDMA_SELECTIVE_RETX=0/1).
#
# Usage: bash bench/wan_study.sh [--quick|--tiny] [--build DIR] [--out DIR]
#   (default)  RTT 0 1 5 10 20 50 ms × loss 0 0.01 0.1 1 % × rate 1 and 10 Gbit/s, 2 K and
#              8 K tokens — hours on a 2-core machine.
#   --quick    RTT 0 5 20 50 ms × loss 0 0.1 % at 1 Gbit/s, Llama-3-8B 2 K tokens: ~10 min.
#   --tiny     two points, small sizes (the ctest wan_study.tiny): seconds.
# Output in DIR (default bench/results/wan_study): study.csv, train_step.png,
# train_share.png, kv_handoff.png, kv_loss.png. Run it under
# flock /tmp/softrdma-test.lock (it uses 127.0.0.1–4).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
B=$here/../build
OUT=$here/results/wan_study
profile=full
while (($#)); do
  case $1 in
    --quick) profile=quick ;;
    --tiny) profile=tiny ;;
    --build) B=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "wan_study.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
tool=$B/bin/wan_study
[[ -x $tool ]] || { echo "wan_study.sh: $tool not built (cmake --build build --target wan_study)" >&2; exit 2; }
mkdir -p "$OUT"

# Sweep and sizes per profile. Gradient: 4 MiB of float32 (1 M parameters — a 25 M-parameter
# model's 100 MB would take minutes per point at 1 Gbit/s); compute 50 ms per step.
case $profile in
  full) RTTS="0 1 5 10 20 50"; LOSSES="0 0.01 0.1 1"; RATES="1gbit 10gbit"; TOKENS="2048 8192"
        GRAD=$((4 << 20)); STEPS=10; MODELS="llama3-8b qwen2.5-7b" ;;
  quick) RTTS="0 5 20 50"; LOSSES="0 0.1"; RATES="1gbit"; TOKENS="2048"
         GRAD=$((4 << 20)); STEPS=6; MODELS="llama3-8b" ;;
  tiny) RTTS="10"; LOSSES="0"; RATES="1gbit"; TOKENS="64"
        GRAD=$((64 << 10)); STEPS=2; MODELS="llama3-8b" ;;
esac
COMPUTE_MS=50
SYNC_EVERY=4
LAYER_MS=5  # per-layer prefill compute: 160 ms for a 32-layer 2 K-token prefill
MODES="ring hier hier-bf16 local-sgd"
[[ $profile == tiny ]] && MODES="ring hier-bf16"
declare -A layers=([llama3-8b]=32 [qwen2.5-7b]=28)
declare -A per_token=([llama3-8b]=131072 [qwen2.5-7b]=57344)

csv=$OUT/study.csv
echo "kind,rate,rtt_ms,loss_pct,retx,mode,model,tokens,bytes,steps_or_layers,compute_ms,step_or_handoff_ms,comm_ms,comm_share" >"$csv"
topo=$OUT/topology.wan
port=$((21000 + RANDOM % 8000))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# run_ranks N RETX SITE... -- ARGS: starts N wan_study processes, rank r at 127.0.0.(r+1)
# — except kv's decode, which is 127.0.0.3 — and prints rank `printer`'s stdout.
run_ranks() {
  local n=$1 retx=$2 printer=$3; shift 3
  local sites=() addrs=()
  while [[ $1 != -- ]]; do sites+=("${1%@*}"); addrs+=("${1#*@}"); shift; done
  shift
  port=$((port + 2))
  pids=()
  local r
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      SOFTRDMA_ADDR=${addrs[r]} SOFTRDMA_WAN=$topo SOFTRDMA_CCL_SITE=${sites[r]} \
      SOFTRDMA_SELECTIVE_RETX=$retx SOFTRDMA_CCL_IB_TIMEOUT=$ib_timeout SOFTRDMA_CCL_TIMEOUT_MS=120000 \
      timeout 600 "$tool" "$@" >"$OUT/rank$r.out" 2>"$OUT/rank$r.err" &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  pids=()
  if ((rc != 0)); then
    echo "wan_study.sh: wan_study $* failed (rc $rc):" >&2
    cat "$OUT"/rank*.err >&2
    return 1
  fi
  cat "$OUT/rank$printer.out"
}

# queue_bytes RATE RTT_MS → the bottleneck's FIFO: one bandwidth-delay product, at least
# 4 MiB (a shallower queue at small RTTs tail-drops the ring's 2 MiB in flight per link every
# step — without congestion control, item 3 of the issue — and the study would measure
# retransmit timeouts instead of distance).
queue_bytes() {
  local bps=${1%gbit}
  awk -v g="$bps" -v r="$2" 'BEGIN{b = g * 1e9 / 8 * r / 1000; m = 4 * 1048576; printf "%d", (b > m ? b : m)}'
}

for rate in $RATES; do
  for rtt in $RTTS; do
    for loss in $LOSSES; do
      cat >"$topo" <<TOPO
site A 127.0.0.1-127.0.0.2
site B 127.0.0.3-127.0.0.4
link A <-> B delay=$(awk "BEGIN{print $rtt/2}")ms rate=$rate loss=${loss}% queue=$(queue_bytes "$rate" "$rtt")
TOPO
      # QP ACK timeout 4.096 µs·2^x above twice the loaded round trip (RTT + a full queue).
      ib_timeout=$(awk -v r="$rtt" 'BEGIN{x = 14; while (4.096e-3 * 2^x < 2 * (r + 70)) x++; print x}')
      for retx in 0 1; do
        for mode in $MODES; do
          line=$(run_ranks 4 $retx 0 A@127.0.0.1 A@127.0.0.2 B@127.0.0.3 B@127.0.0.4 -- \
            train --mode "$mode" --bytes $GRAD --steps $STEPS --compute-ms $COMPUTE_MS \
            --sync-every $SYNC_EVERY)
          IFS=, read -r _ m bytes steps cms step comm share <<<"$line"
          echo "train,$rate,$rtt,$loss,$retx,$m,,,$bytes,$steps,$cms,$step,$comm,$share" >>"$csv"
          echo "train rate=$rate rtt=${rtt}ms loss=$loss% retx=$retx $m: step ${step} ms, communicating $share" >&2
        done
        for model in $MODELS; do
          for tokens in $TOKENS; do
            for layout in whole layer; do
              line=$(run_ranks 2 $retx 1 A@127.0.0.1 B@127.0.0.3 -- kv --layout $layout \
                --layers "${layers[$model]}" --bytes-per-token "${per_token[$model]}" \
                --tokens "$tokens" --layer-ms $LAYER_MS)
              IFS=, read -r _ lay bytes nl lms handoff <<<"$line"
              echo "kv,$rate,$rtt,$loss,$retx,$lay,$model,$tokens,$bytes,$nl,$lms,$handoff,," >>"$csv"
              echo "kv rate=$rate rtt=${rtt}ms loss=$loss% retx=$retx $model $tokens tok $lay: +$handoff ms to first token" >&2
            done
          done
        done
      done
    done
  done
done
rm -f "$OUT"/rank*.out "$OUT"/rank*.err "$topo"

# The CSV must hold one row per run, each with a positive time.
words() { set -- $1; echo $#; }
expect=$(( $(words "$RATES") * $(words "$RTTS") * $(words "$LOSSES") * 2 *
  ($(words "$MODES") + $(words "$MODELS") * $(words "$TOKENS") * 2) ))
rows=$(awk -F, 'NR > 1 && $12 + 0 > 0' "$csv" | wc -l)
if ((rows != expect || $(wc -l <"$csv") != expect + 1)); then
  echo "wan_study.sh: $csv has $rows good rows of $(($(wc -l <"$csv") - 1)), expected $expect" >&2
  exit 1
fi
echo "wan_study.sh: $csv: $rows rows, as expected" >&2

[[ $profile == tiny ]] && exit 0
command -v gnuplot >/dev/null || { echo "gnuplot not found: no plots" >&2; exit 0; }
rate1=${RATES%% *}
loss_hi=${LOSSES##* }
# series FILTER → "rtt value" lines from the CSV.
series() { awk -F, "$1" "$csv" | sort -t' ' -k1,1n; }
for mode in $MODES; do
  series "\$1==\"train\" && \$2==\"$rate1\" && \$4==0 && \$5==1 && \$6==\"$mode\" {print \$3, \$12, \$14*100}" >"$OUT/train_$mode.dat"
done
for layout in whole layer; do
  for loss in 0 $loss_hi; do
    for retx in 0 1; do
      series "\$1==\"kv\" && \$2==\"$rate1\" && \$4==$loss && \$5==$retx && \$6==\"$layout\" && \$7==\"llama3-8b\" && \$8==2048 {print \$3, \$12}" >"$OUT/kv_${layout}_${loss}_${retx}.dat"
    done
  done
done
gnuplot <<GP
set terminal pngcairo size 900,540 font 'sans,10'
set key top left
set grid
set xlabel 'round-trip time (ms)'
set output '$OUT/train_step.png'
set title 'Training step, 4 ranks (2 per site), 4 MiB gradient, 50 ms compute, $rate1, 0 % loss, selective'
set ylabel 'step time (ms)'
plot $(for m in $MODES; do printf "'%s' using 1:2 with linespoints title '%s', " "$OUT/train_$m.dat" "$m"; done | sed 's/, $//')
set output '$OUT/train_share.png'
set title 'Share of the step spent communicating (same runs)'
set ylabel '% of step time'
plot $(for m in $MODES; do printf "'%s' using 1:3 with linespoints title '%s', " "$OUT/train_$m.dat" "$m"; done | sed 's/, $//')
set output '$OUT/kv_handoff.png'
set title 'KV hand-off A→B, Llama-3-8B 2 K tokens (256 MiB), $rate1: time added to first token'
set ylabel 'added TTFT (ms)'
plot '$OUT/kv_whole_0_1.dat' using 1:2 with linespoints title 'whole cache, 0 %', \
     '$OUT/kv_layer_0_1.dat' using 1:2 with linespoints title 'layer by layer, 0 %', \
     '$OUT/kv_whole_${loss_hi}_1.dat' using 1:2 with linespoints title 'whole, ${loss_hi} % selective', \
     '$OUT/kv_whole_${loss_hi}_0.dat' using 1:2 with linespoints title 'whole, ${loss_hi} % go-back-N', \
     '$OUT/kv_layer_${loss_hi}_1.dat' using 1:2 with linespoints title 'layer, ${loss_hi} % selective', \
     '$OUT/kv_layer_${loss_hi}_0.dat' using 1:2 with linespoints title 'layer, ${loss_hi} % go-back-N'
GP
rm -f "$OUT"/*.dat
echo "wrote $csv and PNGs in $OUT" >&2
