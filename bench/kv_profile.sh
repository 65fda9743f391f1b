#!/usr/bin/env bash
# bench/kv_profile.sh [BUILD_DIR] [OP] [BLOCK] [QPS]: profiles both processes of a kv-bench
# pair (target and initiator, same-host path unless SOFTRDMA_TRANSPORT says otherwise) with
# `perf record -g` for 2 s of a 6 s run, 8 MiB buffers (bench/kv_bench.sh's footprint), and
# prints each side's hottest symbols and its samples per thread. OP: write or read (default
# read); BLOCK default 1m; QPS default 4. Needs perf (Debian package linux-perf) and root or
# kernel.perf_event_paranoid <= 1. The perf.data files stay in $OUT (default a temp dir,
# printed) for `perf report -i` / `perf annotate -i`.
set -euo pipefail
B=${1:-build}
OP=${2:-read}
BLOCK=${3:-1m}
QPS=${4:-4}
OUT=${OUT:-$(mktemp -d /tmp/kv-profile-XXXXXX)}
PORT=${PORT:-17797}
command -v perf >/dev/null || { echo "perf is missing (apt-get install linux-perf)" >&2; exit 2; }
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

"$B"/bin/softrdma run --addr 127.0.32.3 -- timeout 60 "$B"/bin/kv-bench --mode target \
  --serve-metadata --metadata "tcp://127.0.0.1:$PORT" --buffer_size 8m >"$OUT/target.log" 2>&1 &
"$B"/bin/softrdma run --addr 127.0.32.4 -- timeout 60 "$B"/bin/kv-bench --mode initiator \
  --metadata "tcp://127.0.0.1:$PORT" --operation "$OP" --block_size "$BLOCK" --qps "$QPS" \
  --batch_size 32 --buffer_size 8m --duration 6 >"$OUT/initiator.log" 2>&1 &
sleep 2
# The kv-bench processes themselves (not `softrdma run` or `timeout` around them).
pid_of() {
  local p
  for p in $(pgrep -x kv-bench); do
    if grep -q -- "$1" "/proc/$p/cmdline"; then echo "$p"; fi
  done | head -1
}
T=$(pid_of target)
I=$(pid_of initiator)
[[ -n $T && -n $I ]] || { echo "kv-bench did not start; see $OUT/*.log" >&2; exit 1; }
perf record -F 999 -g -p "$T" -o "$OUT/target.data" -- sleep 2 >/dev/null 2>&1 &
perf record -F 999 -g -p "$I" -o "$OUT/initiator.data" -- sleep 2 >/dev/null 2>&1 &
wait
grep -v '^#' "$OUT/initiator.log"
for side in target initiator; do
  echo "## $side: samples per thread"
  perf report -i "$OUT/$side.data" --no-children -s pid --stdio -g none 2>/dev/null |
    grep -vE '^#|^$' | head -4
  echo "## $side: hottest symbols"
  perf report -i "$OUT/$side.data" --no-children -s symbol --stdio -g none 2>/dev/null |
    grep -vE '^#|^$' | head -15 | cut -c1-110
done
echo "(perf data: $OUT)"
