#!/usr/bin/env bash
# softrdma demo: Debian's unmodified verbs programs over user-space RoCEv2 on loopback.
#
#   bash scripts/demo.sh
#
# Installs missing packages (scripts/deps.sh, may use sudo), builds the default preset's
# `softrdma` tool and drop-in libibverbs.so.1 (build/), then — as an ordinary user, with
# no RDMA hardware or kernel module — runs:
#   1. ibv_devinfo through `softrdma run`: the device srdma0;
#   2. ibv_rc_pingpong, server on 127.0.0.2 and client on 127.0.0.3, with the defaults
#      (4 KiB x 1000) and with 1 MiB messages x 200;
#   3. perftest's ib_send_lat and ib_write_bw for a few iterations with the client's
#      packets captured (softrdma run --pcap), and tshark's one-line decode of the first
#      packets of each capture (opcode, QPN, PSN), as Soft-RoCE walkthroughs do with Wireshark;
#   4. ib_send_lat (2 B) and ib_write_bw (64 KiB) on both packet paths — the same-host
#      shared-memory path (the default for peers on one host) and UDP (--transport udp);
#   5. softrdma's collectives: `mpirun -np 4 all_reduce_perf -b 8 -e 16M -f 4 -n 100 -w 10 -c 1`, four
#      ranks each on its own softrdma device, nccl-tests output with #wrong checked;
# and prints a table of bytes moved, throughput and latency parsed from the programs' output.
# Exits non-zero if anything fails. Settings: DEMO_SERVER_ADDR / DEMO_CLIENT_ADDR (default
# 127.0.0.2 / 127.0.0.3), DEMO_PORT (pingpong's TCP port, default 18555), DEMO_TIMEOUT
# (seconds per program, default 60).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
# shellcheck source=scripts/lib/test_lib.sh
source "$ROOT/scripts/lib/test_lib.sh"  # make_work_dir, tcp_listening
SOFTRDMA="$ROOT/build/bin/softrdma"
TIMEOUT=${DEMO_TIMEOUT:-60}
PORT=${DEMO_PORT:-18555}
SERVER_ADDR=${DEMO_SERVER_ADDR:-127.0.0.2}
CLIENT_ADDR=${DEMO_CLIENT_ADDR:-127.0.0.3}

if [[ -t 1 ]]; then B=$'\033[1m' N=$'\033[0m'; else B="" N=""; fi
say() { printf '\n%s==> %s%s\n' "$B" "$*" "$N"; }
die() {
  echo "demo: FAILED: $*" >&2
  exit 1
}

say "Installing missing Debian packages (scripts/deps.sh)"
bash scripts/deps.sh

say "Building the default preset: softrdma tool + drop-in libibverbs.so.1 (build/)"
cmake --preset default >/dev/null || die "cmake --preset default"
cmake --build --preset default --target softrdma all_reduce_perf -j "$(nproc)" || die "build"
[[ -x $SOFTRDMA && -e $ROOT/build/lib/libibverbs.so.1 ]] || die "build did not produce softrdma"
for t in ibv_devinfo ibv_rc_pingpong; do
  [[ -x /usr/bin/$t ]] || die "/usr/bin/$t missing: install ibverbs-utils"
done

# True if a UDP socket is bound to $1:$2 (reads /proc/net/udp: address little-endian hex).
udp_bound() {
  local a b c d
  IFS=. read -r a b c d <<<"$1"
  local want
  want=$(printf '%02X%02X%02X%02X:%04X' "$d" "$c" "$b" "$a" "$2")
  awk -v w="$want" '$2 == w { found = 1 } END { exit !found }' /proc/net/udp 2>/dev/null
}
for a in "$SERVER_ADDR" "$CLIENT_ADDR"; do
  if udp_bound "$a" 4791; then
    die "$a:4791/udp is taken (another softrdma process? see: $SOFTRDMA stat); pick free" \
      "addresses with DEMO_SERVER_ADDR=127.0.0.x DEMO_CLIENT_ADDR=127.0.0.y"
  fi
done

make_work_dir softrdma-demo
SERVER_PID=""
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null
}

say "softrdma run -- ibv_devinfo   (Debian's /usr/bin/ibv_devinfo, unmodified)"
echo "softrdma run puts $ROOT/build/lib first in LD_LIBRARY_PATH, so the program loads"
echo "softrdma's libibverbs.so.1 instead of the system's; the device binds 127.0.0.x:4791/udp."
echo
timeout "$TIMEOUT" "$SOFTRDMA" run -- ibv_devinfo || die "ibv_devinfo"

# Waits (up to 20 s) until the server started as $SERVER_PID listens on TCP $PORT, or exits.
wait_for_server() {
  local i
  for ((i = 0; i < 200; i++)); do
    tcp_listening "$PORT" && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

ROWS=()
# pingpong NAME ARGS...: server on SERVER_ADDR, client on CLIENT_ADDR; adds a summary row.
pingpong() {
  local name=$1
  shift
  local args=(-g 0 -p "$PORT" "$@")
  local slog="$WORK/server.log" clog="$WORK/client.log"
  say "ibv_rc_pingpong ${args[*]}: $name"
  echo "server: softrdma run --addr $SERVER_ADDR -- ibv_rc_pingpong ${args[*]}"
  echo "client: softrdma run --addr $CLIENT_ADDR -- ibv_rc_pingpong ${args[*]} 127.0.0.1"
  echo "(-g 0: GID index 0 = ::ffff:<addr>, RoCE v2; the QP numbers are exchanged over TCP)"
  echo
  timeout "$TIMEOUT" "$SOFTRDMA" run --addr "$SERVER_ADDR" -- ibv_rc_pingpong "${args[@]}" \
    >"$slog" 2>&1 &
  SERVER_PID=$!
  wait_for_server || true  # the caller reports a server that never listened
  tcp_listening "$PORT" || { cat "$slog" >&2; die "pingpong server did not start"; }

  local crc=0 src=0
  timeout "$TIMEOUT" "$SOFTRDMA" run --addr "$CLIENT_ADDR" -- ibv_rc_pingpong "${args[@]}" \
    127.0.0.1 >"$clog" 2>&1 || crc=$?
  wait "$SERVER_PID" || src=$?
  SERVER_PID=""
  echo "--- client ---"
  cat "$clog"
  echo "--- server ---"
  cat "$slog"
  ((crc == 0 && src == 0)) || die "ibv_rc_pingpong $name: client exit $crc, server exit $src"

  local line bytes="" mbit="" usec=""
  while IFS= read -r line; do
    if [[ $line =~ ^([0-9]+)\ bytes\ in\ [0-9.]+\ seconds\ =\ ([0-9.]+)\ Mbit/sec$ ]]; then
      bytes=${BASH_REMATCH[1]} mbit=${BASH_REMATCH[2]}
    elif [[ $line =~ ^[0-9]+\ iters\ in\ [0-9.]+\ seconds\ =\ ([0-9.]+)\ usec/iter$ ]]; then
      usec=${BASH_REMATCH[1]}
    fi
  done <"$clog"
  [[ -n $bytes && -n $mbit && -n $usec ]] || die "could not parse the client's output"
  ROWS+=("$name|$bytes|$mbit|$usec")
}

pingpong "4 KiB x 1000 (defaults)"
pingpong "1 MiB x 200 (-s 1048576 -n 200)" -s 1048576 -n 200

# capture NAME TOOL ARGS...: runs a perftest tool over softrdma with the client's traffic
# captured, then shows tshark's decode of the first packets.
capture() {
  local name=$1 tool=$2
  shift 2
  local args=(-d srdma0 -x 0 -p "$PORT" "$@") pcap="$WORK/$name.pcap"
  say "$tool ${args[*]}, client packets captured to $name.pcap"
  echo "server: softrdma run --addr $SERVER_ADDR -- $tool ${args[*]}"
  echo "client: softrdma run --addr $CLIENT_ADDR --pcap $name.pcap -- $tool ${args[*]} 127.0.0.1"
  timeout "$TIMEOUT" "$SOFTRDMA" run --addr "$SERVER_ADDR" -- "$tool" "${args[@]}" \
    >"$WORK/server.log" 2>&1 &
  SERVER_PID=$!
  wait_for_server || true  # the caller reports a server that never listened
  local crc=0 src=0
  timeout "$TIMEOUT" "$SOFTRDMA" run --addr "$CLIENT_ADDR" --pcap "$pcap" -- "$tool" \
    "${args[@]}" 127.0.0.1 >"$WORK/client.log" 2>&1 || crc=$?
  wait "$SERVER_PID" || src=$?
  SERVER_PID=""
  grep -A1 -E "#bytes" "$WORK/client.log" || true
  ((crc == 0 && src == 0)) || {
    cat "$WORK/client.log" "$WORK/server.log" >&2
    die "$tool: client exit $crc, server exit $src"
  }
  echo
  echo "tshark -r $name.pcap (first packets: frame, source > destination, opcode and QPN, PSN):"
  # --disable-protocol rpcordma: Wireshark's RPC-over-RDMA heuristic tries every SEND
  # payload and calls perftest's 2-byte ones malformed; the RoCEv2 decode is unaffected.
  tshark -r "$pcap" --disable-protocol rpcordma -c "${CAPTURE_FRAMES:-12}" -T fields \
    -E separator=' ' -e frame.number \
    -e ip.src -e ip.dst -e _ws.col.Info -e infiniband.bth.psn 2>/dev/null |
    awk '{ psn = $NF; $NF = ""; printf "  %-4s %s > %s  %s PSN=%s\n", $1, $2, $3,
           substr($0, index($0, $4)), psn }' | sed 's/  *PSN=/  PSN=/'
  local n
  n=$(tshark -r "$pcap" 2>/dev/null | wc -l)
  ((n > 0)) || die "tshark decoded nothing in $pcap"
  echo "  ($n RoCEv2 packets in the capture; open it in Wireshark for the full BTH/RETH/AETH decode)"
}

command -v tshark >/dev/null || die "tshark is missing (scripts/deps.sh installs it)"
capture send_lat ib_send_lat -n 5
capture write_bw ib_write_bw -n 5 -s 8192

# paths TOOL ARGS... : runs a perftest tool on both packet paths and adds summary rows
# with its headline figure (t_typical for latency tests, BW average for bandwidth tests).
PERF_ROWS=()
paths() {
  local tool=$1
  shift
  local transport
  for transport in shm udp; do
    local args=(-d srdma0 -x 0 -p "$PORT" "$@")
    say "$tool ${args[*]} over --transport $transport"
    timeout "$TIMEOUT" "$SOFTRDMA" run --addr "$SERVER_ADDR" --transport "$transport" -- \
      "$tool" "${args[@]}" >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    wait_for_server || true  # the caller reports a server that never listened
    local crc=0 src=0
    timeout "$TIMEOUT" "$SOFTRDMA" run --addr "$CLIENT_ADDR" --transport "$transport" -- \
      "$tool" "${args[@]}" 127.0.0.1 >"$WORK/client.log" 2>&1 || crc=$?
    wait "$SERVER_PID" || src=$?
    SERVER_PID=""
    grep -A1 -E "#bytes" "$WORK/client.log" || true
    ((crc == 0 && src == 0)) || {
      cat "$WORK/client.log" "$WORK/server.log" >&2
      die "$tool over $transport: client exit $crc, server exit $src"
    }
    local figure
    if [[ $tool == *_lat ]]; then
      figure=$(awk '/t_typical/ { getline; print $5 " us (t_typical)"; exit }' "$WORK/client.log")
    else
      figure=$(awk '/BW average/ { getline; printf "%.2f GB/s (BW average)", $4 * 1048576 / 1e9; exit }' \
        "$WORK/client.log")
    fi
    [[ -n $figure ]] || die "could not parse $tool's output"
    PERF_ROWS+=("$tool ${*} ($transport path)|$figure")
  done
}
paths ib_send_lat -s 2 -n 2000
paths ib_write_bw -s 65536 -n 5000

command -v mpirun >/dev/null || die "mpirun is missing (scripts/deps.sh installs openmpi-bin)"
# Each rank opens its own device (the first free 127.0.0.x); the ranks find each other
# through a TCP rendezvous at rank 0 (docs/collectives.md). As root, Open MPI wants
# --allow-run-as-root; on a 2-core machine 4 ranks need --oversubscribe.
mpi_root=()
[[ $(id -u) == 0 ]] && mpi_root=(--allow-run-as-root)
AR_ROWS=()
for np in 2 4; do
  say "Collectives: mpirun -np $np all_reduce_perf -b 8 -e 16M -f 4 -n 100 -w 10 -c 1 ($np ranks, $np softrdma devices)"
  ((np > $(nproc))) && echo "($np ranks on $(nproc) cores: ranks share cores, so expect far less than one rank per core)"
  timeout "$TIMEOUT" mpirun -np "$np" --oversubscribe --bind-to none "${mpi_root[@]}" \
    "$ROOT/build/bin/all_reduce_perf" -b 8 -e 16M -f 4 -n 100 -w 10 -c 1 | tee "$WORK/allreduce.log" ||
    die "all_reduce_perf failed"
  grep -q "Out of bounds values : 0 OK" "$WORK/allreduce.log" || die "all_reduce_perf reported wrong values"
  awk '$1 ~ /^[0-9]+$/ && ($9 != 0 || $13 != 0) { bad = 1 } END { exit bad }' "$WORK/allreduce.log" ||
    die "all_reduce_perf: a line with #wrong != 0"
  AR_ROWS+=("all_reduce_perf, $np ranks, 8 B|$(awk '$1 == 8 { print $6 " us" }' "$WORK/allreduce.log")")
  AR_ROWS+=("all_reduce_perf, $np ranks, 8 MiB|$(awk '$1 == 8388608 { print $8 " GB/s busbw" }' "$WORK/allreduce.log")")
done

say "Summary (client side; ibv_rc_pingpong counts both directions, usec/iter = round trip)"
fmt='%-48s %12s %10s %10s\n'
printf "$fmt" "run" "bytes moved" "Mbit/s" "usec/iter"
printf "$fmt" "$(printf '%.0s-' {1..48})" "------------" "----------" "----------"
for r in "${ROWS[@]}"; do
  IFS='|' read -r name bytes mbit usec <<<"$r"
  printf "$fmt" "ibv_rc_pingpong $name" "$bytes" "$mbit" "$usec"
done
echo
fmt2='%-48s %s\n'
printf "$fmt2" "perftest (client side) and collectives" "result"
printf "$fmt2" "$(printf '%.0s-' {1..48})" "--------------------------"
for r in "${PERF_ROWS[@]}" "${AR_ROWS[@]}"; do
  IFS='|' read -r name figure <<<"$r"
  printf "$fmt2" "$name" "$figure"
done
echo
echo "demo: OK — unmodified /usr/bin/ibv_devinfo, ibv_rc_pingpong, ib_send_lat and ib_write_bw"
echo "ran over softrdma on both packet paths; their RoCEv2 packets were captured and decoded by"
echo "tshark; an AllReduce over softrdma's collectives (2 and 4 ranks) checked every value (#wrong 0)."
