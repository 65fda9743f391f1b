#!/usr/bin/env bash
# Debian's unmodified qperf (0.4.11) over softrdma, through `softrdma run`: a server at
# 127.0.94.1 (qperf forks a child per test, which opens the device) and a client at
# 127.0.94.2 running every RC test qperf has, with its RDMA-CM option (-cm1):
#
#   qperf_test.sh BUILD_DIR
#
# rc_bw rc_bi_bw rc_lat rc_rdma_write_bw rc_rdma_write_lat rc_rdma_write_poll_lat
# rc_rdma_read_bw rc_rdma_read_lat rc_compare_swap_mr rc_fetch_add_mr ver_rc_compare_swap
# ver_rc_fetch_add, 1 s each (-t 1): each must print its figure (bw, latency or msg_rate),
# and the client must exit 0. qperf ends each timed loop with SIGALRM while it is blocked in
# ibv_get_cq_event, which must then return EINTR (before, softrdma retried the read and
# rc_lat hung until "failed to receive results: timed out", 1 run in 2). No bound on the
# figures: a loaded host's scheduling, not softrdma, sets them.
#
# Without -cm1, qperf addresses its QPs by LID with no GRH, which RoCE refuses (rxe too:
# modify_qp to RTR fails with EINVAL); its UC, UD and XRC tests have no RDMA-CM variant and
# fail that way on any RoCE device, so they are not run (docs/rdma-cm.md, "qperf").
# Port 18470 (qperf's control connection). A missing qperf is a failure (apt-get install
# qperf; scripts/deps.sh), never a skip.
set -uo pipefail

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
# shellcheck disable=SC2034  # read by fail() in test_lib.sh
TEST_NAME=qperf
[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
resolve_build_dir "$1"
require_softrdma_built
command -v qperf >/dev/null || fail "qperf not found: install qperf (bash scripts/deps.sh)"
STEP_TIMEOUT=120
S=127.0.94.1 C=127.0.94.2 PORT=18470
TESTS=(rc_bw rc_bi_bw rc_lat rc_rdma_write_bw rc_rdma_write_lat rc_rdma_write_poll_lat
  rc_rdma_read_bw rc_rdma_read_lat rc_compare_swap_mr rc_fetch_add_mr ver_rc_compare_swap
  ver_rc_fetch_add)

make_work_dir softrdma-qperf
# Sanitizer builds (`softrdma run` preloads the ASan runtime): qperf exits without freeing its
# verbs and RDMA-CM objects (LeakSanitizer: "Direct leak … in ibv_alloc_pd … from qperf", and
# the device state hanging off it), which turns into exit status 1. qperf runs without leak
# checks, as the dapl.* and ucx.* tests' programs do; softrdma's libraries are leak-checked
# by their own tests.
no_leak_checks_under_asan
SERVER_PID=""
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null
}
SLOG=$WORK/server.log CLOG=$WORK/client.log
timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$S" -- qperf -lp "$PORT" >"$SLOG" 2>&1 &
SERVER_PID=$!
wait_for_listener "$PORT" "$SERVER_PID" 30 "$SLOG"
rc=0
timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$C" -- \
  qperf -lp "$PORT" -cm1 -t 1 "$S" "${TESTS[@]}" >"$CLOG" 2>&1 || rc=$?
((rc == 0)) || { show_logs "$SLOG" "$CLOG"; fail "qperf client: $(status_text $rc)"; }
# Each test's name, then its figure on the next line.
for t in "${TESTS[@]}"; do
  grep -A1 -E "^$t:$" "$CLOG" | grep -E '^ +(bw|latency|msg_rate) += +[0-9.]+ ' >/dev/null ||
    { show_logs "$CLOG"; fail "qperf $t printed no figure"; }
done
tr -s ' ' <"$CLOG" | paste -sd' ' | sed 's/ \([a-z_]*:\)/\n\1/g'
echo "ok: qperf's ${#TESTS[@]} RC tests over softrdma's RDMA-CM"
