#!/usr/bin/env bash
# Collectives benchmark (issue 8): softrdma's AllReduce, AllGather and ReduceScatter against
# Open MPI (and AllReduce against Gloo), in one run on this machine. A benchmark, not a test:
# the figures depend on the machine and its load.
#
#   bash bench/ccl_bench.sh [ITERS]       (default 20; needs a built build/ tree)
#
# Measures each collective of COLLS (float; sum for AllReduce and ReduceScatter) with 2 and 4
# ranks (one process each, all on this host), REPEATS times each, alternating implementations
# so that drifting load hits all alike:
#   softrdma_shm  build/bin/<coll>_perf under mpirun (ccl/ over RC QPs over softrdma's RoCEv2
#                 engine; each rank binds its own 127.0.0.x), SOFTRDMA_TRANSPORT=auto: the
#                 same-host path (shared memory between softrdma devices on this host)
#   softrdma_udp  the same with SOFTRDMA_TRANSPORT=udp: every packet over UDP port 4791 on lo
#   ompi_tcp      bench/mpi_coll.cpp (mpi_allreduce, mpi_allgather, mpi_reduce_scatter):
#                 MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block of Open MPI,
#                 --mca pml ob1 --mca btl tcp,self (TCP over lo)
#   ompi_shm      the same with --mca btl vader,self (shared memory)
#   gloo          AllReduce only: bench/gloo_allreduce.cpp, gloo::allreduce RING over
#                 gloo::transport::tcp (127.0.0.1), ranks started here, rendezvous through a
#                 FileStore directory
# All print nccl-tests' columns and are timed the same way (bench/coll_sweep.h): time µs per
# operation; sizes as nccl-tests (AllGather and ReduceScatter: the size is the larger buffer,
# count·n floats); algbw = S/t; busbw = algbw × 2(n−1)/n for AllReduce, × (n−1)/n for
# AllGather and ReduceScatter (nccl-tests' doc/PERFORMANCE.md; GB/s = 1e9 B/s, comparable
# across rank counts); warm-up at the range's largest and smallest size, then per size a
# barrier and ITERS back-to-back calls, time averaged over ranks; each result is checked
# (#wrong). The figures used are the out-of-place ones, busbw recomputed from size and time
# (the tools round it to 2 decimals).
# Sizes: 8 B … 512 KiB by ×4 with -n ITERS -w 5, then 1 MiB … 64 MiB by ×4 with
# -n max(2, ITERS/4) -w 2 (two runs per configuration, to keep the total short).
#
# Prints to stdout markdown ready for docs/performance.md: per collective a "###" heading and,
# per rank count, a table of medians over the repeats (per size and implementation time µs
# and busbw GB/s; busbw ratios at sizes ≥ 1 MiB of softrdma UDP / OMPI TCP, softrdma UDP /
# Gloo and softrdma shm / OMPI shm), then one line per issue-8 target saying met or missed
# with the worst value:
#   busbw at every size ≥ 1 MiB: softrdma UDP ≥ 1.5× OMPI TCP, ≥ 3× Gloo (AllReduce);
#     softrdma shm ≥ 1× OMPI shm
#   time at the table's smallest non-empty size: softrdma UDP ≤ OMPI TCP; softrdma shm ≤ 2×
#     OMPI shm (AllGather and ReduceScatter with 4 ranks: 8 B is 0 floats per rank, nccl-tests
#     prints it as 0 B; the check takes the next size, 32 B)
#   4 ranks (4-rank table, when 2 ranks ran too): time ≤ 2 × the 2-rank time at every size
#     both measured, for each softrdma path
# Writes one PNG per collective (busbw against size, log x, one line per implementation ×
# ranks) with gnuplot into PLOT: allreduce_busbw.png, allgather_busbw.png,
# reducescatter_busbw.png. Progress and failures go to stderr; a configuration that fails or
# times out is reported there and left blank (—) in the table, never filled in.
#
# Environment (defaults in brackets):
#   COLLS ["all_reduce all_gather reduce_scatter"]
#   REPEATS [3]           runs per configuration; medians are taken over them
#   RANKS ["2 4"]         rank counts
#   IMPLS ["softrdma_shm softrdma_udp ompi_tcp ompi_shm gloo"]   (gloo: all_reduce only)
#   SMALL ["8 512K"]      first size range (-b -e, ×4), -n ITERS -w 5; "" skips it
#   LARGE ["1M 64M"]      second size range (×4), -n max(2, ITERS/4) -w 2; "" skips it
#   PLOT [docs]           directory for the PNGs; "" for no plots
#   RUN_TIMEOUT [180]     seconds per run (one implementation, rank count, range, repeat)
#   DEADLINE [1200]       seconds for the whole benchmark; later runs are skipped (and said)
#   BUILD [build]         build tree with bin/<coll>_perf, mpi_*, gloo_allreduce
#   KEEP [""]             a directory to keep the raw logs in (else a temp dir, removed)
# Quick check of every path (plots to /tmp):
#   REPEATS=1 SMALL="8 8" LARGE="1M 1M" RANKS=2 PLOT=/tmp bash bench/ccl_bench.sh 5
#
# Duration: the defaults make 52 runs per repeat (AllReduce 5 implementations, AllGather and
# ReduceScatter 4, × 2 rank counts × 2 ranges). Measured on 2 cores with load ~4 (2026-11-23):
# a 4-rank 1 MiB … 64 MiB run takes 4–6 s for every implementation (softrdma UDP the
# slowest), an 8 B … 512 KiB run about 1 s, so a repeat takes under 3 minutes and
# ITERS 20 × REPEATS 3 ~10 minutes. DEADLINE (20 minutes) cuts a slower machine short,
# skipping whole runs; the repeats loop is outermost, so every configuration gets its first
# repeat before any gets a second.
#
# Launch details, the same for every implementation: mpirun --oversubscribe --bind-to none
# (4 ranks on 2 cores; softrdma's per-device progress thread must not be pinned to its
# rank's core), --allow-run-as-root when root. Gloo ranks are plain processes.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ITERS=${1:-20}
[[ $ITERS =~ ^[1-9][0-9]*$ ]] || { echo "usage: bash bench/ccl_bench.sh [ITERS]" >&2; exit 2; }
LITERS=$((ITERS / 4 > 2 ? ITERS / 4 : 2))
COLLS=${COLLS:-all_reduce all_gather reduce_scatter}
REPEATS=${REPEATS:-3}
RANKS=${RANKS:-2 4}
IMPLS=${IMPLS:-softrdma_shm softrdma_udp ompi_tcp ompi_shm gloo}
SMALL=${SMALL-8 512K}
LARGE=${LARGE-1M 64M}
PLOT=${PLOT-docs}
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
DEADLINE=${DEADLINE:-1200}
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
declare -A label=([softrdma_shm]="softrdma shm" [softrdma_udp]="softrdma UDP"
  [ompi_tcp]="OMPI TCP" [ompi_shm]="OMPI shm" [gloo]="Gloo TCP")
# Per collective: nccl-tests' name, the MPI reference's binary, the PNG's name, the busbw
# factor's numerator (2(n−1)/n or (n−1)/n) and the redop shown in the heading.
declare -A title=([all_reduce]="AllReduce" [all_gather]="AllGather" [reduce_scatter]="ReduceScatter")
declare -A mpi_bin=([all_reduce]=mpi_allreduce [all_gather]=mpi_allgather
  [reduce_scatter]=mpi_reduce_scatter)
declare -A png=([all_reduce]=allreduce_busbw.png [all_gather]=allgather_busbw.png
  [reduce_scatter]=reducescatter_busbw.png)
declare -A bus=([all_reduce]=2 [all_gather]=1 [reduce_scatter]=1)
declare -A what=([all_reduce]="float, sum" [all_gather]="float" [reduce_scatter]="float, sum")

for coll in $COLLS; do
  [[ -n ${title[$coll]:-} ]] || { note "unknown collective '$coll' (known: ${!title[*]})"; exit 2; }
done
for impl in $IMPLS; do
  [[ -n ${label[$impl]:-} ]] || { note "unknown implementation '$impl' (known: ${!label[*]})"; exit 2; }
done

# why_not IMPL COLL → why IMPL cannot run COLL here (empty: it can).
why_not() {
  local impl=$1 coll=$2
  case $impl in
    softrdma_*) [[ -x $B/bin/${coll}_perf ]] || { echo "$B/bin/${coll}_perf not built"; return; } ;;
    ompi_*) [[ -x $B/bin/${mpi_bin[$coll]} ]] ||
      { echo "$B/bin/${mpi_bin[$coll]} not built (needs libopenmpi-dev)"; return; } ;;
    gloo) [[ -x $B/bin/gloo_allreduce ]] ||
      { echo "$B/bin/gloo_allreduce not built (needs libgloo-dev)"; return; } ;;
  esac
  [[ $impl != gloo ]] && ! command -v mpirun >/dev/null && echo "mpirun not found (openmpi-bin)"
}

# impls_of[COLL]: the implementations that run it, in IMPLS order; left_out: what could not.
declare -A impls_of=()
left_out=()
for coll in $COLLS; do
  list=""
  for impl in $IMPLS; do
    [[ $impl == gloo && $coll != all_reduce ]] && continue
    why=$(why_not "$impl" "$coll")
    if [[ -n $why ]]; then
      note "NOTE: leaving out ${label[$impl]} ${title[$coll]}: $why — no figures for it"
      left_out+=("${label[$impl]} ${title[$coll]} ($why)")
    else
      list+="${list:+ }$impl"
    fi
  done
  impls_of[$coll]=$list
done
runnable=0
for coll in $COLLS; do [[ -n ${impls_of[$coll]} ]] && runnable=1; done
((runnable)) || { note "nothing to run; build first: cmake --preset default && cmake --build --preset default"; exit 1; }

ranges=()
[[ -n $SMALL ]] && ranges+=("small")
[[ -n $LARGE ]] && ranges+=("large")

# ---- one run ---------------------------------------------------------------------------------
# run COLL IMPL N RANGE REP: runs one configuration, appends "coll impl n size time_us busbw
# wrong" (out-of-place columns) to data.txt; returns non-zero when the run failed.
run() {
  local coll=$1 impl=$2 n=$3 range=$4 rep=$5 b e iters warm
  if [[ $range == small ]]; then read -r b e <<<"$SMALL"; iters=$ITERS; warm=5
  else read -r b e <<<"$LARGE"; iters=$LITERS; warm=2; fi
  local args=(-b "$b" -e "$e" -f 4 -n "$iters" -w "$warm" -c 1 -d float -o sum)
  local log=$OUT/raw/${coll}_${impl}_${n}_${range}_${rep}.log rc=0
  mkdir -p "$OUT/raw"
  local t=(timeout -k 10 "$RUN_TIMEOUT")
  case $impl in
    softrdma_shm | softrdma_udp)
      # -x: the ranks get this path whatever the caller's environment says.
      local path=auto
      [[ $impl == softrdma_udp ]] && path=udp
      "${t[@]}" "${MPIRUN[@]}" -np "$n" -x SOFTRDMA_TRANSPORT=$path "$B/bin/${coll}_perf" \
        "${args[@]}" >"$log" 2>&1
      rc=$?
      ;;
    ompi_tcp)
      "${t[@]}" "${MPIRUN[@]}" -np "$n" --mca pml ob1 --mca btl tcp,self \
        --mca btl_tcp_if_include lo "$B/bin/${mpi_bin[$coll]}" "${args[@]}" >"$log" 2>&1
      rc=$?
      ;;
    ompi_shm)
      "${t[@]}" "${MPIRUN[@]}" -np "$n" --mca pml ob1 --mca btl vader,self \
        "$B/bin/${mpi_bin[$coll]}" "${args[@]}" >"$log" 2>&1
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
  lines=$(awk -v c="$coll" -v impl="$impl" -v n="$n" -v f="${bus[$coll]}" \
    '$3 == "float" && $1 ~ /^[0-9]+$/ && NF >= 13 && $6 > 0 {
       printf "%s %s %d %s %s %.6g %s\n", c, impl, n, $1, $6, $1 / ($6 * 1e3) * f * (n - 1) / n, $9 }' "$log")
  [[ -n $lines ]] && echo "$lines" >>"$OUT/data.txt"
  if ((rc != 0)) || [[ -z $lines ]]; then
    local why="exit status $rc"
    ((rc == 124 || rc == 137)) && why="timed out after ${RUN_TIMEOUT}s"
    note "FAILED: ${label[$impl]} ${title[$coll]}, $n ranks, sizes $b…$e, repeat $rep: $why; last lines of its output:"
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
  for coll in $COLLS; do
    for n in $RANKS; do
      for impl in ${impls_of[$coll]}; do
        for range in "${ranges[@]}"; do
          total=$((total + 1))
          if ((SECONDS >= DEADLINE)); then skipped=$((skipped + 1)); continue; fi
          note "repeat $rep/$REPEATS: ${title[$coll]}, ${label[$impl]}, $n ranks, $range sizes (${SECONDS}s so far)"
          start=$SECONDS
          run "$coll" "$impl" "$n" "$range" "$rep" || failed=$((failed + 1))
          note "  took $((SECONDS - start))s"
        done
      done
    done
  done
done
((skipped)) && note "DEADLINE of ${DEADLINE}s reached: skipped $skipped of $total runs (their cells use fewer repeats or stay blank)"

# ---- medians, tables and target checks ------------------------------------------------------
# med COLL IMPL N SIZE COLUMN(5 time, 6 busbw) → the median over the repeats, or empty.
med() {
  awk -v k="$1" -v i="$2" -v n="$3" -v s="$4" -v c="$5" \
    '$1 == k && $2 == i && $3 == n && $4 == s { print $c }' "$OUT/data.txt" | sort -g |
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
has() { [[ " ${impls_of[$1]} " == *" $2 "* ]]; }
# has_pair COLL A REF: both ran COLL.
has_pair() { has "$1" "$2" && has "$1" "$3"; }
# sizes_of COLL N → the sizes measured (any implementation), ascending.
sizes_of() { awk -v k="$1" -v n="$2" '$1 == k && $3 == n { print $4 }' "$OUT/data.txt" | sort -n -u; }

# The ratio columns: softrdma path, reference, column heading.
RATIOS=("softrdma_udp ompi_tcp" "softrdma_udp gloo" "softrdma_shm ompi_shm")

# target_busbw COLL N A REF MIN TEXT: one line on "busbw of A ≥ MIN × REF's at every size
# ≥ 1 MiB" (the worst ratio decides).
target_busbw() {
  local coll=$1 n=$2 a=$3 ref=$4 want=$5 text=$6 s x y r worst="" cnt=0
  has_pair "$coll" "$a" "$ref" || return
  for s in $(sizes_of "$coll" "$n"); do
    ((s >= 1048576)) || continue
    x=$(med "$coll" "$a" "$n" "$s" 6) y=$(med "$coll" "$ref" "$n" "$s" 6)
    [[ -n $x && -n $y ]] || continue
    r=$(ratio "$x" "$y")
    [[ $r == — ]] && continue
    cnt=$((cnt + 1))
    if [[ -z $worst ]] || awk -v r="$r" -v w="$worst" 'BEGIN { exit !(r < w) }'; then worst=$r; fi
  done
  if ((cnt == 0)); then
    echo "- $text: not measured (no size ≥ 1 MiB with both figures)"
  elif awk -v w="$worst" -v m="$want" 'BEGIN { exit !(w >= m) }'; then
    echo "- $text: **met** (worst ${worst}× over $cnt sizes)"
  else
    echo "- $text: **missed** (worst ${worst}× over $cnt sizes)"
  fi
}

# target_small COLL N A REF MAX TEXT: "time of A ≤ MAX × REF's at the smallest size".
target_small() {
  local coll=$1 n=$2 a=$3 ref=$4 want=$5 text=$6 s x y r
  has_pair "$coll" "$a" "$ref" || return
  s=$(sizes_of "$coll" "$n" | awk '$1 > 0' | head -n 1)  # AllGather/ReduceScatter: S/4 < n gives 0 B
  [[ -n $s ]] && x=$(med "$coll" "$a" "$n" "$s" 5) y=$(med "$coll" "$ref" "$n" "$s" 5)
  if [[ -z $s || -z $x || -z $y ]]; then
    echo "- $text: not measured"
    return
  fi
  r=$(ratio "$x" "$y")
  if awk -v r="$r" -v m="$want" 'BEGIN { exit !(r <= m) }'; then
    echo "- $text ($(human "$s")): **met** ($(fmt_time "$x") µs / $(fmt_time "$y") µs = ${r}×)"
  else
    echo "- $text ($(human "$s")): **missed** ($(fmt_time "$x") µs / $(fmt_time "$y") µs = ${r}×)"
  fi
}

# target_scale COLL A: "4-rank time ≤ 2 × 2-rank time at every size both measured".
target_scale() {
  local coll=$1 a=$2 s x y r worst="" at="" cnt=0
  has "$coll" "$a" || return
  for s in $(sizes_of "$coll" 4); do
    x=$(med "$coll" "$a" 4 "$s" 5) y=$(med "$coll" "$a" 2 "$s" 5)
    [[ -n $x && -n $y ]] || continue
    r=$(ratio "$x" "$y")
    [[ $r == — ]] && continue
    cnt=$((cnt + 1))
    if [[ -z $worst ]] || awk -v r="$r" -v w="$worst" 'BEGIN { exit !(r > w) }'; then
      worst=$r at=$s
    fi
  done
  local text="${label[$a]}, 4 ranks ≤ 2 × the 2-rank time at every size"
  if ((cnt == 0)); then
    echo "- $text: not measured (no size with both figures)"
  elif awk -v w="$worst" 'BEGIN { exit !(w <= 2) }'; then
    echo "- $text: **met** (worst ${worst}× at $(human "$at"), over $cnt sizes)"
  else
    echo "- $text: **missed** (worst ${worst}× at $(human "$at"), over $cnt sizes)"
  fi
}

# table COLL N: the markdown table and the target lines of one collective and rank count.
table() {
  local coll=$1 n=$2 impl s tm pair a ref head="| size |" sep="|---:|" row big
  local -a impls
  read -ra impls <<<"${impls_of[$coll]}"
  echo
  echo "**${title[$coll]}, $n ranks**"
  echo
  for impl in "${impls[@]}"; do
    head+=" ${label[$impl]} µs | ${label[$impl]} GB/s |"
    sep+="---:|---:|"
  done
  for pair in "${RATIOS[@]}"; do
    read -r a ref <<<"$pair"
    has_pair "$coll" "$a" "$ref" || continue
    head+=" ${label[$a]} / ${label[$ref]} busbw |"
    sep+="---:|"
  done
  echo "$head"
  echo "$sep"
  for s in $(sizes_of "$coll" "$n"); do
    row="| $(human "$s") |"
    local -A bw=()
    for impl in "${impls[@]}"; do
      tm=$(med "$coll" "$impl" "$n" "$s" 5)
      bw[$impl]=$(med "$coll" "$impl" "$n" "$s" 6)
      row+=" $(fmt_time "$tm") | $(fmt_bw "${bw[$impl]}") |"
    done
    big=0
    ((s >= 1048576)) && big=1
    for pair in "${RATIOS[@]}"; do
      read -r a ref <<<"$pair"
      has_pair "$coll" "$a" "$ref" || continue
      ((big)) && row+=" $(ratio "${bw[$a]}" "${bw[$ref]}") |" || row+=" — |"
    done
    unset bw
    echo "$row"
  done
  local checks
  checks=$(
    target_busbw "$coll" "$n" softrdma_udp ompi_tcp 1.5 "busbw ≥ 1 MiB, softrdma UDP ≥ 1.5× OMPI TCP"
    target_busbw "$coll" "$n" softrdma_udp gloo 3 "busbw ≥ 1 MiB, softrdma UDP ≥ 3× Gloo TCP"
    target_busbw "$coll" "$n" softrdma_shm ompi_shm 1 "busbw ≥ 1 MiB, softrdma shm ≥ 1× OMPI shm"
    target_small "$coll" "$n" softrdma_udp ompi_tcp 1 "smallest non-empty size, softrdma UDP time ≤ OMPI TCP's"
    target_small "$coll" "$n" softrdma_shm ompi_shm 2 "smallest non-empty size, softrdma shm time ≤ 2× OMPI shm's"
    if ((n == 4)) && [[ " $RANKS " == *" 2 "* ]]; then
      target_scale "$coll" softrdma_shm
      target_scale "$coll" softrdma_udp
    fi
  )
  if [[ -n $checks ]]; then
    echo
    echo "Issue-8 targets, ${title[$coll]}, $n ranks:"
    echo
    echo "$checks"
  fi
}

mpi_version=$(mpirun --version 2>/dev/null | head -n 1)
gloo_version=$(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null)
echo
echo "Date: $(date -u +%Y-%m-%d), machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r); load average at start: $load_start, at end: $(cut -d' ' -f1-3 /proc/loadavg). ${mpi_version:-Open MPI ?}, Gloo (Debian libgloo-dev) ${gloo_version:-?}. Medians of $REPEATS repeats; -n $ITERS (≤ 512 KiB) / -n $LITERS (≥ 1 MiB); out-of-place; busbw = algbw·2(n−1)/n (AllReduce), algbw·(n−1)/n (AllGather, ReduceScatter), GB/s = 1e9 B/s; sizes as nccl-tests (AllGather, ReduceScatter: the larger buffer). softrdma shm: SOFTRDMA_TRANSPORT=auto (same-host path); softrdma UDP: SOFTRDMA_TRANSPORT=udp."
if ((${#left_out[@]})); then
  echo
  joined=$(printf '%s; ' "${left_out[@]}")
  echo "Not measured: ${joined%; }."
fi
for coll in $COLLS; do
  [[ -n ${impls_of[$coll]} ]] || continue
  echo
  echo "### ${title[$coll]} (${what[$coll]})"
  for n in $RANKS; do table "$coll" "$n"; done
  if [[ -n $PLOT ]]; then
    echo
    link=$PLOT/${png[$coll]}
    [[ $PLOT == docs ]] && link=${png[$coll]}  # docs/performance.md's own directory
    echo "![${title[$coll]} busbw vs size]($link)"
  fi
done
echo
wrong=$(awk '$7 != 0' "$OUT/data.txt")
if [[ ! -s $OUT/data.txt ]]; then
  echo "No results: every run failed (see stderr)."
elif [[ -n $wrong ]]; then
  echo "WRONG RESULTS (collective impl ranks size time busbw #wrong):"
  echo "$wrong"
else
  echo "All results checked: #wrong = 0 in every run."
fi
((failed)) && echo "$failed run(s) failed or timed out (see stderr); their cells are medians of fewer repeats or —."

# ---- plots ---------------------------------------------------------------------------------
# plot COLL: busbw against size, one line per implementation × ranks, into $PLOT/png[COLL].
plot() {
  local coll=$1 dat=$OUT/busbw_$1.dat gp=$OUT/plot_$1.gp out=$PLOT/${png[$1]} series=() k=0 c=0
  local impl n d pts s v tics="" all_sizes
  all_sizes=$(awk -v k="$coll" '$1 == k { print $4 }' "$OUT/data.txt" | sort -n -u)
  : >"$dat"
  for impl in ${impls_of[$coll]}; do
    c=$((c + 1)) d=0
    for n in $RANKS; do
      d=$((d + 1))
      pts=""
      for s in $(sizes_of "$coll" "$n"); do
        ((s > 0)) || continue  # log x
        v=$(med "$coll" "$impl" "$n" "$s" 6)
        [[ -n $v ]] && pts+="$s $v"$'\n'
      done
      [[ -z $pts ]] && continue
      printf '%s\n\n' "$pts" >>"$dat"
      series+=("'$dat' index $k using 1:2 with linespoints lc $c dt $d pt $((c + 5)) lw 2 title '${label[$impl]}, $n ranks'")
      k=$((k + 1))
    done
  done
  if ((k == 0)); then
    note "NOTE: no ${title[$coll]} data to plot"
    return
  fi
  mkdir -p "$PLOT"
  for s in $all_sizes; do
    ((s > 0)) || continue
    tics+="${tics:+, }'$(human "$s" | sed 's/ B$//; s/ KiB$/K/; s/ MiB$/M/; s/ GiB$/G/')' $s"
  done
  {
    echo "set terminal pngcairo size 1000,600 font 'sans,10'"
    echo "set output '$out'"
    echo "set title '${title[$coll]} ${what[$coll]}, busbw (medians of $REPEATS), $(nproc) cores, $(date -u +%Y-%m-%d)'"
    echo "set logscale x 2"
    echo "set xtics ($tics)"
    echo "set xlabel 'message size (B)'"
    echo "set ylabel 'busbw (GB/s = 1e9 B/s)'"
    echo "set yrange [0:*]"
    echo "set grid"
    echo "set key top left"
    (IFS=,; echo "plot ${series[*]}")
  } >"$gp"
  if timeout 60 gnuplot "$gp" 2>"$OUT/gnuplot.err"; then
    note "plot written to $out"
  else
    note "gnuplot failed: $(cat "$OUT/gnuplot.err")"
  fi
}
if [[ -n $PLOT ]]; then
  if ! command -v gnuplot >/dev/null; then
    note "NOTE: gnuplot not found (apt-get install gnuplot-nox): no plots written"
  else
    for coll in $COLLS; do [[ -n ${impls_of[$coll]} ]] && plot "$coll"; done
  fi
fi
[[ -n ${KEEP:-} ]] && note "raw logs in $OUT/raw, medians' inputs in $OUT/data.txt"
note "done in ${SECONDS}s"
exit 0
