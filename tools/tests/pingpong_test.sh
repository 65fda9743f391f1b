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
#
# A pingpong case starts the server (softrdma run --addr 127.0.0.A) and the client
# (--addr 127.0.0.B, TCP exchange with the server via 127.0.0.1), both bounded by
# `timeout`, and checks that both exit 0 and print
#   N bytes in T seconds = X Mbit/sec
#   I iters in T seconds = Y usec/iter
# with N = 2 * size * iterations and X, Y positive finite figures. Each case has its own
# addresses and TCP port so ctest can run the cases in parallel. On failure both logs are
# printed. A missing ibv_rc_pingpong is a failure (install ibverbs-utils), never a skip.
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR default|large|events|devinfo" >&2
  exit 2
fi
BUILD_DIR=$(cd "$1" && pwd) || { echo "FAIL: no build directory '$1'" >&2; exit 1; }
CASE=$2
SOFTRDMA="$BUILD_DIR/bin/softrdma"
# Seconds per process. 2 GB through `large` takes ~10 s on an idle 2-core machine, ~50 s
# under ASan next to other tests.
if [[ $CASE == large ]]; then STEP_TIMEOUT=${PINGPONG_TIMEOUT:-200}; else STEP_TIMEOUT=${PINGPONG_TIMEOUT:-60}; fi

fail() {
  echo "FAIL [pingpong.$CASE]: $*" >&2
  exit 1
}

[[ -x "$SOFTRDMA" ]] || fail "$SOFTRDMA not built (build the 'softrdma' target)"
[[ -e "$BUILD_DIR/lib/libibverbs.so.1" ]] || fail "$BUILD_DIR/lib/libibverbs.so.1 not built"

# The programs under test are Debian's own binaries, not anything built here.
need_tool() {
  [[ -x "/usr/bin/$1" ]] ||
    fail "/usr/bin/$1 is missing: install Debian's ibverbs-utils" \
      "(apt-get install ibverbs-utils, or run: bash scripts/deps.sh)"
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-pingpong-$CASE.XXXXXX")
SERVER_PID=""
cleanup() {
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

show_logs() {
  local f
  for f in "$@"; do
    echo "----- $(basename "$f") -----" >&2
    cat "$f" >&2
  done
  echo "-----" >&2
}

# True if something listens on TCP port $1 (any address, IPv4 or IPv6). Reads /proc so
# that it does not connect: ibv_rc_pingpong's server accepts exactly one connection.
tcp_listening() {
  local hex
  hex=$(printf ':%04X' "$1")
  awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 }
                   END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
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
  local want=$((2 * size * iters))
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
  need_tool ibv_rc_pingpong
  local slog="$WORK/server.log" clog="$WORK/client.log"
  local common=(-g 0 -p "$port" "${extra[@]}")
  echo "server: softrdma run --addr $server_addr -- ibv_rc_pingpong ${common[*]}"
  echo "client: softrdma run --addr $client_addr -- ibv_rc_pingpong ${common[*]} 127.0.0.1"

  # stdbuf: line-buffered stdout, so a log killed by timeout still shows how far it got.
  # It goes after `softrdma run`: its LD_PRELOAD must not come before the ASan runtime
  # that `softrdma run` preloads in a sanitizer build.
  timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$server_addr" -- \
    stdbuf -oL /usr/bin/ibv_rc_pingpong "${common[@]}" >"$slog" 2>&1 &
  SERVER_PID=$!

  # Wait for the server's TCP listener (it opens the device and creates its QP first).
  local waited=0
  until tcp_listening "$port"; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      wait "$SERVER_PID"
      local rc=$?
      SERVER_PID=""
      show_logs "$slog"
      fail "server exited (status $rc) before listening on TCP port $port"
    fi
    if ((waited >= 200)); then
      show_logs "$slog"
      fail "server not listening on TCP port $port after 20 s"
    fi
    sleep 0.1
    waited=$((waited + 1))
  done

  local crc=0 src=0
  timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$client_addr" -- \
    stdbuf -oL /usr/bin/ibv_rc_pingpong "${common[@]}" 127.0.0.1 >"$clog" 2>&1 || crc=$?
  wait "$SERVER_PID" || src=$?
  SERVER_PID=""

  local ok=1
  if ((src != 0)); then
    echo "server exited with status $src$( ((src == 124)) && echo " (timed out after ${STEP_TIMEOUT}s)")" >&2
    ok=0
  fi
  if ((crc != 0)); then
    echo "client exited with status $crc$( ((crc == 124)) && echo " (timed out after ${STEP_TIMEOUT}s)")" >&2
    ok=0
  fi
  if ((ok)); then
    check_output "$slog" server "$size" "$iters" || ok=0
    check_output "$clog" client "$size" "$iters" || ok=0
  fi
  if ((!ok)); then
    show_logs "$slog" "$clog"
    fail "ibv_rc_pingpong ${common[*]}"
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

case "$CASE" in
  default) run_pingpong 127.0.0.101 127.0.0.102 18601 4096 1000 ;;
  large) run_pingpong 127.0.0.103 127.0.0.104 18602 1048576 1000 -s 1048576 -n 1000 ;;
  events) run_pingpong 127.0.0.105 127.0.0.106 18603 4096 1000 -e ;;
  devinfo) run_devinfo ;;
  *)
    echo "unknown case '$CASE' (default|large|events|devinfo)" >&2
    exit 2
    ;;
esac
