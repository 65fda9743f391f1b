#!/usr/bin/env bash
# softrdma latency / bandwidth benchmark against the UDP floor, in one run on this machine.
#
#   bash bench/run_bench.sh [REPEATS]          (default 5; needs a built build/ tree)
#
# Measures, REPEATS times each, alternating so that drifting machine load hits all alike:
#   floor:     udp_floor pingpong 2 B and 64 B (busy-poll, median half round trip, µs)
#              udp_floor stream with GSO/GRO, 4 KiB segments (GB/s)
#   softrdma:  Debian's unmodified perftest over softrdma (softrdma run, -d srdma0 -x 0):
#              ib_send_lat, ib_write_lat, ib_read_lat at 2 B (t_typical, µs),
#              ib_send_bw, ib_write_bw, ib_read_bw at 4 KiB and 64 KiB (BW average, GB/s)
# and prints a markdown table of medians with ratios to the floor:
#   ib_send_lat / ib_write_lat  vs  UDP ping-pong 2 B half RTT (perftest reports RTT/2)
#   ib_read_lat                 vs  UDP ping-pong 2 B full RTT (a READ is one round trip)
#   *_bw                        vs  UDP GSO/GRO stream
# GB/s = 1e9 B/s; perftest's MB/sec are 2^20 B/s and are converted. Nothing here is a test:
# the figures depend on the machine and its load — quote medians and ratios, not single runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPEATS=${1:-5}
B=build
[[ -x $B/bin/softrdma && -x $B/bin/udp_floor ]] ||
  { echo "build first: cmake --preset default && cmake --build --preset default" >&2; exit 1; }
OUT=$(mktemp -d /tmp/softrdma-bench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
port=19100

median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

# perftest TOOL SIZE EXTRA... → prints the result line's figure of interest
perftest() {
  local tool=$1 size=$2; shift 2
  port=$((port + 1))
  local srv=$OUT/srv.log cli=$OUT/cli.log
  $B/bin/softrdma run --addr 127.0.21.1 -- timeout 120 "$tool" -d srdma0 -x 0 -s "$size" -p $port "$@" >"$srv" 2>&1 &
  local spid=$!
  for _ in $(seq 100); do
    awk -v p="$(printf ':%04X' $port)" '$4=="0A" && substr($2,length($2)-4)==p {f=1} END{exit !f}' /proc/net/tcp 2>/dev/null && break
    sleep 0.05
  done
  $B/bin/softrdma run --addr 127.0.21.2 -- timeout 120 "$tool" -d srdma0 -x 0 -s "$size" -p $port "$@" 127.0.0.1 >"$cli" 2>&1
  wait $spid
  # latency: t_typical is column 5; bandwidth: BW average [MB/sec] is column 4
  if [[ $tool == *_lat ]]; then
    awk '/t_typical/ {getline; print $5; exit}' "$cli"
  else
    awk '/BW average/ {getline; printf "%.4f\n", $4 * 1048576 / 1e9; exit}' "$cli"
  fi
}

declare -A samples
add() { samples[$1]+="$2 "; }

for r in $(seq "$REPEATS"); do
  echo "round $r/$REPEATS" >&2
  add floor_pp2 "$($B/bin/udp_floor pingpong 2 20000 | awk '{print $3}')"
  add floor_pp64 "$($B/bin/udp_floor pingpong 64 20000 | awk '{print $3}')"
  add floor_gso "$(timeout 30 $B/bin/udp_floor stream 4096 2 | awk '{print $3}')"
  add send_lat "$(perftest ib_send_lat 2 -n 5000)"
  add write_lat "$(perftest ib_write_lat 2 -n 5000)"
  add read_lat "$(perftest ib_read_lat 2 -n 5000)"
  for s in 4096 65536; do
    add send_bw_$s "$(perftest ib_send_bw $s -n 5000)"
    add write_bw_$s "$(perftest ib_write_bw $s -n 5000)"
    add read_bw_$s "$(perftest ib_read_bw $s -n 5000)"
  done
done

med() { tr ' ' '\n' <<<"${samples[$1]}" | grep -E '^[0-9.]+$' | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }

pp2=$(med floor_pp2); pp64=$(med floor_pp64); gso=$(med floor_gso)
rtt2=$(awk -v h="$pp2" 'BEGIN { printf "%.2f", 2 * h }')
echo
echo "Date: $(date -u +%Y-%m-%d), machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), load average at end: $(cut -d' ' -f1-3 /proc/loadavg); $REPEATS rounds, medians."
echo
echo "| measurement | median | floor | ratio to floor |"
echo "|---|---|---|---|"
echo "| UDP ping-pong 2 B, half RTT (µs) | $pp2 | — | — |"
echo "| UDP ping-pong 64 B, half RTT (µs) | $pp64 | — | — |"
echo "| UDP stream GSO/GRO 4 KiB (GB/s) | $gso | — | — |"
for t in send write; do
  v=$(med ${t}_lat)
  echo "| ib_${t}_lat 2 B, t_typical (µs) | $v | $pp2 | $(ratio "$v" "$pp2") |"
done
v=$(med read_lat)
echo "| ib_read_lat 2 B, t_typical (µs, full RTT) | $v | $rtt2 | $(ratio "$v" "$rtt2") |"
for s in 4096 65536; do
  for t in send write read; do
    v=$(med ${t}_bw_$s)
    echo "| ib_${t}_bw $((s / 1024)) KiB (GB/s) | $v | $gso | $(ratio "$v" "$gso") |"
  done
done
