#!/usr/bin/env bash
# wan_study_plots.sh DIR — the study's model plots from the CSVs bench/wan_study.sh wrote in
# DIR (gnuplot, pngcairo):
#   train_util.png        compute utilisation vs WAN rate, Llama-3-8B-sized (8 B) training,
#                         per mode, at 1,500 km and intercontinental (train_util.csv)
#   kv_max_context.png    largest context within 200 ms of added TTFT, bf16, layer-wise,
#                         warm QP: route × rate per model (kv_max_context.csv)
#   kv_production.png     KV production rate during prefill vs context (kv_production.csv)
#   model_vs_emulation.png  emulated against predicted, with ±10 % (check.csv, when present)
set -euo pipefail
D=$1
command -v gnuplot >/dev/null || { echo "wan_study_plots.sh: gnuplot not found" >&2; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

modes="ring hier hier-bf16 hier-int8 diloco-H10 diloco-H100 diloco-H500 streaming-diloco-H100"
routes="same-DC metro-100km 1500km 5000km intercontinental-10000km"
models="llama3-8b llama3-70b qwen2.5-7b deepseek-v3 jamba-v0.1"
for route in 1500km intercontinental-10000km; do
  for m in $modes; do
    awk -F, -v m="$m" -v r="$route" '$1 == 8000000000 && $2 == m && $4 == r {print $3, $9 * 100}' \
      "$D/train_util.csv" >"$tmp/u_${route}_$m.dat"
  done
done
# Heat map cells: x = rate index, y = route index, value = max context (K tokens).
for model in $models; do
  awk -F, -v mo="$model" -v routes="$routes" '
    BEGIN { n = split(routes, rs, " "); for (i = 1; i <= n; i++) ri[rs[i]] = i - 1
            split("1 10 100 400", rt, " "); for (i = 1; i <= 4; i++) xi[rt[i]] = i - 1 }
    $1 == mo && $2 == 16 && $3 == "layer" && $4 == "warm" && $8 == 0 {
      print xi[$5], ri[$6], $10 / 1024, $14 }' "$D/kv_max_context.csv" >"$tmp/h_$model.dat"
  awk -F, -v mo="$model" '$1 == mo && $3 == 16 {print $2 / 1024, $7}' "$D/kv_production.csv" \
    >"$tmp/p_$model.dat"
done

plot_modes() {
  local route=$1 s=""
  for m in $modes; do s+="'$tmp/u_${route}_$m.dat' using 1:2 with lines lw 2 title '$m', "; done
  echo "${s%, }"
}
heat() {
  echo "set title '$1'; plot '$tmp/h_$1.dat' using 1:2:3 with image notitle, \
    '' using 1:2:(sprintf('%d%s', \$3, \$4 > 0.5 ? '+' : '')) with labels notitle"
}
gnuplot <<GP
set terminal pngcairo size 1200,520 font 'sans,10'
set output '$D/train_util.png'
set multiplot layout 1,2 title 'Training an 8 B model over 2 sites × 8 H100 (40 % MFU, 8,192 tokens/GPU/step, fp32 gradients): compute / step time'
set logscale x
set xlabel 'WAN rate (Gbit/s)'
set ylabel 'compute utilisation (%)'
set yrange [0:100]
set grid
set key bottom right font ',8'
set arrow from graph 0, first 90 to graph 1, first 90 nohead dt 2
set title '1,500 km (RTT 19.6 ms)'
plot $(plot_modes 1500km)
set title 'intercontinental 10,000 km (RTT 130 ms)'
plot $(plot_modes intercontinental-10000km)
unset multiplot

set terminal pngcairo size 1300,760 font 'sans,9'
set output '$D/kv_max_context.png'
unset logscale
unset arrow
unset grid
set multiplot layout 2,3 title 'Largest context (K tokens, of 1-128 K) whose KV hand-off adds <= 200 ms to TTFT: bf16, layer-wise, warm QP, no loss'
set xtics ('1' 0, '10' 1, '100' 2, '400' 3)
set ytics ('same DC' 0, '100 km' 1, '1,500 km' 2, '5,000 km' 3, '10,000 km' 4)
set xlabel 'Gbit/s'
set ylabel ''
set cbrange [0:128]
set palette defined (0 '#d7301f', 16 '#fdae61', 64 '#ffffbf', 128 '#1a9850')
unset colorbox
set xrange [-0.5:3.5]
set yrange [-0.5:4.5]
$(for m in $models; do heat "$m"; done)
unset multiplot

set terminal pngcairo size 900,540 font 'sans,10'
set output '$D/kv_production.png'
set autoscale
unset xtics
unset ytics
set xtics
set ytics
set logscale xy
set grid
set key top right
set xlabel 'context (K tokens)'
set ylabel 'KV produced during prefill (Gbit/s)'
set title 'KV-cache production rate during prefill (bf16, H100 × 40 % MFU; 70B on 8, DeepSeek-V3 on 32, Jamba on 2 GPUs)'
set arrow from graph 0, first 10 to graph 1, first 10 nohead dt 2
set arrow from graph 0, first 100 to graph 1, first 100 nohead dt 2
set arrow from graph 0, first 400 to graph 1, first 400 nohead dt 2
plot $(for m in $models; do printf "'%s' using 1:2 with linespoints title '%s', " "$tmp/p_$m.dat" "$m"; done | sed 's/, $//')
GP

if [[ -s $D/check.csv ]]; then
  awk -F, 'NR > 1 && $1 ~ /^kv/ {print $7, $6}' "$D/check.csv" >"$tmp/c_kv.dat"
  awk -F, 'NR > 1 && $1 == "train" {print $7, $6}' "$D/check.csv" >"$tmp/c_train.dat"
  gnuplot <<GP
set terminal pngcairo size 700,620 font 'sans,10'
set output '$D/model_vs_emulation.png'
set logscale xy
set grid
set key top left
set xlabel 'model (ms)'
set ylabel 'emulated, K-dilated (ms)'
set title 'Model vs the emulated stack, 10 Gbit/s, RTT 0/10/50 ms (check.csv)'
f(x) = x
plot [1:3000][1:3000] f(x) with lines lc 'black' title 'equal', 1.1 * x with lines dt 2 lc 'gray' title '±10 %', \
  0.9 * x with lines dt 2 lc 'gray' notitle, \
  '$tmp/c_kv.dat' using 1:2 with points pt 7 ps 1.3 title 'KV hand-off', \
  '$tmp/c_train.dat' using 1:2 with points pt 5 ps 1.3 title 'training step'
GP
fi
echo "wan_study_plots.sh: PNGs in $D" >&2
