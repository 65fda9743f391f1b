#!/usr/bin/env bash
# bench/kv_bench.sh [BUILD_DIR] [SECONDS]: kv-bench WRITE and READ over block sizes 16 KiB–
# 4 MiB and 1–8 QPs per peer, beside Debian's ib_write_bw / ib_read_bw (perftest, through
# `softrdma run`, -d srdma0 -x 0) on the same path (SOFTRDMA_TRANSPORT, default auto: two
# processes on this host talk through shared memory). Prints the tables docs/kv.md shows.
set -euo pipefail
B=${1:-build}
SECS=${2:-2}
BLOCKS=${BLOCKS:-16k,64k,256k,1m,4m}
QPS=${QPS:-1,2,4,8}
out=$(mktemp -d /tmp/kv-bench-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

echo "## perftest on the same path (BW average, GB/s = 1e9 B/s)"
port=18990
for tool in ib_write_bw ib_read_bw; do
  for size in 65536 1048576 4194304; do
    port=$((port + 1))
    $B/bin/softrdma run --addr 127.0.30.1 -- timeout 60 $tool -d srdma0 -x 0 -s $size -D "$SECS" -p $port >"$out/srv" 2>&1 &
    sleep 0.5
    $B/bin/softrdma run --addr 127.0.30.2 -- timeout 60 $tool -d srdma0 -x 0 -s $size -D "$SECS" -p $port 127.0.0.1 >"$out/cli" 2>&1
    wait
    awk -v t=$tool -v s=$size '/BW average/ {getline; printf "%s %8d B: %.3f GB/s\n", t, s, $4 * 1048576 / 1e9; exit}' "$out/cli"
  done
done

for op in write read; do
  echo "## kv-bench $op"
  $B/bin/softrdma run --addr 127.0.30.3 -- $B/bin/kv-bench --mode target --serve-metadata \
    --metadata tcp://127.0.0.1:17793 --buffer_size 256m >"$out/target" 2>&1 &
  $B/bin/softrdma run --addr 127.0.30.4 -- $B/bin/kv-bench --mode initiator \
    --metadata tcp://127.0.0.1:17793 --operation $op --block_size "$BLOCKS" --qps "$QPS" \
    --batch_size 32 --buffer_size 256m --duration "$SECS"
  wait
done
