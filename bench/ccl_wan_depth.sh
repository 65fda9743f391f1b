#!/usr/bin/env bash
# ccl over a long path with a fixed window against the window from the path (issue 23,
# item 3): the same wan_study binary with SOFTRDMA_CCL_DEPTH_FROM_PATH=0 (4 chunks of 512 KiB
# in flight per peer) and =1 (⌈RTT × port rate ÷ chunk⌉, docs/collectives.md "Depth"),
# alternately, through one emulated link between two sites on this machine.
#
#   bash bench/ccl_wan_depth.sh        (needs a built build/ tree)
#
# Environment: RATE (10gbit), RTT in ms (50), K = SOFTRDMA_TDF (20), RUNS (2).
# Workloads: a 64 MiB Send/Recv (wan_study kv --layout whole, Llama-3-8B × 512 tokens, 2
# ranks) and a 64 MiB ring AllReduce step (wan_study train --mode ring, 4 ranks, 2 per site,
# no compute). Prints each run in virtual ms and the medians' ratio. Addresses 127.0.77.1–4,
# TCP ports from 19900. Nothing here is a test: figures depend on the machine and its load.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
tool=build/bin/wan_study
[[ -x $tool ]] || { echo "build first: cmake --build --preset default" >&2; exit 1; }
RATE=${RATE:-10gbit} RTT=${RTT:-50} K=${K:-20} RUNS=${RUNS:-2}
OUT=$(mktemp -d /tmp/softrdma-ccl-depth.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
topo=$OUT/topo
queue=$(awk -v g="${RATE%gbit}" -v r="$RTT" 'BEGIN{b = g * 1e9 / 8 * r / 1000; m = 4 * 1048576; printf "%d", (b > m ? b : m)}')
cat >"$topo" <<T
site A 127.0.77.1-127.0.77.2
site B 127.0.77.3-127.0.77.4
link A <-> B delay=$(awk "BEGIN{print $RTT/2}")ms rate=$RATE loss=0% queue=$queue
T
# QP ACK timeout 4.096 µs·2^x above twice the loaded round trip (as bench/wan_study.sh).
ib_timeout=$(awk -v r="$RTT" 'BEGIN{x = 14; while (4.096e-3 * 2^x < 2 * (r + 70)) x++; print x}')
port=19900

# run N FROM_PATH ARGS... → the printing rank's CSV line
run() {
  local n=$1 from_path=$2 r pids=() addrs sites
  shift 2
  if ((n == 2)); then addrs=(127.0.77.1 127.0.77.3) sites=(A B); else
    addrs=(127.0.77.1 127.0.77.2 127.0.77.3 127.0.77.4) sites=(A A B B); fi
  port=$((port + 1))
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n MASTER_ADDR=${addrs[0]} MASTER_PORT=$port SOFTRDMA_ADDR=${addrs[r]} \
      SOFTRDMA_WAN=$topo SOFTRDMA_CCL_SITE=${sites[r]} SOFTRDMA_CCL_IB_TIMEOUT=$ib_timeout \
      SOFTRDMA_CCL_TIMEOUT_MS=120000 SOFTRDMA_TDF=$K SOFTRDMA_CCL_DEPTH_FROM_PATH=$from_path \
      timeout 600 "$tool" "$@" >"$OUT/r$r.out" 2>"$OUT/r$r.err" &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  ((rc == 0)) || { echo "ccl_wan_depth.sh: wan_study $* failed:" >&2; cat "$OUT"/r*.err >&2; return 1; }
  if ((n == 2)); then cat "$OUT/r1.out"; else cat "$OUT/r0.out"; fi
}

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "link $RATE, RTT $RTT ms, 1-BDP FIFO, K = $K; $RUNS runs each, alternating (virtual ms)"
declare -A t
for ((i = 0; i < RUNS; i++)); do
  for fp in 0 1; do
    t[kv$fp]+="$(run 2 $fp kv --layout whole --layers 32 --bytes-per-token 131072 --tokens 512 \
      --layer-ms 2 | cut -d, -f6) "
    t[ring$fp]+="$(run 4 $fp train --mode ring --bytes 67108864 --steps 3 --compute-ms 0 |
      cut -d, -f6) "
  done
done
echo "| workload | fixed depth (runs) | depth from the path (runs) | fixed / from path (medians) |"
echo "|---|---|---|---|"
for w in kv ring; do
  a=$(tr ' ' '\n' <<<"${t[${w}0]}" | grep . | median)
  b=$(tr ' ' '\n' <<<"${t[${w}1]}" | grep . | median)
  name="64 MiB Send/Recv, 2 ranks"
  [[ $w == ring ]] && name="64 MiB ring AllReduce step, 4 ranks"
  echo "| $name | ${t[${w}0]}| ${t[${w}1]}| $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.1f×", a / b}') |"
done
