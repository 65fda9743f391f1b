#!/usr/bin/env bash
# Command-line behaviour of the softrdma tool.
#
#   cli_test.sh BUILD_DIR
#
# run:  bad --addr / --netem / --wan / --log and a missing program are usage errors (exit 2, with a
#       message); `run -- true` works; `run -- /nonexistent` exits 127 naming the program;
#       the options reach the program's environment and LD_LIBRARY_PATH starts with the
#       drop-in's directory; PROGRAM's own options after `--` are left alone.
#       `run` preloads libsoftrdma_sysfs.so (not with --no-sysfs); `run --rsockets` preloads
#       libsoftrdma_rspreload_shim.so and Debian's librspreload.so.
# sysfs: --create DIR writes srdma0's tree there; a bad --addr (or list entry) or no --create is
#       a usage error (two devices: verbs/sysfs/tests/two_devices_test.sh).
# params: lists the registry (all groups, one group, Markdown); an unknown group is a usage
#       error.
# stat: with nothing published it says so and exits 0; a live device (an ibv_rc_pingpong
#       server waiting for its client) is listed with its counters (nonzero by default,
#       all with --all, JSON with --json); after the process is killed its file is shown as
#       dead and `stat --clean` removes it. The dead-file part works on a copy in a private
#       directory (--dir) so that it never touches other processes' files.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
resolve_build_dir "$1"
[[ -x "$SOFTRDMA" ]] || fail "$SOFTRDMA not built"

make_work_dir softrdma-cli
SERVER_PID="" DEV_PID=""
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  if [[ -n "$DEV_PID" ]]; then
    kill -KILL "$DEV_PID" 2>/dev/null
    rm -f "/dev/shm/softrdma.127.0.0.120.$DEV_PID"
  fi
  if [[ -n "$SERVER_PID" ]]; then
    kill -TERM "$SERVER_PID" 2>/dev/null  # timeout passes it on to its child
    wait "$SERVER_PID" 2>/dev/null
  fi
}

FAILURES=0
OUT="" ERR="" RC=0

# Runs softrdma with the given arguments; sets OUT, ERR and RC.
sr() {
  RC=0
  timeout -k 5 60 "$SOFTRDMA" "$@" >"$WORK/out" 2>"$WORK/err" || RC=$?
  OUT=$(<"$WORK/out")
  ERR=$(<"$WORK/err")
}

bad() {
  echo "FAIL: $*" >&2
  echo "  stdout: $OUT" >&2
  echo "  stderr: $ERR" >&2
  FAILURES=$((FAILURES + 1))
}
ok() { echo "ok: $*"; }

# expect_status WANT DESCRIPTION [REGEX-ON-STDERR]
expect_status() {
  local want=$1 what=$2 pattern=${3:-}
  if [[ $RC -ne $want ]]; then
    bad "$what: exit status $RC, expected $want"
  elif [[ -n $pattern ]] && ! grep -Eq -- "$pattern" <<<"$ERR"; then
    bad "$what: stderr does not match /$pattern/"
  else
    ok "$what (exit $RC)"
  fi
}

# ---- run: usage errors ------------------------------------------------------------------
sr run --addr 300.1.2.3 -- true
expect_status 2 "run --addr 300.1.2.3" "--addr: '300\.1\.2\.3' is not a usable IPv4 address"
sr run --addr not-an-ip -- true
expect_status 2 "run --addr not-an-ip" "not-an-ip.*not a usable IPv4 address"
sr run --addr 0.0.0.0 -- true
expect_status 2 "run --addr 0.0.0.0" "not a usable IPv4 address"
sr run --netem loss=abc -- true
expect_status 2 "run --netem loss=abc" "--netem: 'loss=abc'"
sr run --netem bogus=1 -- true
expect_status 2 "run --netem bogus=1" "--netem: 'bogus=1'"
sr run --log chatty -- true
expect_status 2 "run --log chatty" "--log"
sr run --no-such-option -- true
expect_status 2 "run --no-such-option" "no-such-option"
sr run
expect_status 2 "run without a program" "PROGRAM"
sr
expect_status 2 "no subcommand" "subcommand"

# ---- run: success, exec failure, environment ---------------------------------------------
sr run -- true
expect_status 0 "run -- true"
sr run -- false
expect_status 1 "run -- false passes the program's exit status"
sr run --addr 127.0.0.9 --netem "loss=5%,every=13,seed=42" --log debug -- true
expect_status 0 "run with every option -- true"
sr run -- /nonexistent
expect_status 127 "run -- /nonexistent" "cannot execute '/nonexistent'"
sr run -- no-such-program-softrdma-test
expect_status 127 "run -- no-such-program (PATH search)" "no-such-program-softrdma-test"

sr run --transport tcp -- true
expect_status 2 "run --transport tcp" "--transport"
sr run --wan "delay=fast" -- true
expect_status 2 "run --wan delay=fast" "--wan: 'delay=fast'"
sr run --wan "delay=10ms,loss=0.1%" -- env
expect_status 0 "run --wan SPEC -- env"
grep -qx "SOFTRDMA_WAN=delay=10ms,loss=0.1%" <<<"$OUT" || bad "SOFTRDMA_WAN not exported"
sr run --addr 127.0.0.9 --netem "every=7" --log info --transport udp -- env
expect_status 0 "run -- env"
grep -qx "SOFTRDMA_TRANSPORT=udp" <<<"$OUT" || bad "SOFTRDMA_TRANSPORT not exported"
want_lib="$(cd "$BUILD_DIR/lib" && pwd -P)"
grep -qx "SOFTRDMA_ADDR=127.0.0.9" <<<"$OUT" || bad "SOFTRDMA_ADDR not exported"
grep -qx "SOFTRDMA_NETEM=every=7" <<<"$OUT" || bad "SOFTRDMA_NETEM not exported"
grep -qx "SOFTRDMA_LOG=info" <<<"$OUT" || bad "SOFTRDMA_LOG not exported"
grep -Eq "^LD_LIBRARY_PATH=$want_lib(:|$)" <<<"$OUT" ||
  bad "LD_LIBRARY_PATH does not start with $want_lib"
LD_LIBRARY_PATH=/opt/x sr run -- env
grep -Eq "^LD_LIBRARY_PATH=$want_lib:/opt/x$" <<<"$OUT" ||
  bad "an inherited LD_LIBRARY_PATH is not kept after the drop-in's directory"
SOFTRDMA_ADDR=127.0.0.77 sr run -- env
grep -qx "SOFTRDMA_ADDR=127.0.0.77" <<<"$OUT" || bad "inherited SOFTRDMA_ADDR not left alone"
want_sysfs="$want_lib/libsoftrdma_sysfs.so"
# In a sanitizer build the ASan runtime comes first (it must be the first library loaded).
grep -Eq "^LD_PRELOAD=([^:]*/libasan\.so[^:]*:)?$want_sysfs(:|$)" <<<"$OUT" ||
  bad "LD_PRELOAD does not start with $want_sysfs (after the ASan runtime, if any)"
sr run --no-sysfs -- env
grep -q "libsoftrdma_sysfs" <<<"$OUT" && bad "run --no-sysfs still preloads libsoftrdma_sysfs.so"
# --rsockets: the shim, then Debian's librspreload (not under ASan: the ASan runtime in front
# of librspreload deadlocks before main; docs/rdma-cm.md "rsockets", ctests rsocket.*).
if [[ $(ldd "$SOFTRDMA" 2>/dev/null) != *libasan* ]]; then  # not `| grep -q`: SIGPIPE under pipefail
  sr run --rsockets --no-sysfs -- env
  grep -Eq "^LD_PRELOAD=$want_lib/libsoftrdma_rspreload_shim\.so:/usr/lib/x86_64-linux-gnu/rsocket/librspreload\.so(:|$)" <<<"$OUT" ||
    bad "run --rsockets does not preload libsoftrdma_rspreload_shim.so, then librspreload.so"
fi
ok "environment set up for the program"

sr run -- printf '%s|' --addr -x -- --help
[[ $RC -eq 0 && $OUT == "--addr|-x|--|--help|" ]] || bad "arguments after PROGRAM are not passed through"
sr run printf '%s|' --log
[[ $RC -eq 0 && $OUT == "--log|" ]] || bad "run PROGRAM without -- does not pass its options"
ok "program arguments passed through"

# ---- help ---------------------------------------------------------------------------------
for args in "--help" "run --help" "stat --help"; do
  # shellcheck disable=SC2086
  sr $args
  if [[ $RC -ne 0 || -z $OUT ]]; then bad "softrdma $args"; fi
done
sr run --help
grep -q -- "--addr" <<<"$OUT" && grep -q -- "--netem" <<<"$OUT" && grep -q -- "--log" <<<"$OUT" ||
  bad "run --help does not document --addr/--netem/--log"
sr --help
grep -q "SOFTRDMA_SPIN_US" <<<"$OUT" || bad "--help does not list the device's variables"
ok "help"

# ---- params: the registry (base/params.h) -------------------------------------------------
sr params
[[ $RC -eq 0 ]] && grep -q "^  SOFTRDMA_ADDR  " <<<"$OUT" && grep -q "^  SOFTRDMA_CCL_DEPTH  " <<<"$OUT" ||
  bad "params does not list the device's and the collectives' variables"
sr params --markdown ccl
[[ $RC -eq 0 && $OUT == "| variable | default | accepted | meaning |"* ]] ||
  bad "params --markdown ccl is not the docs' table"
grep -q "SOFTRDMA_ADDR" <<<"$OUT" && bad "params ccl lists a device variable"
sr params tcp
expect_status 2 "params tcp" "GROUP"
ok "params"

# ---- sysfs --create: the tree as files ------------------------------------------------------
sr sysfs --create "$WORK/tree" --addr 127.0.0.9
[[ $RC -eq 0 && $(<"$WORK/tree/sys/class/infiniband/srdma0/node_guid") == 0200:7fff:fe00:0009 &&
  -L "$WORK/tree/dev/infiniband/uverbs0" &&
  $(<"$WORK/tree/sys/class/infiniband_verbs/uverbs0/ibdev") == srdma0 ]] ||
  bad "sysfs --create did not write srdma0's tree"
grep -q "mknod /dev/infiniband/uverbs0 c 231 192" <<<"$OUT" || bad "sysfs --create prints no mount lines"
sr sysfs --create "$WORK/tree2" --addr 300.1.1.1
expect_status 2 "sysfs --addr 300.1.1.1" "--addr"
sr sysfs --create "$WORK/tree2" --addr 127.0.0.9,nope
expect_status 2 "sysfs --addr 127.0.0.9,nope" "--addr"
sr sysfs
expect_status 2 "sysfs without --create" "--create"
ok "sysfs --create"

# ---- stat with nothing published ----------------------------------------------------------
mkdir -p "$WORK/empty"
sr stat --dir "$WORK/empty"
[[ $RC -eq 0 && $OUT == "no softrdma devices are open" ]] ||
  bad "stat with nothing published: expected 'no softrdma devices are open', exit 0"
sr stat --dir "$WORK/empty" --json
[[ $RC -eq 0 ]] && grep -q '"devices": \[\]' <<<"$OUT" || bad "stat --json with nothing published"
sr stat --dir "$WORK/empty" --clean
[[ $RC -eq 0 ]] || bad "stat --clean with nothing published"
# The real directory: other tests may have devices open, so only the exit status counts.
sr stat
[[ $RC -eq 0 ]] || bad "stat on /dev/shm"
sr stat --all --clean
expect_status 2 "stat --all --clean" "excludes"
ok "stat with nothing open"

# ---- stat with a live device, then a dead one ------------------------------------------------
if [[ ! -x /usr/bin/ibv_rc_pingpong ]]; then
  bad "/usr/bin/ibv_rc_pingpong is missing: install Debian's ibverbs-utils (bash scripts/deps.sh)"
else
  # A pingpong server opens srdma0, creates its QP and waits for a client: a live device.
  timeout -k 5 60 "$SOFTRDMA" run --addr 127.0.0.120 -- /usr/bin/ibv_rc_pingpong -g 0 -p 18620 \
    >"$WORK/server.log" 2>&1 &
  SERVER_PID=$!  # timeout's pid; softrdma execs, so the device belongs to its child
  shm=""
  for _ in $(seq 200); do
    shm=$(ls /dev/shm/softrdma.127.0.0.120.* 2>/dev/null | head -n1)
    [[ -n $shm ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $shm ]]; then
    bad "no /dev/shm/softrdma.127.0.0.120.* published by a pingpong server: $(cat "$WORK/server.log")"
  else
    dev_pid=${shm##*.}
    DEV_PID=$dev_pid
    sr stat
    grep -Eq "^srdma0 127\.0\.0\.120 pid $dev_pid alive" <<<"$OUT" ||
      bad "stat does not list 127.0.0.120 pid $dev_pid alive"
    sr stat --all
    grep -Eq "^ +sent_pkts +[0-9]+$" <<<"$OUT" && grep -Eq "^ +send_err +[0-9]+$" <<<"$OUT" ||
      bad "stat --all does not list every counter as 'name value'"
    sr stat --json
    grep -q '"address": "127.0.0.120"' <<<"$OUT" && grep -q '"sent_pkts":' <<<"$OUT" ||
      bad "stat --json does not show the device and its counters"
    if command -v python3 >/dev/null; then
      python3 -c 'import json,sys; json.load(sys.stdin)' <<<"$OUT" || bad "stat --json is not JSON"
    fi
    ok "stat lists a live device"

    # Keep a copy in a private directory, kill the server (SIGKILL: no cleanup), and let
    # stat find the copy dead and --clean remove it.
    mkdir -p "$WORK/shm"
    cp "$shm" "$WORK/shm/"
    kill -KILL "$dev_pid" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
    SERVER_PID="" DEV_PID=""
    rm -f "$shm"  # our own dead server's file
    sr stat --dir "$WORK/shm"
    grep -Eq "^srdma0 127\.0\.0\.120 pid $dev_pid dead" <<<"$OUT" ||
      bad "stat does not show the killed process's device as dead"
    sr stat --dir "$WORK/shm" --clean
    [[ $RC -eq 0 ]] && grep -q "removed $WORK/shm/softrdma.127.0.0.120.$dev_pid" <<<"$OUT" ||
      bad "stat --clean does not report the removal"
    [[ -z "$(ls -A "$WORK/shm")" ]] || bad "stat --clean left the dead file behind"
    sr stat --dir "$WORK/shm"
    [[ $OUT == "no softrdma devices are open" ]] || bad "stat after --clean"
    ok "stat shows dead devices and --clean removes them"
  fi
fi

if ((FAILURES)); then
  echo "FAIL: $FAILURES check(s) failed" >&2
  exit 1
fi
echo "PASS: cli_test"
