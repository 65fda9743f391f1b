#!/usr/bin/env bash
# kv-bench and kv-demo end to end, two processes each over softrdma on loopback: the bench's
# rows have positive GB/s for WRITE (one batch at a time) and READ (3 batches in flight per
# thread, --inflight), the demo verifies every block and prints its
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

timeout 90 "$B/bin/kv-demo" --role both --metadata tcp://127.0.0.1:17792 --model qwen2.5-7b \
  --tokens 512 --layer_ms 1 --requests 2 >"$out/demo" 2>&1 || { cat "$out/demo"; exit 1; }
cat "$out/demo"
grep -q "blocks verified by decode: all match" "$out/demo"
grep -q "layerwise.*layer transfers" "$out/demo"
