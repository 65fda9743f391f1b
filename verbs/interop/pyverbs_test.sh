#!/usr/bin/env bash
# rdma-core's Python test suite (Debian's python3-pyverbs, /usr/share/doc/rdma-core/tests)
# against srdma0, through `softrdma run` (device 127.0.14.1):
#
#   pyverbs_test.sh BUILD_DIR [rdmacm_after_qp]
#
# rdmacm_after_qp (issue 22 item 6): only tests.test_qp then tests.test_rdmacm, in one
# Python process, at 127.0.97.3: the parent's QP tests leave device contexts open, so the
# RDMA-CM tests' forked passive and active sides share the address with the parent, which
# owns it and forwards to them; each test's children take the slots the previous test's
# left. Issue 22 reported ETIMEDOUT there; on the 2-core test host the original code passed
# this ordering but slowly (~8 s: forwards to the children lost to the unix socket's
# 10-datagram queue and retried, which a loaded host can stretch into the CM's timeout), and
# an intermediate version of the fix failed it (the parent's forwarding socket for a slot
# stayed connected to the previous child's dead socket: test_rdmacm_async_read errored
# after 22 s). Now ~2 s.
#
# pyverbs_run.py runs the suite as its run_tests.py does (--dev srdma0 --gid 0) and prints a
# summary of what ran, passed and was skipped, and why (docs/verbs.md keeps that table). The
# test fails when any test of the suite fails or errors, or when none ran. Nothing is left
# out: the RDMA-CM tests (test_rdmacm), whose passive and active sides are two processes
# forked from the suite that both use the device's one address, run on a device address
# shared by several processes (docs/rdma-cm.md, "Several processes on one address").
# A missing python3-pyverbs is a failure, never a skip. Bounded by `timeout` (the suite takes seconds; 100 s is the limit).
set -uo pipefail

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
# shellcheck disable=SC2034  # read by fail() in test_lib.sh
TEST_NAME=pyverbs
[[ $# -eq 1 || ( $# -eq 2 && $2 == rdmacm_after_qp ) ]] ||
  { echo "usage: $0 BUILD_DIR [rdmacm_after_qp]" >&2; exit 2; }
ADDR=127.0.14.1 ONLY=()
if [[ ${2:-} == rdmacm_after_qp ]]; then
  ADDR=127.0.97.3 ONLY=(--only tests.test_qp --only tests.test_rdmacm)
fi
resolve_build_dir "$1"
require_softrdma_built
/usr/bin/python3 -c 'import pyverbs' 2>/dev/null ||
  fail "python3-pyverbs is missing (Debian package python3-pyverbs)"
[[ -f /usr/share/doc/rdma-core/tests/run_tests.py ]] ||
  fail "/usr/share/doc/rdma-core/tests is missing (Debian package python3-pyverbs)"

STEP_TIMEOUT=100
make_work_dir softrdma-pyverbs
LOG=$WORK/pyverbs.log
# The suite's subprocesses (ls, ip) run under the same preload: /sys/class/infiniband is the
# virtual tree of verbs/sysfs/.
timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$ADDR" -- /usr/bin/python3 \
  "$(dirname "${BASH_SOURCE[0]}")/pyverbs_run.py" "${ONLY[@]}" \
  -- --dev srdma0 --gid 0 -v >"$LOG" 2>&1
rc=$?
grep -E '^(ERROR|FAIL):' "$LOG" >&2
sed -n '/^pyverbs summary/,/^$/p' "$LOG"
if ((rc != 0)); then
  show_logs "$LOG"
  fail "the pyverbs suite failed ($(status_text $rc))"
fi
echo "ok: pyverbs suite passed"
