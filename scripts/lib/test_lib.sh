# shellcheck shell=bash
# Helpers the shell tests share; source it, don't run it:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/<up to the root>/scripts/lib/test_lib.sh"
#
# Used by tools/tests/cli_test.sh, tools/tests/pingpong_test.sh, tools/tests/tdf_test.sh,
# tools/ccl_perf/tests/ccl_perf_test.sh, verbs/interop/perftest_test.sh and scripts/demo.sh.
#
#   case_test_args PREFIX "CASES" "$@"
#                                  a script run as `SCRIPT BUILD_DIR CASE` (one ctest per
#                                  case): sets CASE, TEST_NAME=PREFIX.CASE, BUILD_DIR and
#                                  SOFTRDMA; exit 2 with a usage line unless there are two
#                                  arguments and CASE is one of CASES (space-separated)
#   TEST_NAME=pingpong.default     the name `fail` puts in its message
#   fail MSG...                    "FAIL [TEST_NAME]: MSG" on stderr, exit 1
#   resolve_build_dir DIR          BUILD_DIR=absolute DIR (exit 1 if it does not exist) and
#                                  SOFTRDMA=$BUILD_DIR/bin/softrdma
#   require_softrdma_built         fail unless softrdma and the drop-in libibverbs.so.1 exist
#   make_work_dir PREFIX           WORK=a fresh directory, removed at exit after the script's
#                                  own `on_exit` function (if it defines one) has run
#   show_logs FILE...              each file under a "----- name -----" banner, on stderr
#   tcp_listening PORT             true if something listens on TCP PORT
#   wait_for_listener PORT PID SECONDS LOG
#                                  wait until PID (a server) listens on TCP PORT; fail, showing
#                                  LOG, if it exits first or after SECONDS
#   wait_for_cm_listener ADDR PORT PID SECONDS LOG
#                                  wait until PID (a server run with `softrdma run --log info`)
#                                  logs that softrdma's RDMA-CM listens on ADDR:PORT (or the
#                                  wildcard); fail, showing LOG, if it exits first or after SECONDS
#   status_text RC                 "status RC", plus "(timed out after ${STEP_TIMEOUT}s)" for
#                                  timeout's 124 / 137
#   no_leak_checks_under_asan      when softrdma is a sanitizer build (its `run` preloads the
#                                  ASan runtime into the programs it starts): the third-party
#                                  programs of this script run without LeakSanitizer (their own
#                                  leaks at exit would fail them); memory errors are still
#                                  checked, softrdma's libraries are leak-checked by their tests
#   suppress_perftest_leaks        (after make_work_dir) LeakSanitizer suppressions for
#                                  perftest's own leaks, in LSAN_OPTIONS (see below)
#   kill_and_wait_exit VICTIM PID SECONDS LOG WHAT
#                                  SIGKILLs VICTIM, then waits up to SECONDS (plus
#                                  leak_scan_s, below) for PID (a background job) to exit by
#                                  itself; fails (showing LOG, naming WHAT) if it still runs (a
#                                  hang). Sets KILLED_AT (epoch seconds), TOOK (seconds from the
#                                  kill to the exit, 2 decimals) and RC (PID's exit status)
#   require_logged_within LOG PATTERN SECONDS WHAT
#                                  (after kill_and_wait_exit) the first line of LOG matching
#                                  PATTERN (a softrdma log line, which starts "softrdma L
#                                  HH:MM:SS.ffffff") must be stamped within SECONDS of the
#                                  kill; prints it and the delay, sets LOGGED_LINE to it,
#                                  fails naming WHAT otherwise

TEST_NAME=${TEST_NAME:-$(basename "$0" .sh)}

fail() {
  echo "FAIL [$TEST_NAME]: $*" >&2
  exit 1
}

resolve_build_dir() {
  BUILD_DIR=$(cd "$1" && pwd) || { echo "FAIL: no build directory '$1'" >&2; exit 1; }
  SOFTRDMA="$BUILD_DIR/bin/softrdma"
}

case_test_args() {
  local prefix=$1 cases=$2
  shift 2
  if [[ $# -ne 2 ]]; then
    echo "usage: $0 BUILD_DIR CASE   (CASE: ${cases// /|})" >&2
    exit 2
  fi
  CASE=$2
  if [[ " $cases " != *" $CASE "* ]]; then
    echo "unknown case '$CASE' (${cases// /|})" >&2
    exit 2
  fi
  TEST_NAME=$prefix.$CASE
  resolve_build_dir "$1"
}

require_softrdma_built() {
  [[ -x "$SOFTRDMA" ]] || fail "$SOFTRDMA not built (build the 'softrdma' target)"
  [[ -e "$BUILD_DIR/lib/libibverbs.so.1" ]] || fail "$BUILD_DIR/lib/libibverbs.so.1 not built"
}

# shellcheck disable=SC2317  # called through the trap
# Keeps the script's own exit status: without the final exit, a script that simply ended
# would exit with the status of the trap's last command (e.g. a `[[ … ]] &&` in on_exit).
_test_lib_exit() {
  local rc=$?
  if declare -F on_exit >/dev/null; then on_exit || true; fi
  [[ -n "${WORK:-}" ]] && rm -rf "$WORK"
  exit "$rc"
}

make_work_dir() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || { echo "FAIL: mktemp" >&2; exit 1; }
  trap _test_lib_exit EXIT
}

show_logs() {
  local f
  for f in "$@"; do
    echo "----- $(basename "$f") -----" >&2
    cat "$f" >&2
  done
  echo "-----" >&2
}

# Reads /proc instead of connecting: ibv_rc_pingpong's and perftest's servers accept exactly
# one connection.
tcp_listening() {
  local hex
  hex=$(printf ':%04X' "$1")
  awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 }
                   END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

wait_for_listener() {
  local port=$1 pid=$2 seconds=$3 log=$4 waited=0 rc
  until tcp_listening "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      rc=$?
      show_logs "$log"
      fail "server exited ($(status_text $rc)) before listening on TCP port $port"
    fi
    if ((waited >= seconds * 10)); then
      show_logs "$log"
      fail "server not listening on TCP port $port after $seconds s"
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

# The RDMA-CM has no socket to find in /proc: its "listening on" log line (cm/cm_id.cpp) says
# when a REQ would find the listener. cm_listen_re ADDR PORT: that line's extended regexp.
cm_listen_re() {
  echo "listening on (${1//./\\.}|0\\.0\\.0\\.0):$2 "
}
wait_for_cm_listener() {
  local addr=$1 port=$2
  wait_for_log_line "$(cm_listen_re "$addr" "$port")" "$3" "$4" "$5" \
    "its RDMA-CM listens on $addr:$port"
}

# wait_for_log_line RE PID SECONDS LOG WHAT: waits until LOG has a line matching the extended
# regexp RE; fails naming WHAT if process PID exits first or SECONDS pass.
wait_for_log_line() {
  local re=$1 pid=$2 seconds=$3 log=$4 what=$5 waited=0 rc
  until grep -qE "$re" "$log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      rc=$?
      show_logs "$log"
      fail "server exited ($(status_text $rc)) before this happened: $what"
    fi
    if ((waited >= seconds * 10)); then
      show_logs "$log"
      fail "server: after $seconds s, still not: $what"
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

status_text() {
  local rc=$1
  echo -n "status $rc"
  if ((rc == 124 || rc == 137)); then echo -n " (timed out after ${STEP_TIMEOUT:-?}s)"; fi
}

# Seconds a process of an ASan build spends at exit in LeakSanitizer's scan of its memory
# (0 in other builds, or with detect_leaks=0). Measured for perftest and kv-bench ending on a
# dead peer beside a 2-core build: 1.0-2.1 s past the 0.1-0.3 s the same exit takes without
# the scan (peer_death.kill_* failed in a loaded clone at 2.39 s with the error logged at
# once). The allowance is 4x that, still far below the 30 s run that a missed death shows as.
leak_scan_s() {
  if [[ -n ${SOFTRDMA:-} && $(ldd "$SOFTRDMA" 2>/dev/null) == *libasan* &&
    ${ASAN_OPTIONS:-} != *detect_leaks=0* ]]; then
    echo 8
  else
    echo 0
  fi
}

# shellcheck disable=SC2034  # KILLED_AT, TOOK and RC are for the caller
kill_and_wait_exit() {
  local victim=$1 pid=$2 seconds=$3 log=$4 what=$5 t0 bound
  bound=$(awk -v s="$seconds" -v l="$(leak_scan_s)" 'BEGIN { print s + l }')
  kill -9 "$victim"
  t0=$(date +%s.%N)
  KILLED_AT=$t0
  # The kill's wall-clock time, in the format of softrdma's log lines, so that a failure shows
  # how long the peer took to notice the death and how long it then took to exit.
  echo "killed $victim at $(date -d "@$t0" +%T.%6N)"
  _since() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
  # One wait may last longer by design: a same-host sender killed in the few instructions
  # between taking a pin on our memory and recording it leaks that pin, and deregistering the
  # region waits for it kWithdrawWaitNs (2 s, net/shm_placement.h) before going on — logged
  # as "… still pinned it after 2 s". With that line, and only then, the bound grows by those
  # 2 s; a hang still shows (before the fixes the survivors waited 60–120 s).
  local grown=0
  while kill -0 "$pid" 2>/dev/null && awk -v t="$(_since)" -v s="$bound" 'BEGIN { exit !(t < s) }'; do
    if ((!grown)) && grep -q "same-host writer(s) still pinned it after" "$log" 2>/dev/null; then
      bound=$(awk -v b="$bound" 'BEGIN { print b + 2 }')
      grown=1
      echo "the survivor waited out a leaked same-host pin (logged): bound now $bound s"
    fi
    sleep 0.05
  done
  TOOK=$(_since)
  if kill -0 "$pid" 2>/dev/null; then
    show_logs "$log"
    fail "$what still runs $TOOK s after its peer was killed (a hang)"
  fi
  RC=0
  wait "$pid" || RC=$?
}

# shellcheck disable=SC2034  # LOGGED_LINE is for the caller
require_logged_within() {
  local log=$1 pattern=$2 seconds=$3 what=$4 line stamp at delay
  line=$(grep -m1 -E "$pattern" "$log")
  [[ -n $line ]] || { show_logs "$log"; fail "no line of $what's log matches '$pattern'"; }
  echo "$line"
  LOGGED_LINE=$line
  stamp=$(awk '{ print $3 }' <<<"$line")
  at=$(date -d "$(date -d "@${KILLED_AT%.*}" +%F) $stamp" +%s.%N 2>/dev/null) ||
    { show_logs "$log"; fail "'$stamp' in $what's log is not a time of day"; }
  # Logged after midnight, killed before it: the stamp is of the next day.
  delay=$(awk -v a="$KILLED_AT" -v b="$at" 'BEGIN { d = b - a; if (d < -43200) d += 86400; printf "%.2f", d }')
  echo "$what logged it $delay s after the kill"
  awk -v d="$delay" -v s="$seconds" 'BEGIN { exit !(d <= s) }' ||
    { show_logs "$log"; fail "$what logged the dead peer $delay s after the kill (bound $seconds s)"; }
}

# Sanitizer builds (`softrdma run` preloads the ASan runtime): perftest 4.5 frees little
# of its own memory on exit (its parameter/context buffers, asprintf'd strings, and the
# ibv_get_device_list() array, it never calls ibv_free_device_list), which LeakSanitizer
# reports and turns into a nonzero exit status. Suppress only leaks whose allocation stack
# passes through a perftest binary or glibc's vasprintf (whose caller the unwinder loses;
# softrdma does not use it); leaks from softrdma's own threads are still reported.
no_leak_checks_under_asan() {
  # Not `ldd | grep -q`: under pipefail, grep -q exiting at the first match leaves ldd to die
  # of SIGPIPE (141) in ~3 % of calls, and the test then ran with leak checks on (tdf.preload
  # and dapl.two_addresses aborted in CI on their programs' own leaks).
  if [[ $(ldd "$SOFTRDMA" 2>/dev/null) == *libasan* ]]; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  fi
}

suppress_perftest_leaks() {
  printf '%s\n' 'leak:/usr/bin/ib_' 'leak:__vasprintf_internal' >"$WORK/lsan.supp"
  export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$WORK/lsan.supp:print_suppressions=0"
}
