#!/usr/bin/env bash
# Runs Debian's unmodified ibverbs-utils programs over softrdma through `softrdma run`.
#
#   pingpong_test.sh BUILD_DIR CASE
#
# CASE:
#   default   ibv_rc_pingpong with its defaults (4096 B x 1000 iterations)
#   large     ibv_rc_pingpong -s 1048576 -n 1000 (multi-packet messages)
#   events    ibv_rc_pingpong -e (completion channel: ibv_req_notify_cq / ibv_get_cq_event)
#   devinfo   ibv_devinfo -v shows srdma0, PORT_ACTIVE, Ethernet link layer, RoCE v2 GID
#   ud        ibv_ud_pingpong with its defaults (UD datagrams of 2048 B, address handles)
#   uc        ibv_uc_pingpong with its defaults (UC, 4096 B messages at MTU 1024)
#   srq       ibv_srq_pingpong with its defaults (16 RC QPs receiving from one SRQ)
#   xsrq      ibv_xsrq_pingpong with its defaults (XRC send/receive QPs, an XRC SRQ, an XRC
#             domain opened through /tmp/xrc_domain); it prints "success" instead of figures
#
# A pingpong case starts the server (softrdma run --addr 127.0.0.A) and the client
# (--addr 127.0.0.B, TCP exchange with the server via 127.0.0.1), both bounded by
# `timeout`, and checks that both exit 0 and print
#   N bytes in T seconds = X Mbit/sec
#   I iters in T seconds = Y usec/iter
# with N = 2 * size * iterations (ibv_ud_pingpong: size * iterations) and X, Y positive
# finite figures. Each case has its own
# addresses and TCP port so ctest can run the cases in parallel. On failure both logs are
# printed. A missing ibv_rc_pingpong is a failure (install ibverbs-utils), never a skip.
set -uo pipefail

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
case_test_args pingpong "default large events devinfo ud uc srq xsrq" "$@"
# Seconds per process. 2 GB through `large` takes ~10 s on an idle 2-core machine, ~50 s
# under ASan next to other tests.
if [[ $CASE == large ]]; then STEP_TIMEOUT=${PINGPONG_TIMEOUT:-200}; else STEP_TIMEOUT=${PINGPONG_TIMEOUT:-60}; fi

require_softrdma_built

# The programs under test are Debian's own binaries, not anything built here.
need_tool() {
  [[ -x "/usr/bin/$1" ]] ||
    fail "/usr/bin/$1 is missing: install Debian's ibverbs-utils" \
      "(apt-get install ibverbs-utils, or run: bash scripts/deps.sh)"
}

make_work_dir "softrdma-pingpong-$CASE"
SERVER_PID=""
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null
}

# Checks one side's log: both result lines, byte count, positive finite figures.
check_output() {
  local log=$1 side=$2 size=$3 iters=$4
  local bytes_re='^([0-9]+) bytes in ([0-9.]+) seconds = ([0-9.]+) Mbit/sec$'
  local iters_re='^([0-9]+) iters in ([0-9.]+) seconds = ([0-9.]+) usec/iter$'
  local line bytes_line="" iters_line=""
  while IFS= read -r line; do
    [[ $line =~ $bytes_re ]] && bytes_line=$line
    [[ $line =~ $iters_re ]] && iters_line=$line
  done <"$log"
  [[ -n "$bytes_line" ]] || { echo "$side: no 'N bytes in T seconds = X Mbit/sec' line" >&2; return 1; }
  [[ -n "$iters_line" ]] || { echo "$side: no 'I iters in T seconds = Y usec/iter' line" >&2; return 1; }
  [[ $bytes_line =~ $bytes_re ]]
  local bytes=${BASH_REMATCH[1]} mbit=${BASH_REMATCH[3]}
  [[ $iters_line =~ $iters_re ]]
  local n=${BASH_REMATCH[1]} usec=${BASH_REMATCH[3]}
  local want=$((${DIRECTIONS:-2} * size * iters))
  [[ $bytes -eq $want ]] || { echo "$side: $bytes bytes moved, expected $want" >&2; return 1; }
  [[ $n -eq $iters ]] || { echo "$side: $n iterations, expected $iters" >&2; return 1; }
  awk -v x="$mbit" -v y="$usec" 'BEGIN { exit !(x + 0 > 0 && y + 0 > 0) }' ||
    { echo "$side: throughput $mbit Mbit/sec / latency $usec usec/iter not positive" >&2; return 1; }
  echo "$side: $bytes_line | $iters_line"
}

run_pingpong() {
  local server_addr=$1 client_addr=$2 port=$3 size=$4 iters=$5
  shift 5
  local extra=("$@")
  local prog=${PROG:-ibv_rc_pingpong}
  need_tool "$prog"
  local slog="$WORK/server.log" clog="$WORK/client.log"
  local common=(-g 0 -p "$port" "${extra[@]}")
  echo "server: softrdma run --addr $server_addr -- $prog ${common[*]}"
  echo "client: softrdma run --addr $client_addr -- $prog ${common[*]} 127.0.0.1"

  # stdbuf: line-buffered stdout, so a log killed by timeout still shows how far it got.
  # It goes after `softrdma run`: its LD_PRELOAD must not come before the ASan runtime
  # that `softrdma run` preloads in a sanitizer build.
  timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$server_addr" -- \
    stdbuf -oL "/usr/bin/$prog" "${common[@]}" >"$slog" 2>&1 &
  SERVER_PID=$!

  # Wait for the server's TCP listener (it opens the device and creates its QP first).
  wait_for_listener "$port" "$SERVER_PID" 20 "$slog"

  local crc=0 src=0
  timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$client_addr" -- \
    stdbuf -oL "/usr/bin/$prog" "${common[@]}" 127.0.0.1 >"$clog" 2>&1 || crc=$?
  wait "$SERVER_PID" || src=$?
  SERVER_PID=""

  local ok=1
  ((src == 0)) || { echo "server exited with $(status_text $src)" >&2; ok=0; }
  ((crc == 0)) || { echo "client exited with $(status_text $crc)" >&2; ok=0; }
  if ((ok)); then
    if ((size == 0)); then
      # ibv_xsrq_pingpong reports no figures, only "success" when every exchange completed.
      grep -qx success "$slog" || { echo "server: no 'success' line" >&2; ok=0; }
      grep -qx success "$clog" || { echo "client: no 'success' line" >&2; ok=0; }
    else
      check_output "$slog" server "$size" "$iters" || ok=0
      check_output "$clog" client "$size" "$iters" || ok=0
    fi
  fi
  if ((!ok)); then
    show_logs "$slog" "$clog"
    fail "$prog ${common[*]}"
  fi
  echo "PASS [pingpong.$CASE]"
}

run_devinfo() {
  need_tool ibv_devinfo
  local log="$WORK/devinfo.log" rc=0
  echo "softrdma run --addr 127.0.0.107 -- ibv_devinfo -v"
  timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr 127.0.0.107 -- /usr/bin/ibv_devinfo -v \
    >"$log" 2>&1 || rc=$?
  local problems=()
  ((rc == 0)) || problems+=("ibv_devinfo -v exited with status $rc")
  grep -q $'^hca_id:\tsrdma0$' "$log" || problems+=("no 'hca_id:<TAB>srdma0' line")
  grep -q 'PORT_ACTIVE' "$log" || problems+=("port state is not PORT_ACTIVE")
  grep -q $'link_layer:\t\tEthernet' "$log" || problems+=("no 'link_layer:<TAB><TAB>Ethernet' line")
  grep -E 'GID\[ *0\]:.*::ffff:127\.0\.0\.107, RoCE v2' "$log" >/dev/null ||
    grep -E 'GID.*::ffff:127\..*RoCE v2' "$log" >/dev/null ||
    problems+=("no GID line with '::ffff:127.' and 'RoCE v2'")
  if ((${#problems[@]})); then
    printf '%s\n' "${problems[@]}" >&2
    show_logs "$log"
    fail "ibv_devinfo -v"
  fi
  grep -E $'^hca_id:|state:|link_layer:|GID\\[' "$log"
  echo "PASS [pingpong.$CASE]"
}

# TCP ports 18101-18107 (each test's own: ctest runs them beside ucx_test.sh's 18600-18607).
case "$CASE" in
  default) run_pingpong 127.0.0.101 127.0.0.102 18101 4096 1000 ;;
  large) run_pingpong 127.0.0.103 127.0.0.104 18102 1048576 1000 -s 1048576 -n 1000 ;;
  events) run_pingpong 127.0.0.105 127.0.0.106 18103 4096 1000 -e ;;
  devinfo) run_devinfo ;;
  # The other QP types: their own addresses (127.0.61.x) and TCP ports 18104-18107.
  # ibv_ud_pingpong counts each datagram's bytes once (size × iterations).
  ud) PROG=ibv_ud_pingpong DIRECTIONS=1 run_pingpong 127.0.61.101 127.0.61.102 18104 2048 1000 ;;
  uc) PROG=ibv_uc_pingpong run_pingpong 127.0.61.103 127.0.61.104 18105 4096 1000 ;;
  srq) PROG=ibv_srq_pingpong run_pingpong 127.0.61.105 127.0.61.106 18106 4096 1000 ;;
  xsrq) PROG=ibv_xsrq_pingpong run_pingpong 127.0.61.107 127.0.61.108 18107 0 0 ;;
  *)
    echo "unknown case '$CASE' (default|large|events|devinfo|ud|uc|srq|xsrq)" >&2
    exit 2
    ;;
esac
