#!/usr/bin/env bash
# Runs Debian's unmodified rdmacm-utils programs (librdmacm users) between two processes over
# softrdma's librdmacm.so.1 and libibverbs.so.1, through `softrdma run`.
#
#   rdmacm_test.sh BUILD_DIR CASE
#
# CASE (server, then client; S and C are the case's two addresses, P its port):
#   rping          rping -s -a S -p P -C 100 -V / rping -c -a S -p P -C 100 -V -v
#                  (SEND + RDMA READ/WRITE each iteration, data validated; the client prints
#                  100 "ping data" lines)
#   ucmatose       ucmatose -b S -p P / ucmatose -s S -p P           (RC, SEND/RECV)
#   ucmatose_many  the same with -c 8 -C 50: eight connections at once, 50 messages each
#   udaddy         udaddy -b S / udaddy -s S                         (UD: SIDR, port 7174 fixed)
#   rdma_server    rdma_server -s S -p P / rdma_client -s S -p P     (synchronous endpoints)
#   rdma_xserver   rdma_xserver -p P / rdma_xclient -s S -p P        (RC, wildcard listen)
#   rdma_xserver_xrc  the same with -c x                             (XRC)
#   no_listener    ucmatose -s to a port nobody listens on (rping -s listens on another one
#                  there): the REQ is answered with REJ "invalid service ID", ucmatose
#                  reports RDMA_CM_EVENT_REJECTED with status 8 and fails — quickly
#   peer_stopped   the server (rping -s) is stopped (SIGSTOP) after listening: its CM answers
#                  nothing, the client's REQ times out after its retries
#                  (SOFTRDMA_CM_RESPONSE_TIMEOUT=10, SOFTRDMA_CM_RETRIES=2) and ucmatose
#                  reports RDMA_CM_EVENT_UNREACHABLE with status -110 (-ETIMEDOUT) — never a hang
#   no_device      ucmatose -s to an address where no RoCEv2 endpoint lives:
#                  RDMA_CM_EVENT_ADDR_ERROR with status -113 (-EHOSTUNREACH), at once
#                  (The three failure cases run ucmatose, not rping: rping 44's CM thread calls
#                  exit() on the failure event while its main thread tears down and returns
#                  from main — two exit() at once, which glibc 2.36 does not survive
#                  reliably, whatever the RDMA stack: docs/rdma-cm.md, "exit() beside a call
#                  in progress". ucmatose fails from its one thread.)
#   foreign_verbs  rping with softrdma's librdmacm.so.1 but Debian's libibverbs.so.1: it must
#                  fail at once, saying it needs softrdma's libibverbs
#   shared_rping   rping -s and rping -c -C 20 -V both at ONE address (two processes sharing
#                  one device address: docs/rdma-cm.md, "Several processes on one address")
#   shared_ucmatose  ucmatose -b S / ucmatose -s S -c 4 -C 20, both at S
#   shared_udaddy  udaddy -b S / udaddy -s S, both at S (UD: SIDR, QP1 MADs between them)
#   shared_port_taken  a second rping -s on the port another process at the same address
#                  listens on fails at once with EADDRINUSE ("Address already in use")
#   mckey          UD multicast: a receiver `mckey -m G -b S -C 20 -S 1000` joins group G, then a
#                  sender `mckey -m G -b C -s -C 20 -S 1000` joins and sends 20 datagrams to
#                  the group; the receiver must get all 20 ("return status 0" on both sides)
#   mckey_sendonly the same with the sender joining as a send-only full member (-o)
#   shared_mckey   receiver and sender at ONE address (two processes sharing it; each has its
#                  own socket on the group)
#   capture        rping -C 1 with both sides' packets captured (softrdma run --pcap):
#                  tshark must decode the CM MADs on QP1 — REQ (service ID 0x01060000|P, the
#                  annex A11 IP CM header's addresses and port), REP, RTU, DREQ, DREP
#
# Each case uses its own 127.0.63.x addresses and RDMA-CM port 1830x, so ctest may run them
# in parallel. A server is started first; the script waits for softrdma's CM to log that it
# listens (`softrdma run --log info`), then runs the client. Both are bounded by `timeout`.
# A missing /usr/bin program is a failure (install rdmacm-utils: scripts/deps.sh), never a skip.
set -uo pipefail

CASES="rping ucmatose ucmatose_many udaddy rdma_server rdma_xserver rdma_xserver_xrc no_listener peer_stopped"
CASES+=" no_device capture foreign_verbs shared_rping shared_ucmatose shared_udaddy shared_port_taken"
CASES+=" mckey mckey_sendonly shared_mckey"

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
case_test_args rdmacm "$CASES" "$@"
STEP_TIMEOUT=${RDMACM_TIMEOUT:-60}
LISTEN_WAIT=30

N="" PORT=""
case "$CASE" in
  rping) N=1 ;;
  ucmatose) N=2 ;;
  udaddy) N=3 ;;
  rdma_server) N=4 ;;
  rdma_xserver) N=5 ;;
  rdma_xserver_xrc) N=6 ;;
  no_listener) N=7 ;;
  peer_stopped) N=8 ;;
  no_device) N=9 ;;
  capture) N=10 ;;
  ucmatose_many) N=11 ;;
  foreign_verbs) N=12 ;;
  mckey) N=13 ;;
  mckey_sendonly) N=14 ;;
esac
S=127.0.63.$((2 * N - 1))
C=127.0.63.$((2 * N))
PORT=$((18300 + N))
# The shared-address cases: one address each in 127.0.81.0/24, ports 1781x.
case "$CASE" in
  shared_rping) S=127.0.81.11 PORT=17811 ;;
  shared_ucmatose) S=127.0.81.12 PORT=17812 ;;
  shared_udaddy) S=127.0.81.13 ;;
  shared_port_taken) S=127.0.81.14 PORT=17814 ;;
  shared_mckey) S=127.0.81.15 N=15 ;;
esac
# The multicast cases' groups: 239.63.0.N.
GROUP=239.63.0.${N:-0}
[[ $CASE == shared_* ]] && C=$S

require_softrdma_built
[[ -e "$BUILD_DIR/lib/librdmacm.so.1" ]] || fail "$BUILD_DIR/lib/librdmacm.so.1 not built"
need_tool() {
  [[ -x "/usr/bin/$1" ]] ||
    fail "/usr/bin/$1 is missing: install Debian's rdmacm-utils" \
      "(apt-get install rdmacm-utils, or run: bash scripts/deps.sh)"
}

make_work_dir "softrdma-rdmacm-$CASE"
SLOG="$WORK/server.log"
CLOG="$WORK/client.log"
SERVER_PID=""
CLIENT_OPTS=()
SERVER_OPTS=()
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  if [[ -n "$SERVER_PID" ]]; then
    [[ -n ${rping_pid:-} ]] && kill -CONT "$rping_pid" 2>/dev/null
    kill "$SERVER_PID" 2>/dev/null
  fi
}

# start_server ADDR PROGRAM ARGS...: runs the server in the background, waits until its CM
# listens on ADDR:LISTEN_PORT (default PORT; udaddy's is 7174) or the wildcard — or, with
# READY_RE set, until its log has a line matching READY_RE.
start_server() {
  local addr=$1
  shift
  need_tool "$1"
  echo "server: softrdma run --addr $addr ${SERVER_OPTS[*]} -- $*"
  # stdbuf: line-buffered stdout, so a log killed by timeout still shows how far it got.
  timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$addr" --log info "${SERVER_OPTS[@]}" -- \
    stdbuf -oL "$@" >"$SLOG" 2>&1 &
  SERVER_PID=$!
  if [[ -n ${READY_RE:-} ]]; then
    wait_for_log_line "$READY_RE" "$SERVER_PID" "$LISTEN_WAIT" "$SLOG" "a line matching '$READY_RE'"
    return
  fi
  local port=${LISTEN_PORT:-$PORT}
  [[ $1 == udaddy ]] && port=7174
  wait_for_cm_listener "$addr" "$port" "$SERVER_PID" "$LISTEN_WAIT" "$SLOG"
}

# run_client ADDR PROGRAM ARGS...: runs the client in the foreground; sets CRC.
run_client() {
  local addr=$1
  shift
  need_tool "$1"
  echo "client: softrdma run --addr $addr ${CLIENT_OPTS[*]} -- $*"
  CRC=0
  timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$addr" "${CLIENT_OPTS[@]}" -- \
    stdbuf -oL "$@" >"$CLOG" 2>&1 || CRC=$?
}

# wait_server: waits for the server (bounded by its own timeout); sets SRC.
wait_server() {
  SRC=0
  wait "$SERVER_PID" || SRC=$?
  SERVER_PID=""
}

# expect_ok: both sides exited 0 and their logs have the given lines (extended regexps).
expect_ok() {
  local server_re=$1 client_re=$2 ok=1
  ((SRC == 0)) || { echo "server exited with $(status_text $SRC)" >&2; ok=0; }
  ((CRC == 0)) || { echo "client exited with $(status_text $CRC)" >&2; ok=0; }
  [[ -z $server_re ]] || grep -qE "$server_re" "$SLOG" || { echo "server: no line matching '$server_re'" >&2; ok=0; }
  [[ -z $client_re ]] || grep -qE "$client_re" "$CLOG" || { echo "client: no line matching '$client_re'" >&2; ok=0; }
  if ((!ok)); then
    show_logs "$SLOG" "$CLOG"
    fail "$CASE"
  fi
}

# client_fails_with RE SECONDS: the client failed (non-zero, not a timeout), printed RE, and
# took at most SECONDS.
client_fails_with() {
  local re=$1 bound=$2 took=$3
  local ok=1
  ((CRC != 0 && CRC != 124 && CRC != 137)) || { echo "client: $(status_text $CRC), expected a failure of its own" >&2; ok=0; }
  grep -qE "$re" "$CLOG" || { echo "client: no line matching '$re'" >&2; ok=0; }
  ((took <= bound)) || { echo "client took ${took}s, expected at most ${bound}s" >&2; ok=0; }
  if ((!ok)); then
    show_logs "$SLOG" "$CLOG"
    fail "$CASE"
  fi
}

t0=$SECONDS
case "$CASE" in
  rping)
    start_server "$S" rping -s -a "$S" -p "$PORT" -C 100 -V
    run_client "$C" rping -c -a "$S" -p "$PORT" -C 100 -V -v
    wait_server
    expect_ok "" "ping data: rdma-ping-99: "
    n=$(grep -c "ping data: rdma-ping-" "$CLOG")
    ((n == 100)) || { show_logs "$CLOG"; fail "client printed $n ping lines, expected 100"; }
    ;;
  ucmatose | ucmatose_many | shared_ucmatose)
    more=()
    [[ $CASE == ucmatose_many ]] && more=(-c 8 -C 50)
    [[ $CASE == shared_ucmatose ]] && more=(-c 4 -C 20)
    start_server "$S" ucmatose -b "$S" -p "$PORT" "${more[@]}"
    run_client "$C" ucmatose -s "$S" -p "$PORT" "${more[@]}"
    wait_server
    expect_ok "^return status 0$" "^return status 0$"
    ;;
  udaddy | shared_udaddy)  # (C is S for the shared case)
    start_server "$S" udaddy -b "$S"
    run_client "$C" udaddy -s "$S"
    wait_server
    expect_ok "^return status 0$" "^return status 0$"
    ;;
  rdma_server)
    start_server "$S" rdma_server -s "$S" -p "$PORT"
    run_client "$C" rdma_client -s "$S" -p "$PORT"
    wait_server
    expect_ok "^rdma_server: end 0$" "^rdma_client: end 0$"
    ;;
  rdma_xserver | rdma_xserver_xrc)
    type=r
    [[ $CASE == rdma_xserver_xrc ]] && type=x
    start_server "$S" rdma_xserver -p "$PORT" -c "$type"
    run_client "$C" rdma_xclient -s "$S" -p "$PORT" -c "$type"
    wait_server
    expect_ok "rdma_xserver: end 0$" "rdma_xclient: end 0$"
    ;;
  no_listener)
    LISTEN_PORT=$((PORT + 50))
    start_server "$S" rping -s -a "$S" -p "$LISTEN_PORT"
    t1=$SECONDS
    run_client "$C" ucmatose -s "$S" -p "$PORT" -C 1
    client_fails_with "event: RDMA_CM_EVENT_REJECTED, error: 8$" 10 $((SECONDS - t1))
    ;;
  peer_stopped)
    start_server "$S" rping -s -a "$S" -p "$PORT"
    # SERVER_PID is `timeout`; rping (softrdma run and stdbuf exec into it) is its child.
    rping_pid=$(pgrep -P "$SERVER_PID" | head -1)
    [[ -n $rping_pid ]] || fail "cannot find the server's rping process"
    kill -STOP "$rping_pid"
    t1=$SECONDS
    export SOFTRDMA_CM_RESPONSE_TIMEOUT=10 SOFTRDMA_CM_RETRIES=2
    run_client "$C" ucmatose -s "$S" -p "$PORT" -C 1
    client_fails_with "event: RDMA_CM_EVENT_UNREACHABLE, error: -110$" 20 $((SECONDS - t1))
    ;;
  no_device)
    t1=$SECONDS
    run_client "$C" ucmatose -s "$S" -p "$PORT" -C 1
    client_fails_with "event: RDMA_CM_EVENT_ADDR_ERROR, error: -113$" 10 $((SECONDS - t1))
    ;;
  foreign_verbs)
    need_tool rping
    mkdir -p "$WORK/lib"
    ln -s "$BUILD_DIR/lib/librdmacm.so.1" "$WORK/lib/librdmacm.so.1"  # and no libibverbs
    # A sanitizer build's library needs the ASan runtime loaded first (what `softrdma run`
    # does for it), or the loader refuses before our check can speak.
    asan=$(ldd "$BUILD_DIR/lib/librdmacm.so.1" | awk '/libasan\.so/ {print $3; exit}')
    CRC=0
    LD_PRELOAD="${asan}" LD_LIBRARY_PATH="$WORK/lib" timeout -k 5 "$STEP_TIMEOUT" \
      rping -s -a "$S" -p "$PORT" -C 1 >"$CLOG" 2>&1 || CRC=$?
    client_fails_with "needs softrdma's libibverbs.so.1" 10 $((SECONDS - t0))
    ;;
  shared_rping)
    start_server "$S" rping -s -a "$S" -p "$PORT" -C 20 -V
    CLIENT_OPTS=(--log info)
    run_client "$S" rping -c -a "$S" -p "$PORT" -C 20 -V -v
    wait_server
    expect_ok "" "ping data: rdma-ping-19: "
    n=$(grep -c "ping data: rdma-ping-" "$CLOG")
    ((n == 20)) || { show_logs "$CLOG"; fail "client printed $n ping lines, expected 20"; }
    grep -q "shares $S with the process that owns it" "$CLOG" ||
      { show_logs "$CLOG"; fail "the client did not join the server's address"; }
    ;;
  mckey | mckey_sendonly | shared_mckey)
    # The receiver prints "receiving data transfers" once it has joined and posted its
    # receives; datagrams sent before that would find no receive (UD drops them).
    READY_RE="^receiving data transfers"
    start_server "$S" mckey -m "$GROUP" -b "$S" -C 20 -S 1000
    more=() kind="full member"
    [[ $CASE == mckey_sendonly ]] && more=(-o) kind=send-only
    CLIENT_OPTS=(--log info)
    run_client "$C" mckey -m "$GROUP" -b "$C" -s -C 20 -S 1000 "${more[@]}"
    wait_server
    expect_ok "^data transfers complete" "^data transfers complete"
    grep -qF "joined multicast group $GROUP ($kind)" "$CLOG" ||
      { show_logs "$CLOG"; fail "the sender's join is not logged as expected"; }
    ;;
  shared_port_taken)
    start_server "$S" rping -s -a "$S" -p "$PORT"
    t1=$SECONDS
    run_client "$S" rping -s -a "$S" -p "$PORT"
    client_fails_with "Address already in use" 10 $((SECONDS - t1))
    ;;
  capture)
    command -v tshark >/dev/null || fail "tshark is missing: install Debian's tshark (scripts/deps.sh)"
    CLIENT_OPTS=(--pcap "$WORK/client.pcap")
    SERVER_OPTS=(--pcap "$WORK/server.pcap")
    start_server "$S" rping -s -a "$S" -p "$PORT" -C 1
    run_client "$C" rping -c -a "$S" -p "$PORT" -C 1
    wait_server
    expect_ok "" ""
    for side in client server; do
      tshark -r "$WORK/$side.pcap" -Y infiniband.mad -T fields -e infiniband.mad.attributeid \
        >>"$WORK/attrs" 2>"$WORK/tshark.err" || { cat "$WORK/tshark.err" >&2; fail "tshark failed"; }
    done
    for a in 0x0010 0x0013 0x0014 0x0015 0x0016; do
      grep -qx "$a" "$WORK/attrs" ||
        { cat "$WORK/attrs" >&2; fail "tshark decoded no CM MAD with attribute ID $a"; }
    done
    req=$(tshark -r "$WORK/client.pcap" -Y infiniband.cm.req -T fields -E separator=' ' \
      -e infiniband.cm.req.serviceid -e infiniband.cm.req.ip_cm.sip4 \
      -e infiniband.cm.req.ip_cm.dip4 -e infiniband.bth.destqp 2>/dev/null | head -1)
    want=$(printf '0x%016x %s %s 0x000001' $((0x01060000 + PORT)) "$C" "$S")
    [[ $req == "$want" ]] || fail "tshark's REQ: '$req', expected '$want'"
    echo "tshark: $(wc -l <"$WORK/attrs") CM MADs in both captures; REQ: $req"
    ;;
esac
echo "PASS [rdmacm.$CASE] ($((SECONDS - t0))s)"
