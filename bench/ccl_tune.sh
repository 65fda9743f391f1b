#!/usr/bin/env bash
# Fits the AllReduce algorithm thresholds of ccl/ (Config::small_bytes, Config::medium_bytes,
# SOFTRDMA_CCL_SMALL_BYTES / SOFTRDMA_CCL_MEDIUM_BYTES) on this machine: a benchmark, not a
# test. The method is that of Open MPI's coll/tuned decision rules and NCCL's tuner tables:
# time every algorithm at every size, take the fastest per size, and put each threshold where
# the winner changes.
#
#   bash bench/ccl_tune.sh [ITERS]        (default 50; needs a built build/ tree)
#
# For each rank count (RANKS, default "2 4") and each algorithm (SOFTRDMA_CCL_ALGO = rd,
# rabenseifner, ring), runs build/bin/all_reduce_perf -b 8 -e MAX -f 4 (float, sum, out-of-place
# figures) REPEATS times, alternating algorithms so that drifting load hits all alike, and
# prints a markdown table of the median time per size (µs) and algorithm, the winner per
# size, and the thresholds the winners suggest:
#   small_bytes  = the largest size at which recursive doubling is still the fastest before
#                  the first size where another algorithm wins;
#   medium_bytes = the largest size at which Rabenseifner still beats the ring, before the
#                  ring wins for good.
# A winner must beat the runner-up by MARGIN (default 10 %) to count; closer sizes are
# reported as "tie" and keep the current default there. The suggestion is per rank count;
# ccl/ uses one pair for all, so docs/collectives.md records what was chosen and why.
#
# Environment (defaults in brackets):
#   REPEATS [3]     runs per algorithm and rank count; medians over them
#   RANKS ["2 4"]   rank counts
#   MAX [4M]        largest size (-e)
#   MARGIN [0.10]   relative lead a winner needs
#   PATH_KIND [shm] "udp" runs the ranks with SOFTRDMA_TRANSPORT=udp
#   RUN_TIMEOUT [120] seconds per run
#   BUILD [build]
# Launch: mpirun --oversubscribe --bind-to none (ranks may outnumber cores), as bench/ccl_bench.sh.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ITERS=${1:-50}
[[ $ITERS =~ ^[1-9][0-9]*$ ]] || { echo "usage: bash bench/ccl_tune.sh [ITERS]" >&2; exit 2; }
REPEATS=${REPEATS:-3}
RANKS=${RANKS:-2 4}
MAX=${MAX:-4M}
MARGIN=${MARGIN:-0.10}
PATH_KIND=${PATH_KIND:-shm}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
B=${BUILD:-build}
ALGOS=(rd rabenseifner ring)

note() { echo "ccl_tune: $*" >&2; }
[[ -x $B/bin/all_reduce_perf ]] || { note "$B/bin/all_reduce_perf not built"; exit 1; }
command -v mpirun >/dev/null || { note "mpirun not found (openmpi-bin)"; exit 1; }
[[ $PATH_KIND == shm || $PATH_KIND == udp ]] || { note "PATH_KIND must be shm or udp"; exit 2; }

OUT=$(mktemp -d /tmp/ccl-tune.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
: >"$OUT/data.txt"
MPIRUN=(mpirun --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && MPIRUN+=(--allow-run-as-root)
env_args=(-x SOFTRDMA_CCL_ALGO)
[[ $PATH_KIND == udp ]] && { export SOFTRDMA_TRANSPORT=udp; env_args+=(-x SOFTRDMA_TRANSPORT); }

failed=0
for rep in $(seq "$REPEATS"); do
  for n in $RANKS; do
    for algo in "${ALGOS[@]}"; do
      note "repeat $rep/$REPEATS: $n ranks, $algo (${SECONDS}s so far)"
      log=$OUT/${n}_${algo}_${rep}.log
      SOFTRDMA_CCL_ALGO=$algo timeout -k 10 "$RUN_TIMEOUT" "${MPIRUN[@]}" "${env_args[@]}" \
        -np "$n" "$B/bin/all_reduce_perf" -b 8 -e "$MAX" -f 4 -n "$ITERS" -w 5 -c 1 \
        -d float -o sum >"$log" 2>&1
      rc=$?
      lines=$(awk -v n="$n" -v a="$algo" '$3 == "float" && $1 ~ /^[0-9]+$/ && NF >= 13 && $6 > 0 {
                if ($9 != 0) bad = 1; printf "%d %s %s %s\n", n, a, $1, $6 } END { exit bad }' "$log")
      wrong=$?
      if ((rc != 0)) || [[ -z $lines ]] || ((wrong)); then
        note "FAILED: $n ranks, $algo, repeat $rep (exit $rc, wrong results: $wrong); last lines:"
        tail -n 6 "$log" | sed 's/^/    /' >&2
        failed=$((failed + 1))
        continue
      fi
      echo "$lines" >>"$OUT/data.txt"
    done
  done
done

med() {  # med N ALGO SIZE → median time (µs) over repeats, or empty
  awk -v n="$1" -v a="$2" -v s="$3" '$1 == n && $2 == a && $3 == s { print $4 }' "$OUT/data.txt" |
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2];
                    else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
human() { awk -v s="$1" 'BEGIN { split("B KiB MiB GiB", u, " "); k = 1
  while (s >= 1024 && s % 1024 == 0 && k < 4) { s /= 1024; k++ } printf "%d %s", s, u[k] }'; }

echo "AllReduce algorithm times on this machine ($PATH_KIND path), $(date -u +%F), $(nproc) cores," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg); medians of $REPEATS runs, -n $ITERS, µs."
for n in $RANKS; do
  echo
  echo "**$n ranks**"
  echo
  echo "| size | rd µs | rabenseifner µs | ring µs | fastest |"
  echo "|---:|---:|---:|---:|---|"
  small="" medium="" seen_other=0 ring_won_from=""
  for s in $(awk -v n="$n" '$1 == n { print $3 }' "$OUT/data.txt" | sort -un); do
    t_rd=$(med "$n" rd "$s") t_rb=$(med "$n" rabenseifner "$s") t_ring=$(med "$n" ring "$s")
    best=$(printf '%s rd\n%s rabenseifner\n%s ring\n' "${t_rd:-inf}" "${t_rb:-inf}" "${t_ring:-inf}" |
      sort -g | awk -v m="$MARGIN" 'NR == 1 { b = $2; t = $1 } NR == 2 {
        if ($1 == "inf" || t * (1 + m) <= $1) print b; else print "tie" }')
    printf '| %s | %s | %s | %s | %s |\n' "$(human "$s")" "${t_rd:-—}" "${t_rb:-—}" "${t_ring:-—}" "$best"
    case $best in
      rd) ((seen_other)) || small=$s ;;
      rabenseifner) seen_other=1; medium=$s; ring_won_from="" ;;
      ring) seen_other=1; [[ -z $ring_won_from ]] && ring_won_from=$s ;;
    esac
  done
  echo
  small_txt="(no clear rd region)" medium_txt="(no clear Rabenseifner region)"
  [[ -n $small ]] && small_txt=$(human "$small")
  [[ -n $medium ]] && medium_txt=$(human "$medium")
  echo "Suggested for $n ranks: small_bytes $small_txt, medium_bytes $medium_txt" \
    "${ring_won_from:+(ring fastest from $(human "$ring_won_from"))}"
done
((failed)) && { note "$failed runs failed (left out of the medians)"; exit 1; }
exit 0
