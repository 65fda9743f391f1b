#!/usr/bin/env bash
# PyTorch benchmark (issue 12): the softrdma torch.distributed backend against Gloo, in the
# same runs. A benchmark, not a test: the figures depend on the machine and its load.
#
#   bash bench/torch_bench.sh [micro] [steps] [accuracy] [wan]     (default: all four)
#
#   micro     bench/torch_bench.py with 2 and 4 ranks: all_reduce, all_gather, reduce_scatter
#             of float32 tensors 8 B … 64 MiB (×8), median times, busbw, Gloo/softrdma ratio;
#             RUNS runs, then per size the median over them: a markdown table, CSV in
#             $OUT/micro.csv, plots docs/pytorch_{all_reduce,all_gather,reduce_scatter}.png
#   steps     the three training examples (DDP, ZeRO-1, FSDP-style) with 2 and 4 ranks,
#             STEPS steps each with --backend softrdma,gloo and gloo,softrdma: median step
#             time per backend and the largest difference of the two loss curves
#   accuracy  each example for EPOCHS epochs with 2 ranks over softrdma: test accuracy
#   wan       the DDP example between two emulated sites (one rank each, A = 127.0.60.1,
#             B = 127.0.60.2; SOFTRDMA_WAN link A <-> B with one-way delay RTT/2 at RATE):
#             median step time per RTT in WAN_RTTS; QP ACK timeout 4.096 µs·2^x above
#             2·(RTT + 70 ms), as bench/wan_study.sh
# Everything runs through `build/bin/softrdma run -- torchrun --redirects 1 --tee 1 ...`
# (Debian 12's torchrun needs --redirects/--tee other than 0 under Python 3.11, see
# docs/pytorch.md). Hold /tmp/softrdma-test.lock while it runs when others share the host.
#
# Environment [defaults]: BUILD [build], OUT [/tmp/softrdma-torch-bench], PORT [29540],
# RUNS [3], STEPS [40], EPOCHS [3], WAN_RTTS ["0 5 20 50"] (ms), RATE [1gbit], WAN_STEPS [30],
# PYTHON [/usr/bin/python3], PLOT [docs] ("" for no plots).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/softrdma-torch-bench}
PORT=${PORT:-29540}
STEPS=${STEPS:-40}
RUNS=${RUNS:-3}
EPOCHS=${EPOCHS:-3}
WAN_RTTS=${WAN_RTTS:-"0 5 20 50"}
RATE=${RATE:-1gbit}
WAN_STEPS=${WAN_STEPS:-30}
PYTHON=${PYTHON:-/usr/bin/python3}
PLOT=${PLOT-docs}
parts=("$@")
((${#parts[@]})) || parts=(micro steps accuracy wan)
mkdir -p "$OUT"

if [[ ! -e $BUILD/python/softrdma_torch/__init__.py ]]; then
  echo "torch_bench: $BUILD/python/softrdma_torch missing: cmake --build $BUILD --target softrdma_torch" >&2
  exit 1
fi
TORCHRUN=$(command -v torchrun || echo /usr/bin/torchrun)

# torchrun NPROC SCRIPT ARGS... over softrdma (stdout lines carry torchrun's "[rank]:" prefix).
trun() {
  local n=$1
  shift
  "$BUILD/bin/softrdma" run -- "$TORCHRUN" --redirects 1 --tee 1 --nproc_per_node "$n" \
    --master_addr 127.0.0.1 --master_port "$PORT" "$@"
}

micro() {
  local run n
  for ((run = 1; run <= RUNS; run++)); do
    rm -f "$OUT/micro.$run.csv"
    for n in 2 4; do
      echo "## micro-benchmark, $n ranks, run $run of $RUNS"
      trun "$n" bench/torch_bench.py --csv "$OUT/micro.$run.csv" 2>&1 |
        grep -v '^\[default[1-9]' | sed 's/^\[default0\]://' |
        grep -v -e '^WARNING' -e '^\*\*\*' -e 'OMP_NUM_THREADS'
    done
  done
  median_micro
  [[ -n $PLOT ]] && plot_micro
}

# $OUT/micro.csv: per collective, rank count and size, the median over the runs of each
# column (ratio recomputed from the median times); printed as a markdown table.
median_micro() {
  "$PYTHON" - "$OUT" "$RUNS" <<'EOF'
import csv, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
rows = {}
for r in range(1, runs + 1):
    try:
        f = open(f"{out}/micro.{r}.csv")
    except OSError:
        continue
    for row in csv.DictReader(f):
        rows.setdefault((row["collective"], int(row["ranks"]), int(row["bytes"])), []).append(row)
cols = ["softrdma_s", "gloo_s", "softrdma_busbw", "gloo_busbw"]
with open(f"{out}/micro.csv", "w") as f:
    f.write("collective,ranks,bytes,runs,softrdma_s,gloo_s,softrdma_busbw,gloo_busbw,gloo_over_softrdma\n")
    print(f"## medians over {runs} runs")
    print("| collective | ranks | bytes | softrdma µs | Gloo µs | softrdma busbw GB/s | Gloo busbw GB/s | Gloo / softrdma time |")
    print("|---|---|---|---|---|---|---|---|")
    for (c, n, b), rs in sorted(rows.items()):
        m = {k: statistics.median(float(x[k]) for x in rs) for k in cols}
        ratio = m["gloo_s"] / m["softrdma_s"]
        f.write(f"{c},{n},{b},{len(rs)},{m['softrdma_s']},{m['gloo_s']},{m['softrdma_busbw']},{m['gloo_busbw']},{ratio}\n")
        print(f"| {c} | {n} | {b} | {m['softrdma_s'] * 1e6:.1f} | {m['gloo_s'] * 1e6:.1f} | "
              f"{m['softrdma_busbw']:.3f} | {m['gloo_busbw']:.3f} | {ratio:.2f} |")
EOF
}

plot_micro() {
  local coll
  for coll in all_reduce all_gather reduce_scatter; do
    for n in 2 4; do
      awk -F, -v c="$coll" -v n="$n" '$1 == c && $2 == n {print $3, $7, $8}' "$OUT/micro.csv" \
        >"$OUT/$coll.$n.dat"
    done
    gnuplot <<EOF
set terminal pngcairo size 800,500 noenhanced
set output "$PLOT/pytorch_$coll.png"
set title "torch.distributed $coll, float32: softrdma backend vs Gloo (medians)"
set logscale x 2
set format x "%.0b %BB"
set xlabel "size (bytes)"
set ylabel "bus bandwidth (GB/s)"
set key top left
set grid
plot "$OUT/$coll.2.dat" using 1:2 with linespoints title "softrdma, 2 ranks", \
     "$OUT/$coll.2.dat" using 1:3 with linespoints title "gloo, 2 ranks", \
     "$OUT/$coll.4.dat" using 1:2 with linespoints title "softrdma, 4 ranks", \
     "$OUT/$coll.4.dat" using 1:3 with linespoints title "gloo, 4 ranks"
EOF
  done
  echo "plots: $PLOT/pytorch_{all_reduce,all_gather,reduce_scatter}.png"
}

steps() {
  local n ex order
  for n in 2 4; do
    for ex in ddp zero fsdp; do
      # Both orders: the backend that trains second finds warm caches and allocator.
      for order in softrdma,gloo gloo,softrdma; do
        echo "## $ex, $n ranks, $STEPS steps, --backend $order"
        trun "$n" "pytorch/examples/train_$ex.py" --backend "$order" --epochs 1 \
          --max-steps "$STEPS" --no-eval 2>&1 | grep '^\[default0\]' | sed 's/^\[default0\]://'
      done
    done
  done
}

accuracy() {
  for ex in ddp zero fsdp; do
    echo "## $ex, 2 ranks, $EPOCHS epochs, softrdma"
    trun 2 "pytorch/examples/train_$ex.py" --epochs "$EPOCHS" 2>&1 | grep '^\[default0\]' |
      sed 's/^\[default0\]://'
  done
}

wan() {
  local rtt x topo
  for rtt in $WAN_RTTS; do
    x=$(awk -v r="$rtt" 'BEGIN{x = 14; while (4.096e-3 * 2^x < 2 * (r + 70)) x++; print x}')
    topo=$OUT/wan-$rtt.topo
    {
      echo "site A 127.0.60.1"
      echo "site B 127.0.60.2"
      echo "link A <-> B delay=$(awk -v r="$rtt" 'BEGIN{printf "%gms", r / 2}') rate=$RATE queue=4m"
    } >"$topo"
    echo "## ddp over the wide area: RTT $rtt ms, $RATE, 2 ranks (one per site), $WAN_STEPS steps"
    SOFTRDMA_CCL_IB_TIMEOUT=$x SOFTRDMA_CCL_TIMEOUT_MS=120000 \
      "$BUILD/bin/softrdma" run --wan "$topo" -- "$TORCHRUN" --redirects 1 --tee 1 \
      --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$PORT" \
      pytorch/examples/train_ddp.py --addrs 127.0.60.1,127.0.60.2 --epochs 1 \
      --max-steps "$WAN_STEPS" --no-eval 2>&1 | grep '^\[default0\]' | sed 's/^\[default0\]://'
  done
}

for p in "${parts[@]}"; do
  case $p in
    micro | steps | accuracy | wan) "$p" ;;
    *)
      echo "torch_bench: unknown part '$p' (micro, steps, accuracy, wan)" >&2
      exit 2
      ;;
  esac
done
