#!/usr/bin/env bash
# rsockets benchmark (issue 27): Debian's rstream and riostream between two softrdma
# addresses, beside the same rstream's TCP mode (-T s) over loopback, and an unmodified
# socket program (cm/rsocket/tests/socket_transfer.py, python3's socket module) under
# `softrdma run --rsockets` beside the same program over kernel TCP. A benchmark, not a test:
# the figures depend on the machine and its load.
#
#   bash bench/rsocket_bench.sh [REPEATS]      (default 3; needs a built build/ tree)
#
# Per repeat, alternating so that drifting load hits all alike:
#   rsockets   softrdma run --addr 127.0.100.31 -- rstream -b .31 / --addr .32 -- rstream -s .31
#              (default transport: the same-host path, shared memory between the processes)
#   tcp        rstream -T s between the same two loopback addresses (kernel TCP, no softrdma)
#   riostream  riostream the same way as rsockets (RDMA WRITE into a riomap'd window)
#   preload    socket_transfer.py, 256 MiB, under softrdma run --rsockets, and the same
#              without (kernel TCP); the receiver's MB/s (includes its SHA-256)
# rstream's default sweep: 64 B, 4 KiB, 64 KiB, 1 MiB; *_lat = ping-pong (usec/xfer is half
# a round trip... as rstream prints it: time per transfer), *_bw = one-way stream.
# Prints markdown: medians over REPEATS of Gb/sec and usec/xfer per step, ratios rsockets/TCP,
# and whether the issue's target holds (rstream bandwidth at 64 KiB-1 MiB >= 1x TCP).
set -uo pipefail

REPEATS=${1:-3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build}
SOFTRDMA=$BUILD/bin/softrdma
S=127.0.100.31
C=127.0.100.32
PORT=19530
[[ -x $SOFTRDMA ]] || { echo "build the softrdma target first ($SOFTRDMA)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/rsocket_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# pair NAME SERVER_PREFIX... -- CLIENT_PREFIX...: runs one server/client pair, appends the
# client's output to $WORK/NAME.
wait_port_free() { sleep 0.5; }
run_pair() {
  local name=$1 mode=$2 prog=$3
  shift 3
  local srv cli
  if [[ $mode == softrdma ]]; then
    timeout 300 "$SOFTRDMA" run --addr "$S" --log info -- stdbuf -oL "$prog" -b "$S" -p "$PORT" "$@" \
      >"$WORK/srv.log" 2>&1 &
    srv=$!
    for _ in $(seq 300); do grep -q "listening on $S:$PORT" "$WORK/srv.log" && break; sleep 0.1; done
    timeout 300 "$SOFTRDMA" run --addr "$C" -- "$prog" -s "$S" -p "$PORT" "$@" >>"$WORK/$name" 2>&1
  else
    timeout 300 "$prog" -b "$S" -p "$PORT" "$@" >"$WORK/srv.log" 2>&1 &
    srv=$!
    sleep 1
    timeout 300 "$prog" -s "$S" -p "$PORT" "$@" >>"$WORK/$name" 2>&1
  fi
  cli=$?
  wait "$srv"
  ((cli == 0)) || { echo "$name: client failed ($cli)" >&2; tail -5 "$WORK/$name" >&2; }
  PORT=$((PORT + 1))
  ((PORT > 19539)) && PORT=19530
  wait_port_free
}

run_py() {
  local name=$1 opts=()
  [[ $name == preload_rsockets ]] && opts=(--rsockets)
  local py=$ROOT/cm/rsocket/tests/socket_transfer.py
  if [[ $name == preload_rsockets ]]; then
    timeout 120 "$SOFTRDMA" run "${opts[@]}" --addr "$S" --log info -- python3 "$py" server "$S" "$PORT" \
      >"$WORK/srv.log" 2>&1 &
    local srv=$!
    for _ in $(seq 300); do grep -q "listening on $S:$PORT" "$WORK/srv.log" && break; sleep 0.1; done
    timeout 120 "$SOFTRDMA" run "${opts[@]}" --addr "$C" -- python3 "$py" client "$S" "$PORT" $((256 << 20)) \
      >"$WORK/cli.log" 2>&1
  else
    timeout 120 python3 "$py" server "$S" "$PORT" >"$WORK/srv.log" 2>&1 &
    local srv=$!
    sleep 1
    timeout 120 python3 "$py" client "$S" "$PORT" $((256 << 20)) >"$WORK/cli.log" 2>&1
  fi
  wait "$srv"
  grep -q "sha256 matches" "$WORK/cli.log" || { echo "$name: transfer not verified" >&2; cat "$WORK/cli.log" "$WORK/srv.log" >&2; }
  grep -oE '[0-9.]+ MB/s' "$WORK/srv.log" | awk '{ print $1 }' >>"$WORK/$name"
  PORT=$((PORT + 1))
  ((PORT > 19539)) && PORT=19530
  wait_port_free
}

for r in $(seq "$REPEATS"); do
  echo "repeat $r/$REPEATS" >&2
  run_pair rstream_rsockets softrdma rstream
  run_pair rstream_tcp kernel rstream -T s
  run_pair riostream softrdma riostream
  run_py preload_rsockets
  run_py preload_tcp
done

# median FILE STEP COLUMN: median of COLUMN (5 = Gb/sec? see below) of STEP's lines.
median() {
  awk -v s="$2" -v c="$3" '$1 == s { v[n++] = $c } END {
    if (!n) { print "-"; exit }
    for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    print (n % 2) ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2 }' "$1"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b }'; }

echo "### rstream / riostream: softrdma rsockets vs kernel TCP over loopback ($REPEATS runs, medians; $(date -u +%F), $(nproc) CPUs)"
echo
echo "| step | rsockets Gb/s | TCP Gb/s | rsockets/TCP | rsockets µs/xfer | TCP µs/xfer | riostream Gb/s | riostream µs/xfer |"
echo "|---|---|---|---|---|---|---|---|"
target_ok=1
worst=""
for step in 64_lat 4k_lat 64k_lat 1m_lat 64_bw 4k_bw 64k_bw 1m_bw; do
  rg=$(median "$WORK/rstream_rsockets" "$step" 7)
  tg=$(median "$WORK/rstream_tcp" "$step" 7)
  ru=$(median "$WORK/rstream_rsockets" "$step" 8)
  tu=$(median "$WORK/rstream_tcp" "$step" 8)
  ig=$(median "$WORK/riostream" "$step" 7)
  iu=$(median "$WORK/riostream" "$step" 8)
  rr=$(ratio "$rg" "$tg")
  echo "| $step | $rg | $tg | $rr | $ru | $tu | $ig | $iu |"
  if [[ $step == 64k_bw || $step == 1m_bw ]]; then
    awk -v r="$rr" 'BEGIN { exit !(r != "-" && r >= 1) }' || target_ok=0
    worst+="$step ${rr}x "
  fi
done
echo
pr=$(median <(sed 's/^/x /' "$WORK/preload_rsockets") x 2)
pt=$(median <(sed 's/^/x /' "$WORK/preload_tcp") x 2)
echo "Unmodified socket program (socket_transfer.py, 256 MiB, SHA-256 checked): softrdma run --rsockets $pr MB/s, kernel TCP $pt MB/s, ratio $(ratio "$pr" "$pt")."
echo
if ((target_ok)); then
  echo "Target (rstream bandwidth 64 KiB-1 MiB >= 1x TCP over loopback): met ($worst)."
else
  echo "Target (rstream bandwidth 64 KiB-1 MiB >= 1x TCP over loopback): MISSED ($worst)."
fi
