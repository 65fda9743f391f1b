#!/usr/bin/env bash
# End-to-end tests of the nccl-tests–style tools (tools/ccl_perf) over softrdma on loopback.
#
#   ccl_perf_test.sh BUILD_DIR CASE
#
# CASE:
#   mpirun     mpirun -np 4 --oversubscribe --allow-run-as-root all_reduce_perf -b 8 -e 1M -f 4
#              -c 1: every result line has #wrong 0 (out-of-place and in-place), the footer
#              says "Out of bounds values : 0 OK"
#   torchrun   every tool (all_reduce, all_gather, reduce_scatter, broadcast, reduce,
#              alltoall, sendrecv) with 3 ranks started with the torchrun variables (RANK,
#              WORLD_SIZE, MASTER_ADDR, MASTER_PORT), a few sizes and datatypes, checked
#   single     all_reduce_perf with no launcher: one rank
#   group      mpirun -np 2: sendrecv_perf (a communicator group {send to next, recv from
#              prev}) with -m 1 and -m 4, and all_reduce_perf -m 4 -z 1 -G 1 (operations
#              aggregated in one group per iteration), all checked (#wrong 0); the parameters
#              line says "agg iters: 4" and rank 0 notes that -G is ignored
#   kill kill_4k kill_64k
#              4 ranks (torchrun variables) in a long all_reduce_perf of 1 MiB (kill), 4 KiB
#              or 64 KiB; one is killed with SIGKILL mid-run; every other rank must exit
#              non-zero within 2 s with an error naming the dead rank ("peer rank 2
#              (127.0.0.x)"). The collectives' own timeout stays at its 30 s default: the
#              2 s come from the engine noticing the dead process (docs/architecture.md,
#              "Peers that die or stop"), and the abort the first rank to see it sends.
#
# Each rank binds its own softrdma device (first free 127.0.0.x: SOFTRDMA_ADDR unset). The
# tools link build/lib/libibverbs.so.1 through their RUNPATH, so no `softrdma run` is needed.
set -uo pipefail

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../scripts/lib/test_lib.sh"
case_test_args ccl_perf "mpirun torchrun single kill kill_4k kill_64k group" "$@"
BIN="$BUILD_DIR/bin"
STEP_TIMEOUT=${CCL_PERF_TIMEOUT:-120}
unset SOFTRDMA_ADDR RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT SOFTRDMA_CCL_MASTER

make_work_dir "ccl-perf-$CASE"
PIDS=()
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  local p
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
}

# A TCP port in 20000..29999 that nothing listens on, with the port below it free too
# (torchrun's MASTER_PORT; the rendezvous uses MASTER_PORT+1).
free_port() {
  local p
  while :; do
    p=$((20001 + RANDOM % 9998))
    tcp_listening "$p" || tcp_listening $((p - 1)) || { echo "$p"; return; }
  done
}

# Checks a tool's rank-0 output: result lines with #wrong 0 (N/A allowed where unchecked),
# at least `min_lines` of them, and the OK footer.
check_output() {
  local log=$1 min_lines=$2 what=$3
  local lines bad
  lines=$(grep -cE '^ +[0-9]+ +[0-9]+ ' "$log")
  ((lines >= min_lines)) || { show_logs "$log"; fail "$what: $lines result lines, expected >= $min_lines"; }
  # Columns: size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
  bad=$(awk '/^ +[0-9]+ +[0-9]+ / { if (NF != 13 || ($9 != "0" && $9 != "N/A") || ($13 != "0" && $13 != "N/A")) print }' "$log")
  [[ -z "$bad" ]] || { show_logs "$log"; fail "$what: lines with wrong elements or malformed:"$'\n'"$bad"; }
  grep -q '^# Out of bounds values : 0 OK$' "$log" || { show_logs "$log"; fail "$what: no '# Out of bounds values : 0 OK'"; }
  grep -qE '^# Avg bus bandwidth    : [0-9.e+-]+' "$log" || { show_logs "$log"; fail "$what: no '# Avg bus bandwidth' footer"; }
  grep -q '^#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong$' "$log" ||
    { show_logs "$log"; fail "$what: column header differs from nccl-tests'"; }
}

# Starts N ranks of TOOL with the torchrun variables; logs in $WORK/<tag>.<rank>.log.
# PIDS[r] is rank r's own pid (no wrapper: the kill case signals the tool itself);
# wait_rank bounds the wait instead of `timeout`.
start_torchrun() {
  local n=$1 tag=$2 tool=$3
  shift 3
  local port r
  port=$(free_port)
  PIDS=()
  DEADLINE=$((SECONDS + STEP_TIMEOUT))
  for ((r = 0; r < n; r++)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port - 1)) \
      "$BIN/$tool" "$@" >"$WORK/$tag.$r.log" 2>&1 &
    PIDS+=($!)
  done
}

# Waits for rank $1 until DEADLINE (then kills it: status 137); sets RC.
wait_rank() {
  local pid=${PIDS[$1]}
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < DEADLINE)); do sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "rank $1 still running after ${STEP_TIMEOUT}s: killed" >&2
    kill -9 "$pid" 2>/dev/null
  fi
  RC=0
  wait "$pid" 2>/dev/null || RC=$?
}

# Waits for every started rank; fails unless all exit 0.
wait_all_ok() {
  local what=$1 tag=$2 r bad=0
  for r in "${!PIDS[@]}"; do
    wait_rank "$r"
    if ((RC != 0)); then
      echo "rank $r exited with status $RC" >&2
      bad=1
    fi
  done
  PIDS=()
  ((bad == 0)) || { show_logs "$WORK/$tag".*.log; fail "$what"; }
}

case "$CASE" in
  mpirun)
    command -v mpirun >/dev/null || fail "mpirun not found: install openmpi-bin (bash scripts/deps.sh)"
    log="$WORK/mpirun.log"
    args=(-b 8 -e 1M -f 4 -c 1)
    echo "mpirun -np 4 --oversubscribe --allow-run-as-root all_reduce_perf ${args[*]}"
    rc=0
    timeout -k 5 "$STEP_TIMEOUT" mpirun -np 4 --oversubscribe --allow-run-as-root \
      --mca btl self,tcp --mca pml ob1 "$BIN/all_reduce_perf" "${args[@]}" >"$log" 2>&1 || rc=$?
    ((rc == 0)) || { show_logs "$log"; fail "mpirun exited with status $rc"; }
    check_output "$log" 7 "all_reduce_perf under mpirun"  # 8, 32, ..., 512K: 10 sizes... at least 7
    grep -c '^#  Rank ' "$log" | grep -qx 4 || { show_logs "$log"; fail "expected 4 '#  Rank' lines"; }
    cat "$log"
    ;;
  torchrun)
    for tool in all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf \
      alltoall_perf sendrecv_perf; do
      extra=(-d float)
      case $tool in
        all_reduce_perf) extra=(-d all -o sum) ;;
        reduce_scatter_perf) extra=(-d half -o avg) ;;
        reduce_perf) extra=(-d int32 -o max -r 2) ;;
        broadcast_perf) extra=(-d bfloat16 -r 1) ;;
      esac
      echo "3 ranks (torchrun variables): $tool -b 4 -e 256K -f 8 -n 3 -w 1 -c 1 ${extra[*]}"
      start_torchrun 3 "$tool" "$tool" -b 4 -e 256K -f 8 -n 3 -w 1 -c 1 "${extra[@]}"
      wait_all_ok "$tool" "$tool"
      check_output "$WORK/$tool.0.log" 4 "$tool"
    done
    tail -n 8 "$WORK/all_reduce_perf.0.log"
    ;;
  group)
    command -v mpirun >/dev/null || fail "mpirun not found: install openmpi-bin (bash scripts/deps.sh)"
    # stdout and stderr apart: mpirun forwards them on separate channels, and a note on
    # stderr once landed inside a result line of block-buffered stdout in a merged log.
    run_mpirun2() {
      local log=$1
      shift
      echo "mpirun -np 2 $*"
      rc=0
      timeout -k 5 "$STEP_TIMEOUT" mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to none \
        --mca btl self,tcp --mca pml ob1 "$@" >"$log" 2>"$log.stderr" || rc=$?
      ((rc == 0)) || { show_logs "$log" "$log.stderr"; fail "$1: mpirun exited with status $rc"; }
    }
    for m in 1 4; do
      run_mpirun2 "$WORK/sendrecv.$m.log" "$BIN/sendrecv_perf" -b 8 -e 4M -f 8 -n 5 -w 1 -c 1 -m "$m"
      check_output "$WORK/sendrecv.$m.log" 7 "sendrecv_perf -m $m"
      grep -q "agg iters: $m validation: 1 graph: 0\$" "$WORK/sendrecv.$m.log" ||
        { show_logs "$WORK/sendrecv.$m.log"; fail "sendrecv_perf -m $m: parameters line"; }
    done
    log="$WORK/allreduce.log"
    run_mpirun2 "$log" "$BIN/all_reduce_perf" -b 8 -e 1M -f 8 -n 5 -w 1 -c 1 -m 4 -z 1 -G 1 -d all
    check_output "$log" 60 "all_reduce_perf -m 4"
    grep -q 'agg iters: 4 validation: 1 graph: 1$' "$log" || { show_logs "$log"; fail "all_reduce_perf -m 4: parameters line"; }
    [[ $(grep -c 'note: -G 1 ignored: there are no CUDA graphs on CPU buffers' "$log.stderr") == 1 ]] ||
      { show_logs "$log" "$log.stderr"; fail "all_reduce_perf -G 1: expected one note from rank 0"; }
    cat "$WORK/sendrecv.4.log"
    ;;
  single)
    log="$WORK/single.log"
    rc=0
    timeout -k 5 "$STEP_TIMEOUT" "$BIN/all_reduce_perf" -b 8 -e 64K -f 8 -n 5 -w 1 >"$log" 2>&1 || rc=$?
    ((rc == 0)) || { show_logs "$log"; fail "exited with status $rc"; }
    check_output "$log" 5 "single rank"
    cat "$log"
    ;;
  kill | kill_4k | kill_64k)
    victim=2
    size=1M
    [[ $CASE == kill_4k ]] && size=4K
    [[ $CASE == kill_64k ]] && size=64K
    # Long enough to run for minutes: the kill lands mid-AllReduce.
    start_torchrun 4 kill all_reduce_perf -b $size -e $size -n 100000000 -w 0 -c 0
    # Wait until the ranks are in the timed loop (rank 0 printed the column header).
    for ((i = 0; i < 600; i++)); do
      grep -q '^#       size' "$WORK/kill.0.log" 2>/dev/null && break
      sleep 0.1
    done
    grep -q '^#       size' "$WORK/kill.0.log" || { show_logs "$WORK"/kill.*.log; fail "the ranks never started"; }
    sleep 1
    kill -9 "${PIDS[$victim]}"
    killed_at=$(date +%s.%N)
    bad=0
    for r in "${!PIDS[@]}"; do
      wait_rank "$r"
      ((r == victim)) && continue
      took=$(awk -v a="$killed_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
      msg=$(grep -m1 'error:' "$WORK/kill.$r.log")
      echo "rank $r: status $RC after ${took}s: $msg"
      ((RC == 3)) || { echo "rank $r: expected exit status 3 (runtime failure), got $RC" >&2; bad=1; }
      [[ "$msg" == *"peer rank $victim (127.0.0."* ]] || { echo "rank $r: error does not name rank $victim" >&2; bad=1; }
    done
    PIDS=()
    ended=$(date +%s.%N)
    total=$(awk -v a="$killed_at" -v b="$ended" 'BEGIN { printf "%.2f", b - a }')
    awk -v t="$total" 'BEGIN { exit !(t < 2.0) }' || { echo "ranks took ${total}s (> 2 s) to fail" >&2; bad=1; }
    ((bad == 0)) || { show_logs "$WORK"/kill.*.log; fail "kill"; }
    ;;
  *)
    echo "unknown case '$CASE' (mpirun|torchrun|single|kill|kill_4k|kill_64k|group)" >&2
    exit 2
    ;;
esac
echo "PASS [ccl_perf.$CASE]"
