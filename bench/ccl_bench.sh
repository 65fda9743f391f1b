#!/usr/bin/env bash
# AllReduce benchmark: softrdma's collectives against Open MPI and Gloo, in one run on this
# machine. A benchmark, not a test: the figures depend on the machine and its load.
#
#   bash bench/ccl_bench.sh [ITERS]       (default 20; needs a built build/ tree)
#
# Measures AllReduce, float, sum, with 2 and 4 ranks (one process each, all on this host),
# REPEATS times each, alternating implementations so that drifting load hits all alike:
#   softrdma   build/bin/all_reduce_perf under mpirun (ccl/ over RC QPs over softrdma's
#              RoCEv2 engine; each rank binds its own 127.0.0.x)
#   ompi_tcp   bench/mpi_allreduce.cpp: MPI_Allreduce, Open MPI, --mca pml ob1 --mca btl tcp,self
#              (TCP over lo)
#   ompi_shm   the same with --mca btl vader,self (shared memory)
#   gloo       bench/gloo_allreduce.cpp: gloo::allreduce RING over gloo::transport::tcp
#              (127.0.0.1), ranks started here, rendezvous through a FileStore directory
# All four print nccl-tests' columns (time µs per operation; algbw = S/t; busbw = algbw ×
# 2(n−1)/n, GB/s = 1e9 B/s; the bus bandwidth of nccl-tests' doc/PERFORMANCE.md, comparable
# across rank counts) and are timed the same way: warm-up at the range's largest and
# smallest size, then per size a barrier and ITERS back-to-back calls, time averaged over
# ranks; each result is checked (#wrong). The figures used are the out-of-place ones, busbw
# recomputed from size and time (the tools round it to 2 decimals).
# Sizes: 8 B … 512 KiB by ×4 with -n ITERS -w 5, then 1 MiB … 64 MiB by ×4 with
# -n max(2, ITERS/4) -w 2 (two runs per configuration, to keep the total short).
#
# Prints to stdout, per rank count, a markdown table of medians over the repeats: per size
# and implementation time (µs) and busbw (GB/s); busbw ratios softrdma/OMPI-TCP and
# softrdma/Gloo at sizes ≥ 1 MiB; below it the 8 B latency ratio softrdma/OMPI-TCP.
# Writes a PNG plot of busbw against size (log x), one line per implementation × ranks,
# with gnuplot. Progress and failures go to stderr; a configuration that fails or times out
# is reported there and left blank (—) in the table, never filled in.
#
# Environment (defaults in brackets):
#   REPEATS [3]           runs per configuration; medians are taken over them
#   RANKS ["2 4"]         rank counts
#   IMPLS ["softrdma ompi_tcp ompi_shm gloo"]
#   SMALL ["8 512K"]      first size range (-b -e, ×4), -n ITERS -w 5; "" skips it
#   LARGE ["1M 64M"]      second size range (×4), -n max(2, ITERS/4) -w 2; "" skips it
#   PLOT [docs/allreduce_busbw.png]   "" for no plot
#   RUN_TIMEOUT [180]     seconds per run (one implementation, rank count, range, repeat)
#   DEADLINE [600]        seconds for the whole benchmark; later runs are skipped (and said)
#   BUILD [build]         build tree with bin/all_reduce_perf, mpi_allreduce, gloo_allreduce
#   KEEP [""]             a directory to keep the raw logs in (else a temp dir, removed)
# Quick check of every path: REPEATS=1 SMALL="8 8" LARGE="1M 1M" bash bench/ccl_bench.sh 5
#
# Launch details, the same for every implementation: mpirun --oversubscribe --bind-to none
# (4 ranks on 2 cores; softrdma's per-device progress thread must not be pinned to its
# rank's core), --allow-run-as-root when root. Gloo ranks are plain processes.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ITERS=${1:-20}
[[ $ITERS =~ ^[1-9][0-9]*$ ]] || { echo "usage: bash bench/ccl_bench.sh [ITERS]" >&2; exit 2; }
LITERS=$((ITERS / 4 > 2 ? ITERS / 4 : 2))
REPEATS=${REPEATS:-3}
RANKS=${RANKS:-2 4}
IMPLS=${IMPLS:-softrdma ompi_tcp ompi_shm gloo}
SMALL=${SMALL-8 512K}
LARGE=${LARGE-1M 64M}
PLOT=${PLOT-docs/allreduce_busbw.png}
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
DEADLINE=${DEADLINE:-600}
B=${BUILD:-build}

note() { echo "ccl_bench: $*" >&2; }

if [[ -n ${KEEP:-} ]]; then
  OUT=$KEEP
  mkdir -p "$OUT" || exit 1
else
  OUT=$(mktemp -d /tmp/ccl-bench.XXXXXX)
  trap 'rm -rf "$OUT"' EXIT
fi
: >"$OUT/data.txt"

# ---- what can run --------------------------------------------------------------------------
MPIRUN=(mpirun --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && MPIRUN+=(--allow-run-as-root)
declare -A label=([softrdma]="softrdma" [ompi_tcp]="OMPI TCP" [ompi_shm]="OMPI shm" [gloo]="Gloo TCP")
impls=() left_out=()
for impl in $IMPLS; do
  [[ -n ${label[$impl]:-} ]] || { note "unknown implementation '$impl' (known: ${!label[*]})"; exit 2; }
  why=""
  case $impl in
    softrdma) [[ -x $B/bin/all_reduce_perf ]] || why="$B/bin/all_reduce_perf not built" ;;
    ompi_*) [[ -x $B/bin/mpi_allreduce ]] || why="$B/bin/mpi_allreduce not built (needs libopenmpi-dev)" ;;
    gloo) [[ -x $B/bin/gloo_allreduce ]] || why="$B/bin/gloo_allreduce not built (needs libgloo-dev)" ;;
  esac
  [[ $impl != gloo ]] && ! command -v mpirun >/dev/null && why="mpirun not found (openmpi-bin)"
  if [[ -n $why ]]; then
    note "NOTE: leaving out ${label[$impl]}: $why — no figures for it"
    left_out+=("${label[$impl]} ($why)")
  else
    impls+=("$impl")
  fi
done
((${#impls[@]})) || { note "nothing to run; build first: cmake --preset default && cmake --build --preset default"; exit 1; }

ranges=()
[[ -n $SMALL ]] && ranges+=("small")
[[ -n $LARGE ]] && ranges+=("large")

# ---- one run ---------------------------------------------------------------------------------
# run IMPL N RANGE REP: runs one configuration, appends "impl n size time_us busbw wrong"
# (out-of-place columns) to data.txt; returns non-zero when the run failed.
run() {
  local impl=$1 n=$2 range=$3 rep=$4 b e iters warm
  if [[ $range == small ]]; then read -r b e <<<"$SMALL"; iters=$ITERS; warm=5
  else read -r b e <<<"$LARGE"; iters=$LITERS; warm=2; fi
  local args=(-b "$b" -e "$e" -f 4 -n "$iters" -w "$warm" -c 1 -d float -o sum)
  local log=$OUT/raw/${impl}_${n}_${range}_${rep}.log rc=0
  mkdir -p "$OUT/raw"
  local t=(timeout -k 10 "$RUN_TIMEOUT")
  case $impl in
    softrdma)
      "${t[@]}" "${MPIRUN[@]}" -np "$n" "$B/bin/all_reduce_perf" "${args[@]}" >"$log" 2>&1
      rc=$?
      ;;
    ompi_tcp)
      "${t[@]}" "${MPIRUN[@]}" -np "$n" --mca pml ob1 --mca btl tcp,self \
        --mca btl_tcp_if_include lo "$B/bin/mpi_allreduce" "${args[@]}" >"$log" 2>&1
      rc=$?
      ;;
    ompi_shm)
      "${t[@]}" "${MPIRUN[@]}" -np "$n" --mca pml ob1 --mca btl vader,self \
        "$B/bin/mpi_allreduce" "${args[@]}" >"$log" 2>&1
      rc=$?
      ;;
    gloo)
      # Ranks 1..n-1 in the background, rank 0 (the one that prints) in the foreground; a
      # fresh FileStore directory per run (old keys would be taken for this run's).
      local store=$OUT/store_${n}_${range}_${rep} pids=() r p st
      rm -rf "$store" && mkdir -p "$store"
      : >"$log.err"
      for ((r = n - 1; r >= 1; r--)); do
        "${t[@]}" "$B/bin/gloo_allreduce" --rank $r --nranks "$n" --store "$store" "${args[@]}" \
          >/dev/null 2>>"$log.err" &
        pids+=($!)
      done
      "${t[@]}" "$B/bin/gloo_allreduce" --rank 0 --nranks "$n" --store "$store" "${args[@]}" \
        >"$log" 2>>"$log.err"
      rc=$?
      for p in "${pids[@]}"; do
        wait "$p"
        st=$?
        ((rc == 0 && st != 0)) && rc=$st
      done
      cat "$log.err" >>"$log"
      rm -rf "$store" "$log.err"
      ;;
  esac
  # Result lines: size count type redop root | time algbw busbw #wrong (out-of-place) | in-place.
  # busbw is recomputed from size and time: the tools print it with 2 decimals only.
  local lines
  lines=$(awk -v impl="$impl" -v n="$n" '$3 == "float" && $1 ~ /^[0-9]+$/ && NF >= 13 && $6 > 0 {
            printf "%s %d %s %s %.6g %s\n", impl, n, $1, $6, $1 / ($6 * 1e3) * 2 * (n - 1) / n, $9 }' "$log")
  [[ -n $lines ]] && echo "$lines" >>"$OUT/data.txt"
  if ((rc != 0)) || [[ -z $lines ]]; then
    local why="exit status $rc"
    ((rc == 124 || rc == 137)) && why="timed out after ${RUN_TIMEOUT}s"
    note "FAILED: ${label[$impl]}, $n ranks, sizes $b…$e, repeat $rep: $why; last lines of its output:"
    tail -n 8 "$log" | sed 's/^/    /' >&2
    return 1
  fi
}

# ---- all runs, interleaved -----------------------------------------------------------------
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
awk -v l="${load_start%% *}" -v c="$(nproc)" 'BEGIN { exit !(l > c / 2) }' &&
  note "WARNING: load average ${load_start%% *} on $(nproc) cores: the machine is busy, figures will be noisy (2-rank Open MPI busy-polls and suffers most)"
failed=0 skipped=0 total=0
for rep in $(seq "$REPEATS"); do
  for n in $RANKS; do
    for impl in "${impls[@]}"; do
      for range in "${ranges[@]}"; do
        total=$((total + 1))
        if ((SECONDS >= DEADLINE)); then skipped=$((skipped + 1)); continue; fi
        note "repeat $rep/$REPEATS: ${label[$impl]}, $n ranks, $range sizes (${SECONDS}s so far)"
        run "$impl" "$n" "$range" "$rep" || failed=$((failed + 1))
      done
    done
  done
done
((skipped)) && note "DEADLINE of ${DEADLINE}s reached: skipped $skipped of $total runs (their cells use fewer repeats or stay blank)"

# ---- medians and the table -----------------------------------------------------------------
# med IMPL N SIZE COLUMN(4 time, 5 busbw) → the median over the repeats, or empty.
med() {
  awk -v i="$1" -v n="$2" -v s="$3" -v c="$4" '$1 == i && $2 == n && $3 == s { print $c }' \
    "$OUT/data.txt" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2];
          else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
fmt_time() { [[ -z $1 ]] && { echo "—"; return; }
  awk -v t="$1" 'BEGIN { if (t >= 1000) printf "%.0f", t; else if (t >= 10) printf "%.1f", t; else printf "%.2f", t }'; }
fmt_bw() { [[ -z $1 ]] && { echo "—"; return; }; awk -v b="$1" 'BEGIN { printf "%.3f", b }'; }
ratio() { [[ -z $1 || -z $2 ]] && { echo "—"; return; }
  awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "—" }'; }
human() { awk -v s="$1" 'BEGIN { split("B KiB MiB GiB", u, " "); k = 1
  while (s >= 1024 && s % 1024 == 0 && k < 4) { s /= 1024; k++ } printf "%d %s", s, u[k] }'; }
has() { local x; for x in "${impls[@]}"; do [[ $x == "$1" ]] && return 0; done; return 1; }

sizes=$(awk '{ print $3 }' "$OUT/data.txt" | sort -n -u)
mpi_version=$(mpirun --version 2>/dev/null | head -n 1)
gloo_version=$(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null)
echo
echo "AllReduce, float, sum. Date: $(date -u +%Y-%m-%d), machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r); load average at start: $load_start, at end: $(cut -d' ' -f1-3 /proc/loadavg). ${mpi_version:-Open MPI ?}, Gloo (Debian libgloo-dev) ${gloo_version:-?}. Medians of $REPEATS repeats; -n $ITERS (≤ 512 KiB) / -n $LITERS (≥ 1 MiB); out-of-place; busbw = algbw·2(n−1)/n, GB/s = 1e9 B/s."
if ((${#left_out[@]})); then
  echo
  joined=$(printf '%s; ' "${left_out[@]}")
  echo "Not measured: ${joined%; }."
fi
for n in $RANKS; do
  echo
  echo "**$n ranks**"
  echo
  head="| size |" sep="|---:|"
  for impl in "${impls[@]}"; do
    head+=" ${label[$impl]} µs | ${label[$impl]} GB/s |"
    sep+="---:|---:|"
  done
  has softrdma && has ompi_tcp && { head+=" softrdma / OMPI TCP busbw |"; sep+="---:|"; }
  has softrdma && has gloo && { head+=" softrdma / Gloo busbw |"; sep+="---:|"; }
  echo "$head"
  echo "$sep"
  for s in $sizes; do
    row="| $(human "$s") |"
    declare -A bw=()
    for impl in "${impls[@]}"; do
      tm=$(med "$impl" "$n" "$s" 4)
      bw[$impl]=$(med "$impl" "$n" "$s" 5)
      row+=" $(fmt_time "$tm") | $(fmt_bw "${bw[$impl]}") |"
    done
    big=0
    ((s >= 1048576)) && big=1
    if has softrdma && has ompi_tcp; then
      ((big)) && row+=" $(ratio "${bw[softrdma]}" "${bw[ompi_tcp]}") |" || row+=" — |"
    fi
    if has softrdma && has gloo; then
      ((big)) && row+=" $(ratio "${bw[softrdma]}" "${bw[gloo]}") |" || row+=" — |"
    fi
    unset bw
    echo "$row"
  done
  a="" b=""
  has softrdma && has ompi_tcp && a=$(med softrdma "$n" 8 4) b=$(med ompi_tcp "$n" 8 4)
  if [[ -n $a && -n $b ]]; then
    echo
    echo "8 B latency, softrdma / OMPI TCP: $(ratio "$a" "$b") ($(fmt_time "$a") µs / $(fmt_time "$b") µs; > 1: softrdma slower)."
  fi
done
echo
wrong=$(awk '$6 != 0' "$OUT/data.txt")
if [[ ! -s $OUT/data.txt ]]; then
  echo "No results: every run failed (see stderr)."
elif [[ -n $wrong ]]; then
  echo "WRONG RESULTS (impl ranks size time busbw #wrong):"
  echo "$wrong"
else
  echo "All results checked: #wrong = 0 in every run."
fi
((failed)) && echo "$failed run(s) failed or timed out (see stderr); their cells are medians of fewer repeats or —."

# ---- plot ----------------------------------------------------------------------------------
if [[ -n $PLOT ]]; then
  if ! command -v gnuplot >/dev/null; then
    note "NOTE: gnuplot not found (apt-get install gnuplot-nox): no plot written"
  else
    dat=$OUT/busbw.dat gp=$OUT/plot.gp series=() k=0 c=0
    : >"$dat"
    for impl in "${impls[@]}"; do
      c=$((c + 1)) d=0
      for n in $RANKS; do
        d=$((d + 1))
        pts=""
        for s in $sizes; do
          v=$(med "$impl" "$n" "$s" 5)
          [[ -n $v ]] && pts+="$s $v"$'\n'
        done
        [[ -z $pts ]] && continue
        printf '%s\n\n' "$pts" >>"$dat"
        series+=("'$dat' index $k using 1:2 with linespoints lc $c dt $d pt $((c + 5)) lw 2 title '${label[$impl]}, $n ranks'")
        k=$((k + 1))
      done
    done
    if ((k == 0)); then
      note "NOTE: no data to plot"
    else
      mkdir -p "$(dirname "$PLOT")"
      {
        echo "set terminal pngcairo size 1000,600 font 'sans,10'"
        echo "set output '$PLOT'"
        echo "set title 'AllReduce float sum, busbw (medians of $REPEATS), $(nproc) cores, $(date -u +%Y-%m-%d)'"
        echo "set logscale x 2"
        tics=""
        for s in $sizes; do
          tics+="${tics:+, }'$(human "$s" | sed 's/ B$//; s/ KiB$/K/; s/ MiB$/M/; s/ GiB$/G/')' $s"
        done
        echo "set xtics ($tics)"
        echo "set xlabel 'message size (B)'"
        echo "set ylabel 'busbw (GB/s = 1e9 B/s)'"
        echo "set yrange [0:*]"
        echo "set grid"
        echo "set key top left"
        (IFS=,; echo "plot ${series[*]}")
      } >"$gp"
      if timeout 60 gnuplot "$gp" 2>"$OUT/gnuplot.err"; then
        note "plot written to $PLOT"
      else
        note "gnuplot failed: $(cat "$OUT/gnuplot.err")"
      fi
    fi
  fi
fi
[[ -n ${KEEP:-} ]] && note "raw logs in $OUT/raw, medians' inputs in $OUT/data.txt"
note "done in ${SECONDS}s"
exit 0
