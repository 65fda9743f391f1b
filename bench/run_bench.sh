#!/usr/bin/env bash
# softrdma benchmark against the UDP floor (issue 7), both packet paths, in one run on this
# machine.
#
#   bash bench/run_bench.sh [ROUNDS]          (default 3; needs a built build/ tree)
#
# Environment (for a quick smoke run, e.g. BENCH_SECONDS=1 BENCH_SCALE="100 1000"):
#   BENCH_SECONDS    seconds per streaming figure: perftest -D, udp_floor stream/rate/memcpy (3)
#   BENCH_SCALE      QP pair counts for bench/qp_scale ("100 1000 10000 30000")
#   BENCH_LAT_ITERS  iterations per perftest latency run (5000)
#
# Measures, ROUNDS times each, alternating so that drifting machine load hits all alike (and
# swapping the order of the two paths every round):
#   floor:     udp_floor pingpong 2 B and 64 B (busy-poll, median half round trip, µs)
#              udp_floor stream with GSO/GRO, 4 KiB segments (GB/s), under /usr/bin/time:
#                user+sys CPU seconds of sender and receiver per GB received
#              udp_floor rate 64: 64 B datagrams, sendmmsg → recvmmsg, receiver's Mpps
#              udp_floor memcpy 65536: 64 KiB blocks through a 64 MiB working set (GB/s),
#                the limit a design that copies each payload once approaches
#   softrdma:  Debian's unmodified perftest over softrdma (softrdma run, -d srdma0 -x 0), on
#              the UDP path (SOFTRDMA_TRANSPORT=udp) and the same-host shared-memory path
#              (SOFTRDMA_TRANSPORT=shm), each process under /usr/bin/time:
#              ib_send_lat, ib_write_lat, ib_read_lat at 2 B (t_typical, µs)
#              ib_send_bw, ib_write_bw, ib_read_bw at 64 KiB, -D BENCH_SECONDS (BW average, GB/s)
#              ib_write_bw 64 KiB CPU cost: user+sys seconds of both processes per GB moved
#                (bytes moved = BW average × BENCH_SECONDS)
#              ib_write_bw -s 64 -D BENCH_SECONDS: MsgRate (Mpps)
#              two concurrent ib_write_bw 64 KiB pairs (4 processes on this machine's cores,
#                distinct addresses and ports): aggregate GB/s
#              bench/qp_scale: µs per SEND with N connected RC QP pairs open in one process,
#                for each N in BENCH_SCALE (exchange phase only: every pair one SEND per
#                round, ≥ 20,000 messages in all)
# and prints a markdown table of medians with ratios to the floor and the targets of issue 7:
#   ib_send_lat / ib_write_lat  vs  UDP ping-pong 2 B half RTT (perftest reports RTT/2)
#                               target ib_send_lat: UDP path ≤ 1.3×, same-host path ≤ 0.5×
#   ib_read_lat                 vs  UDP ping-pong 2 B full RTT (a READ is one round trip)
#   *_bw 64 KiB                 vs  UDP GSO/GRO stream; target UDP path ≥ 0.8×, same-host ≥ 1×
#   ib_write_bw 64 B MsgRate    vs  UDP 64 B datagram rate
#   two pairs' aggregate        vs  one pair's ib_write_bw 64 KiB (same run); target ≥ 0.8×
#   CPU s/GB                    vs  the UDP stream's CPU s/GB
#   qp_scale µs per message     vs  the first N's
# then the date, machine, load average at start and end, and one line per target: met or not.
# GB/s = 1e9 B/s; perftest's MB/sec are 2^20 B/s and are converted. Nothing here is a test:
# the figures depend on the machine and its load — quote medians and ratios, not single runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPEATS=${1:-3}
SECS=${BENCH_SECONDS:-3}
SCALE=${BENCH_SCALE:-"100 1000 10000 30000"}
LAT_ITERS=${BENCH_LAT_ITERS:-5000}
B=build
[[ -x $B/bin/softrdma && -x $B/bin/udp_floor && -x $B/bin/qp_scale ]] ||
  { echo "build first: cmake --preset default && cmake --build --preset default" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
OUT=$(mktemp -d /tmp/softrdma-bench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
port=19100
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

# cpu_of TIMEFILE... → user+sys seconds summed over the files /usr/bin/time -f '%U %S' wrote
cpu_of() { for f in "$@"; do tail -n1 "$f" 2>/dev/null; done | awk '{s += $1 + $2} END {printf "%.3f\n", s}'; }

wait_listen() {
  for _ in $(seq 100); do
    awk -v p="$(printf ':%04X' "$1")" '$4=="0A" && substr($2,length($2)-4)==p {f=1} END{exit !f}' /proc/net/tcp 2>/dev/null && return
    sleep 0.05
  done
}

# side LOG TRANSPORT ADDR PROGRAM ARGS... → one process over softrdma, CPU time in LOG.time
side() {
  local log=$1 tr=$2 addr=$3; shift 3
  SOFTRDMA_TRANSPORT=$tr $B/bin/softrdma run --addr "$addr" -- \
    /usr/bin/time -f '%U %S' -o "$log.time" timeout 120 "$@" >"$log" 2>&1
}

# pair_start K TRANSPORT TOOL SIZE EXTRA... → starts perftest pair K in the background
# (server 127.0.21.<2K-1>, client 127.0.21.<2K>, a fresh TCP port); logs $OUT/pK.{srv,cli}
declare -A PAIR
pair_start() {
  local k=$1 tr=$2 tool=$3 size=$4; shift 4
  port=$((port + 1))
  local p=$port
  rm -f "$OUT/p$k".*
  side "$OUT/p$k.srv" "$tr" "127.0.21.$((2 * k - 1))" "$tool" -d srdma0 -x 0 -s "$size" -p $p "$@" &
  local spid=$!
  wait_listen $p
  side "$OUT/p$k.cli" "$tr" "127.0.21.$((2 * k))" "$tool" -d srdma0 -x 0 -s "$size" -p $p "$@" 127.0.0.1 &
  PAIR[$k]="$spid $!"
}
pair_wait() { wait ${PAIR[$1]}; }

# Figures of pair K's client log: latency t_typical (µs, column 5), BW average (GB/s, column
# 4, MB/sec = 2^20 B/s), MsgRate (Mpps, column 5); CPU s of both sides.
lat_of() { awk '/t_typical/ {getline; print $5; exit}' "$OUT/p$1.cli"; }
bw_of() { awk '/BW average/ {getline; printf "%.4f\n", $4 * 1048576 / 1e9; exit}' "$OUT/p$1.cli"; }
rate_of() { awk '/MsgRate/ {getline; printf "%.4f\n", $5; exit}' "$OUT/p$1.cli"; }
pair_cpu() { cpu_of "$OUT/p$1.srv.time" "$OUT/p$1.cli.time"; }

# perftest TRANSPORT TOOL SIZE EXTRA... → one pair, waited for
perftest() { pair_start 1 "$@"; pair_wait 1; }

declare -A samples
add() { samples[$1]+="$2 "; }
# s_per_gb CPU_S GBPS → CPU seconds per GB moved over SECS seconds
s_per_gb() { awk -v c="$1" -v g="$2" -v s="$SECS" 'BEGIN { if (c != "" && g > 0) printf "%.3f\n", c / (g * s); }'; }

measure_path() {
  local tr=$1 t
  for t in send write read; do
    perftest "$tr" ib_${t}_lat 2 -n "$LAT_ITERS"
    add ${tr}_${t}_lat "$(lat_of 1)"
  done
  for t in send write read; do
    perftest "$tr" ib_${t}_bw 65536 -D "$SECS"
    local bw; bw=$(bw_of 1)
    add ${tr}_${t}_bw "$bw"
    [[ $t == write ]] && add ${tr}_write_cpu "$(s_per_gb "$(pair_cpu 1)" "$bw")"
  done
  perftest "$tr" ib_write_bw 64 -D "$SECS"
  add ${tr}_msgrate "$(rate_of 1)"
  # Two pairs at once: 4 processes (and their progress threads) on this machine's cores.
  pair_start 1 "$tr" ib_write_bw 65536 -D "$SECS"
  pair_start 2 "$tr" ib_write_bw 65536 -D "$SECS"
  pair_wait 1; pair_wait 2
  add ${tr}_two_pairs "$(awk -v a="$(bw_of 1)" -v b="$(bw_of 2)" 'BEGIN { if (a > 0 && b > 0) printf "%.4f\n", a + b }')"
  # shellcheck disable=SC2086  # SCALE is a list of Ns
  SOFTRDMA_TRANSPORT=$tr timeout 900 $B/bin/softrdma run --addr 127.0.21.9 -- $B/bin/qp_scale $SCALE >"$OUT/scale.log" 2>&1 ||
    { echo "qp_scale ($tr) failed:" >&2; tail -n3 "$OUT/scale.log" >&2; }
  while read -r _ _ n _ _ _ _ _ _ _ us; do add ${tr}_scale_$n "$us"; done < <(grep '^qp_scale pairs' "$OUT/scale.log")
}

for r in $(seq "$REPEATS"); do
  echo "round $r/$REPEATS" >&2
  add floor_pp2 "$($B/bin/udp_floor pingpong 2 20000 | awk '{print $3}')"
  add floor_pp64 "$($B/bin/udp_floor pingpong 64 20000 | awk '{print $3}')"
  gbps=$(/usr/bin/time -f '%U %S' -o "$OUT/floor.time" timeout 60 $B/bin/udp_floor stream 4096 "$SECS" | awk '{print $3}')
  add floor_gso "$gbps"
  add floor_gso_cpu "$(s_per_gb "$(cpu_of "$OUT/floor.time")" "$gbps")"
  add floor_rate "$(timeout 60 $B/bin/udp_floor rate 64 "$SECS" | awk '{print $3}')"
  add floor_memcpy "$(timeout 60 $B/bin/udp_floor memcpy 65536 "$SECS" | awk '{print $3}')"
  if ((r % 2)); then paths="udp shm"; else paths="shm udp"; fi
  for tr in $paths; do measure_path "$tr"; done
done

med() { tr ' ' '\n' <<<"${samples[$1]:-}" | grep -E '^[0-9.]+$' | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "nan" && b > 0) printf "%.2f", a / b; else print "nan" }'; }
label() { [[ $1 == udp ]] && echo "UDP path" || echo "same-host path"; }
NOTES=()
# note WHAT RATIO OP LIMIT → one line: met / missed
note() {
  local verdict
  verdict=$(awk -v r="$2" -v op="$3" -v l="$4" 'BEGIN { if (r == "nan") print "not measured"; else if ((op == "<=" && r <= l) || (op == ">=" && r >= l)) print "met"; else print "**missed**" }')
  NOTES+=("- $1: ratio $2, target $3 $4 — $verdict")
}

pp2=$(med floor_pp2); pp64=$(med floor_pp64); gso=$(med floor_gso)
gso_cpu=$(med floor_gso_cpu); frate=$(med floor_rate); fmemcpy=$(med floor_memcpy)
rtt2=$(awk -v h="$pp2" 'BEGIN { printf "%.2f", 2 * h }')
echo
echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'), machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r); load average at start: $load_start, at end: $(cut -d' ' -f1-3 /proc/loadavg); $REPEATS rounds, medians; streaming figures over $SECS s."
echo
echo "| measurement | path | median | reference | ratio | target |"
echo "|---|---|---|---|---|---|"
echo "| UDP ping-pong 2 B, half RTT (µs) | floor | $pp2 | — | — | — |"
echo "| UDP ping-pong 64 B, half RTT (µs) | floor | $pp64 | — | — | — |"
echo "| UDP stream GSO/GRO 4 KiB segments (GB/s) | floor | $gso | — | — | — |"
echo "| UDP stream GSO/GRO, CPU user+sys both sides (s per GB) | floor | $gso_cpu | — | — | — |"
echo "| UDP 64 B datagrams, sendmmsg → recvmmsg (Mpps) | floor | $frate | — | — | — |"
echo "| memcpy 64 KiB blocks, 64 MiB working set (GB/s) | floor | $fmemcpy | — | — | — |"
for tr in udp shm; do
  L=$(label $tr)
  for t in send write; do
    v=$(med ${tr}_${t}_lat); r=$(ratio "$v" "$pp2"); tgt="—"
    if [[ $t == send ]]; then
      if [[ $tr == udp ]]; then tgt="≤ 1.3"; note "$L ib_send_lat vs UDP half RTT" "$r" "<=" 1.3
      else tgt="≤ 0.5"; note "$L ib_send_lat vs UDP half RTT" "$r" "<=" 0.5; fi
    fi
    echo "| ib_${t}_lat 2 B, t_typical (µs) vs UDP half RTT | $L | $v | $pp2 | $r | $tgt |"
  done
  v=$(med ${tr}_read_lat)
  echo "| ib_read_lat 2 B, t_typical (µs) vs UDP full RTT | $L | $v | $rtt2 | $(ratio "$v" "$rtt2") | — |"
  if [[ $tr == udp ]]; then lim=0.8; else lim=1; fi
  for t in send write read; do
    v=$(med ${tr}_${t}_bw); r=$(ratio "$v" "$gso")
    note "$L ib_${t}_bw 64 KiB vs UDP GSO/GRO stream" "$r" ">=" $lim
    echo "| ib_${t}_bw 64 KiB (GB/s) vs UDP stream | $L | $v | $gso | $r | ≥ $lim |"
  done
  v=$(med ${tr}_write_bw)
  echo "| ib_write_bw 64 KiB (GB/s) vs memcpy 64 KiB | $L | $v | $fmemcpy | $(ratio "$v" "$fmemcpy") | — |"
  v=$(med ${tr}_msgrate)
  echo "| ib_write_bw 64 B MsgRate (Mpps) vs UDP 64 B datagram rate | $L | $v | $frate | $(ratio "$v" "$frate") | — |"
  one=$(med ${tr}_write_bw); v=$(med ${tr}_two_pairs); r=$(ratio "$v" "$one")
  note "$L two ib_write_bw pairs' aggregate vs one pair" "$r" ">=" 0.8
  echo "| 2 concurrent ib_write_bw 64 KiB pairs, aggregate (GB/s) vs one pair | $L | $v | $one | $r | ≥ 0.8 |"
  v=$(med ${tr}_write_cpu)
  echo "| ib_write_bw 64 KiB CPU user+sys both sides (s per GB) vs UDP stream's | $L | $v | $gso_cpu | $(ratio "$v" "$gso_cpu") | — |"
  first=""; read -r base_n _ <<<"$SCALE"
  for n in $SCALE; do
    v=$(med ${tr}_scale_$n); [[ -z $first ]] && first=$v
    echo "| qp_scale $n QP pairs, SEND exchange (µs per message) vs $base_n pairs | $L | $v | $first | $(ratio "$v" "$first") | — |"
  done
done
echo
echo "Targets (issue 7), as ratios of medians in this run:"
echo
printf '%s\n' "${NOTES[@]}"
