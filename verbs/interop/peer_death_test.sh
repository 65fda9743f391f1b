#!/usr/bin/env bash
# A same-host peer killed or stopped in the middle of Debian's unmodified ib_write_bw /
# ib_read_bw (issue 21: "nothing lost, nothing hung"), on whichever path SOFTRDMA_TRANSPORT
# selects (ctest runs the suite once on the shared-memory path, once over UDP).
#
#   peer_death_test.sh BUILD_DIR CASE
#
# CASE:
#   kill_write_4k kill_write_64k kill_write_1m kill_read_64k
#              `ib_{write,read}_bw -D 30 -s SIZE` (duration mode: it would run 30 s). Once the
#              client reports it is running, the server — the target of the client's WRITEs /
#              READs — is killed with SIGKILL. Within 2 s of the kill softrdma's log must name
#              the dead peer (address, QPN, pid) with IBV_WC_RETRY_EXC_ERR, and the client
#              must exit non-zero within 2 s (plus, in an ASan build, the leak scan at exit:
#              test_lib.sh's leak_scan_s). Before the fix a requester parked on the dead peer's
#              full same-host backlog waited forever (ib_write_bw ran to its -D end with no
#              error).
#   stop_5s    `ib_write_bw -D 10 -s 64K`: 2 s in, the server is stopped with SIGSTOP for
#              5 s, then continued. Both sides must exit 0 with a bandwidth line: a stopped
#              process is not a dead one (a NIC would have acknowledged for it; here the
#              requester sees the peer's pid stopped and does not spend retry_cnt on it).
#              Before the fix the client failed after (retry_cnt + 1) × 67 ms ≈ 0.5 s.
#
# Case number N (1-5) gives the server --addr 127.0.91.N, the client 127.0.92.N and perftest's
# TCP port 18960+N, so the cases run in parallel.
set -uo pipefail

CASES="kill_write_4k kill_write_64k kill_write_1m kill_read_64k stop_5s"
# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
case_test_args peer_death "$CASES" "$@"
require_softrdma_built

case "$CASE" in
  kill_write_4k)  N=1; TOOL=ib_write_bw; SIZE=4096 ;;
  kill_write_64k) N=2; TOOL=ib_write_bw; SIZE=65536 ;;
  kill_write_1m)  N=3; TOOL=ib_write_bw; SIZE=1048576 ;;
  kill_read_64k)  N=4; TOOL=ib_read_bw;  SIZE=65536 ;;
  stop_5s)        N=5; TOOL=ib_write_bw; SIZE=65536 ;;
esac
[[ -x /usr/bin/$TOOL ]] || fail "/usr/bin/$TOOL is missing: install Debian's perftest"
SERVER_ADDR=127.0.91.$N
CLIENT_ADDR=127.0.92.$N
PORT=$((18960 + N))
DURATION=30
[[ $CASE == stop_5s ]] && DURATION=10
STEP_TIMEOUT=60

make_work_dir "peer-death-$CASE"
suppress_perftest_leaks
SERVER_PID="" CLIENT_PID=""
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  [[ -n $SERVER_PID ]] && kill -CONT "$SERVER_PID" 2>/dev/null
  [[ -n $SERVER_PID ]] && kill -9 "$SERVER_PID" 2>/dev/null
  [[ -n $CLIENT_PID ]] && kill -9 "$CLIENT_PID" 2>/dev/null
  return 0
}

ARGS=(-d srdma0 -x 0 -p "$PORT" -s "$SIZE" -D "$DURATION")
# `softrdma run` execs the program: $! is perftest itself, so signals reach it directly.
timeout "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$SERVER_ADDR" -- "$TOOL" "${ARGS[@]}" \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
wait_for_listener "$PORT" "$SERVER_PID" 30 "$WORK/server.log"
timeout "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$CLIENT_ADDR" -- stdbuf -oL "$TOOL" "${ARGS[@]}" 127.0.0.1 \
  >"$WORK/client.log" 2>&1 &
CLIENT_PID=$!
# Running: the client printed its table header (duration mode prints it before the loop;
# stdbuf -oL: perftest writes to a file, which stdio would otherwise buffer until exit).
wait_for_log_line '#bytes' "$CLIENT_PID" 30 "$WORK/client.log" "the client started its test"
sleep 1.5

if [[ $CASE == kill_* ]]; then
  # The server is perftest itself (`timeout` forks it: its child), the target of the traffic.
  victim=$(pgrep -P "$SERVER_PID" -x "$TOOL" || echo "$SERVER_PID")
  # The client must end by itself, with an error, within 2 s.
  kill_and_wait_exit "$victim" "$CLIENT_PID" 2 "$WORK/client.log" "the client"
  rc=$RC
  took=$TOOK
  CLIENT_PID=""
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=""
  echo "client ended $took s after the kill: $(status_text $rc)"
  ((rc != 0)) || { show_logs "$WORK/client.log"; fail "the client exited 0 although its peer died"; }
  require_logged_within "$WORK/client.log" 'IBV_WC_RETRY_EXC_ERR' 2 "the client"
  [[ $LOGGED_LINE == *"peer $SERVER_ADDR qpn "*"(pid $victim, gone)"* ]] ||
    { show_logs "$WORK/client.log"; fail "softrdma's log does not name the dead peer"; }
else
  victim=$(pgrep -P "$SERVER_PID" -x "$TOOL" || echo "$SERVER_PID")
  kill -STOP "$victim"
  sleep 5
  kill -CONT "$victim"
  wait "$CLIENT_PID"
  crc=$?
  CLIENT_PID=""
  wait "$SERVER_PID"
  src=$?
  SERVER_PID=""
  echo "after a 5 s SIGSTOP of the server: client $(status_text $crc), server $(status_text $src)"
  ((crc == 0 && src == 0)) || { show_logs "$WORK/client.log" "$WORK/server.log"; fail "a stopped peer ended the connection"; }
  grep -E "^ *$SIZE +[0-9]+ " "$WORK/client.log" ||
    { show_logs "$WORK/client.log"; fail "no bandwidth line"; }
fi
echo "PASS [$TEST_NAME]"
