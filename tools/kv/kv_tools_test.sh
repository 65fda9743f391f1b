#!/usr/bin/env bash
# kv-bench and kv-demo end to end, two processes each over softrdma on loopback: the bench's
# rows have positive GB/s for WRITE (one batch at a time) and READ (3 batches in flight per
# thread, --inflight), a fixed-size hand-off (--iterations) runs exactly its batches, kv-demo
# --describe gives a known layout, the demo verifies every block and prints its
# TTFT comparison. Each process takes the first free 127.0.0.x; the TCP stores use their
# own ports (17791, 17792).
set -euo pipefail
B=${1:?build dir}
out=$(mktemp -d /tmp/kv-tools-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

for op in write read; do
  inflight=1
  [[ $op == read ]] && inflight=3
  timeout 60 "$B/bin/kv-bench" --mode target --serve-metadata --metadata tcp://127.0.0.1:17791 \
    --buffer_size 16m >"$out/target.$op" 2>&1 &
  timeout 60 "$B/bin/kv-bench" --mode initiator --metadata tcp://127.0.0.1:17791 --operation $op \
    --block_size 16k,1m --qps 1,2 --batch_size 16 --buffer_size 16m --duration 0.3 \
    --inflight $inflight >"$out/init.$op" 2>&1 || { cat "$out/init.$op" "$out/target.$op"; exit 1; }
  wait
  cat "$out/init.$op"
  rows=$(awk -v op=$op '$1 == op && $6 > 0 {n++} END {print n + 0}' "$out/init.$op")
  [ "$rows" = 4 ] || { echo "expected 4 rows with GB/s > 0 for $op, got $rows"; exit 1; }
done

# A hand-off of a fixed size (--iterations): exactly 3 batches in the row, its time positive.
timeout 60 "$B/bin/kv-bench" --mode target --serve-metadata --metadata tcp://127.0.0.1:17791 \
  --buffer_size 1m >"$out/target.iter" 2>&1 &
timeout 60 "$B/bin/kv-bench" --mode initiator --metadata tcp://127.0.0.1:17791 --operation write \
  --block_size 16k --qps 1 --batch_size 128 --buffer_size 1m --iterations 3 --inflight 2 \
  >"$out/init.iter" 2>&1 || { cat "$out/init.iter" "$out/target.iter"; exit 1; }
wait
cat "$out/init.iter"
awk '$1 == "write" && $7 == 3 && $10 > 0 {f = 1} END {exit !f}' "$out/init.iter" ||
  { echo "expected one row of 3 batches with a positive time"; exit 1; }

# --describe: Qwen2.5-7B (28 layers, 4 KV heads of 128 bf16 values: 1 KiB per token and K/V
# part) at 512 tokens is 32 blocks of 16 KiB, 28 × 2 × 32 = 1,792 transfers.
"$B/bin/kv-demo" --describe --model qwen2.5-7b --tokens 512 >"$out/describe"
cat "$out/describe"
grep -q "^layout: cache_bytes=29360128 block_bytes=16384 blocks=32 layers=28 parts=2 transfers=1792$" \
  "$out/describe"

timeout 90 "$B/bin/kv-demo" --role both --metadata tcp://127.0.0.1:17792 --model qwen2.5-7b \
  --tokens 512 --layer_ms 1 --requests 2 >"$out/demo" 2>&1 || { cat "$out/demo"; exit 1; }
cat "$out/demo"
grep -q "blocks verified by decode: all match" "$out/demo"
grep -q "layerwise.*layer transfers" "$out/demo"
