#!/usr/bin/env bash
# kv-bench's target killed with SIGKILL mid-run (issue 21: "nothing lost, nothing hung"):
# the initiator must exit non-zero within 2 s of the kill (plus, in an ASan build, the leak
# scan at exit: test_lib.sh's leak_scan_s), its error naming the peer (kv-bench's "… with
# peer 'target' … failed" and softrdma's log line, stamped within 2 s of the kill, naming the
# peer's address, QPN and pid), for blocks of 4 KiB, 64 KiB and 1 MiB, on whichever path
# SOFTRDMA_TRANSPORT selects.
#
#   kv_kill_test.sh BUILD_DIR CASE      CASE: 4k | 64k | 1m | demo_decode | demo_prefill
#
# demo_decode / demo_prefill: kv-demo's decode (or prefill) process is killed while the two
# run requests of 2 K tokens (a 256 MiB cache) back to back; the survivor must exit non-zero
# within 2 s naming its peer (before: prefill waited 120 s for decode's verification, decode
# 60-120 s for prefill's next message). The survivor meets the dead peer at its next WRITE or
# message, so the bound holds the rest of a request's own work (prefill fills and "computes"
# the cache before writing it) plus the first retransmit timeout (67 ms): with 8 K tokens
# (1 GiB) that work alone took 1.8 s on a loaded machine and the test failed at 2.29 s with
# no hang (the error came 57 ms after the survivor's first WRITE). Metadata port 17798 / 17799.
#
# Case k uses the TCP metadata port 17795+k and the device addresses 127.0.93.(2k+1) (target)
# and 127.0.93.(2k+2) (initiator), so the cases run in parallel.
set -uo pipefail

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
case_test_args kv_kill "4k 64k 1m demo_decode demo_prefill" "$@"
case "$CASE" in
  4k) K=0; BLOCK=4k ;;
  64k) K=1; BLOCK=64k ;;
  1m) K=2; BLOCK=1m ;;
  demo_decode) K=3 ;;
  demo_prefill) K=4 ;;
esac
PORT=$((17795 + K))
STEP_TIMEOUT=60
make_work_dir "kv-kill-$CASE"
TARGET_PID="" INIT_PID=""
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  [[ -n $TARGET_PID ]] && kill -9 "$TARGET_PID" 2>/dev/null
  [[ -n $INIT_PID ]] && kill -9 "$INIT_PID" 2>/dev/null
  return 0
}

if [[ $CASE == demo_* ]]; then
  # The decode process serves the store; both take the first free 127.0.0.x.
  M="tcp://127.0.0.1:$PORT"
  "$BUILD_DIR/bin/kv-demo" --role decode --serve-metadata --metadata "$M" --tokens 2048 \
    --requests 1000 >"$WORK/decode.log" 2>&1 &
  TARGET_PID=$!
  wait_for_listener "$PORT" "$TARGET_PID" 30 "$WORK/decode.log"
  "$BUILD_DIR/bin/kv-demo" --role prefill --metadata "$M" --tokens 2048 --requests 1000 \
    >"$WORK/prefill.log" 2>&1 &
  INIT_PID=$!
  # Running: prefill printed a request's row (it flushes its stdout per row).
  for ((i = 0; i < 300; i++)); do
    grep -qE '^ +whole +[0-9]+ ' "$WORK/prefill.log" && break
    sleep 0.1
  done
  grep -qE '^ +whole +[0-9]+ ' "$WORK/prefill.log" ||
    { show_logs "$WORK/prefill.log" "$WORK/decode.log"; fail "kv-demo never finished a request"; }
  victim=$TARGET_PID survivor=$INIT_PID name=decode peer=decode
  if [[ $CASE == demo_prefill ]]; then
    victim=$INIT_PID survivor=$TARGET_PID name=prefill peer=prefill
  fi
  log="$WORK/prefill.log"
  [[ $CASE == demo_prefill ]] && log="$WORK/decode.log"
  kill_and_wait_exit "$victim" "$survivor" 2 "$log" "the survivor"
  rc=$RC
  TARGET_PID="" INIT_PID=""
  echo "survivor ended $TOOK s after $name was killed: $(status_text $rc)"
  grep "kv-demo:" "$log" | tail -1
  ((rc != 0)) || { show_logs "$log"; fail "the survivor exited 0"; }
  grep -q "kv-demo: .*peer '$peer'" "$log" || { show_logs "$log"; fail "the error does not name '$peer'"; }
  echo "PASS [$TEST_NAME]"
  exit 0
fi

# No `timeout` wrapper: the pids are kv-bench's own (the initiator is bounded below).
SOFTRDMA_ADDR=127.0.93.$((2 * K + 1)) "$BUILD_DIR/bin/kv-bench" --mode target --serve-metadata \
  --metadata "tcp://127.0.0.1:$PORT" --buffer_size 16m >"$WORK/target.log" 2>&1 &
TARGET_PID=$!
wait_for_listener "$PORT" "$TARGET_PID" 30 "$WORK/target.log"
SOFTRDMA_ADDR=127.0.93.$((2 * K + 2)) "$BUILD_DIR/bin/kv-bench" --mode initiator \
  --metadata "tcp://127.0.0.1:$PORT" --operation write --block_size "$BLOCK" --qps 2 \
  --batch_size 16 --buffer_size 16m --duration 30 >"$WORK/init.log" 2>&1 &
INIT_PID=$!
# Running: the target's device counts the WRITEs it receives (softrdma stat).
for ((i = 0; i < 300; i++)); do
  "$BUILD_DIR/bin/softrdma" stat --json 2>/dev/null | grep "127.0.93.$((2 * K + 1))" >/dev/null && break
  sleep 0.1
done
sleep 2
kill -0 "$INIT_PID" 2>/dev/null || { show_logs "$WORK/init.log" "$WORK/target.log"; fail "the initiator ended before the kill"; }
kill_and_wait_exit "$TARGET_PID" "$INIT_PID" 2 "$WORK/init.log" "the initiator"
rc=$RC
took=$TOOK
INIT_PID=""
wait "$TARGET_PID" 2>/dev/null
TARGET_PID=""
echo "initiator ended $took s after the kill: $(status_text $rc)"
grep -E "peer|failed" "$WORK/init.log" | head -3
((rc != 0)) || { show_logs "$WORK/init.log"; fail "the initiator exited 0 although its target died"; }
grep -q "with peer 'target'.* failed" "$WORK/init.log" ||
  { show_logs "$WORK/init.log"; fail "kv-bench's error does not name the peer"; }
require_logged_within "$WORK/init.log" \
  "peer 127.0.93.$((2 * K + 1)) qpn .*\(pid [0-9]*, gone\): IBV_WC_RETRY_EXC_ERR" 2 "the initiator"
echo "PASS [$TEST_NAME]"
