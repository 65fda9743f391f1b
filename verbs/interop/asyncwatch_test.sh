#!/usr/bin/env bash
# Runs Debian's unmodified ibv_asyncwatch (ibverbs-utils) over softrdma, through
# `softrdma run`, and stops it:
#
#   asyncwatch_test.sh BUILD_DIR
#
# ibv_asyncwatch opens the device, prints "srdma0: async event FD N" and then blocks in
# ibv_get_async_event. The script checks that it started that way within 30 s, that FD N
# in the running process is a real pipe (/proc/PID/fd/N), that it is still blocked (no
# event is queued at open, as on rxe) and that SIGTERM ends it (status 143) within 10 s
# (SIGINT would not do: a background job of a non-interactive shell ignores it).
# Device address 127.0.12.1. A missing /usr/bin/ibv_asyncwatch is a failure (install
# Debian's ibverbs-utils), never a skip.
set -uo pipefail

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
# shellcheck disable=SC2034  # read by fail() in test_lib.sh
TEST_NAME=asyncwatch
[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
resolve_build_dir "$1"
require_softrdma_built
[[ -x /usr/bin/ibv_asyncwatch ]] ||
  fail "/usr/bin/ibv_asyncwatch is missing: install Debian's ibverbs-utils"

make_work_dir softrdma-asyncwatch
PID=""
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  [[ -n "$PID" ]] && kill -KILL "$PID" 2>/dev/null
}

LOG=$WORK/asyncwatch.log
# `softrdma run` execs the program, and stdbuf execs ibv_asyncwatch with line-buffered
# stdout, so $! is ibv_asyncwatch itself.
"$SOFTRDMA" run --addr 127.0.12.1 -- stdbuf -oL /usr/bin/ibv_asyncwatch -d srdma0 \
  >"$LOG" 2>&1 &
PID=$!

FD=""
for _ in $(seq 300); do
  FD=$(sed -n 's/^srdma0: async event FD \([0-9][0-9]*\)$/\1/p' "$LOG")
  [[ -n $FD ]] && break
  kill -0 "$PID" 2>/dev/null || { show_logs "$LOG"; fail "ibv_asyncwatch exited before it started"; }
  sleep 0.1
done
[[ -n $FD ]] || { show_logs "$LOG"; fail "no 'srdma0: async event FD N' line within 30 s"; }

TARGET=$(readlink "/proc/$PID/fd/$FD") || { show_logs "$LOG"; fail "fd $FD is not open in $PID"; }
[[ $TARGET == pipe:* ]] || fail "async_fd $FD is '$TARGET', not a pipe"

sleep 0.3
kill -0 "$PID" 2>/dev/null || { show_logs "$LOG"; fail "ibv_asyncwatch did not stay blocked"; }
if grep -q "event:" "$LOG"; then
  show_logs "$LOG"
  fail "an event was reported at open"
fi

kill -TERM "$PID"
RC=""
for _ in $(seq 100); do
  if ! kill -0 "$PID" 2>/dev/null; then
    wait "$PID"
    RC=$?
    break
  fi
  sleep 0.1
done
[[ -n $RC ]] || { show_logs "$LOG"; fail "ibv_asyncwatch did not stop within 10 s of SIGTERM"; }
PID=""
[[ $RC -eq 143 ]] || { show_logs "$LOG"; fail "ibv_asyncwatch ended with status $RC, not 143 (SIGTERM)"; }
echo "ibv_asyncwatch: started (async_fd $FD, a pipe), blocked with no event, stopped by SIGTERM"
