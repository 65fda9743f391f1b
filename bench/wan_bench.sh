#!/usr/bin/env bash
# Goodput of a large RDMA WRITE (or READ) stream over an emulated wide-area link (issue 9,
# item 2; issue 23): go-back-N against selective retransmission, at several loss rates.
#
#   bash bench/wan_bench.sh            (needs a built build/ tree and perftest's ib_write_bw)
#
# Environment:
#   WAN_RATE     link rate, each direction (1gbit)
#   WAN_DELAY    one-way delay (10ms: a 20 ms round trip)
#   WAN_LOSSES   random loss rates in %, each direction (ACKs and NAKs are lost too) ("0 0.1 1")
#   WAN_MB       MiB written per run: WAN_MB messages of 1 MiB (256)
#   WAN_OP       write (ib_write_bw) or read (ib_read_bw: the client READs from the server, so
#                the data crosses the link as READ responses; lost responses are what
#                selective mode places around and asks for alone) or send (ib_send_bw, rx
#                depth = tx depth: SENDs beyond a gap are kept in selective mode and executed
#                in order, where go-back-N resends them) (write)
#   WAN_MODES    recovery and congestion control ("gbn sel gbn+dcqcn sel+dcqcn"): gbn / sel =
#                SOFTRDMA_SELECTIVE_RETX=0 / 1 on both sides; +dcqcn adds SOFTRDMA_CC=dcqcn and
#                ECN marking on the link above WAN_ECN of backlog (the others: SOFTRDMA_CC=none,
#                no marking)
#   WAN_ECN      ECN marking threshold for the +dcqcn modes (0.25bdp)
#   WAN_TDF      time dilation factor K (1): both processes run under `softrdma run --tdf K`,
#                so WAN_RATE and WAN_DELAY are virtual (100gbit at K = 50 is paced at
#                2 Gbit/s real). perftest's BW average is virtual already (it calibrates
#                its TSC against the dilated gettimeofday; docs/wide-area.md); the wall
#                seconds are divided by K: every figure printed is virtual. Choose K so
#                that WAN_RATE / K is well below what the machine carries
#                (docs/wide-area.md, Time dilation)
#   WAN_TIMEOUT  real seconds a run may take before it is killed (600)
#   WAN_OUT      keep each run's logs and counter snapshots in this directory (default: a
#                temporary one, removed at exit), and append one CSV row per run to
#                WAN_OUT/wan_bench.csv (header written when the file is new; runs of several
#                invocations accumulate): op (write / read), rate (WAN_RATE as given),
#                rtt_ms (round trip, ms), tdf (K), mb (MiB per run), loss_pct (random loss,
#                % each direction), mode (as in WAN_MODES), goodput_mbs (perftest's BW
#                average, MB/s = 10^6 B/s, virtual), pct_of_link (% of WAN_RATE), virtual_s
#                (wall seconds ÷ K), resent_pkts, timeouts, queue_drops (the client's
#                retransmitted_pkts, retransmit_timeouts, wan_dropped_queue). A field that
#                was not measured (perftest printed no BW average, no counter snapshot) is
#                empty, never 0. `python3 bench/plot_wan.py -o out.png WAN_OUT/wan_bench.csv`
#                draws it
#   WAN_TX_DEPTH ib_write_bw's tx depth, 1 MiB WRITEs outstanding (default: 3 bandwidth-delay
#                products plus perftest's --cq-mod of 100, at least 128 — 128 MiB would cap a
#                100 Gbit/s × 50 ms path, 625 MB, at a fifth of its rate; 1.5 BDPs held it at
#                40.8 % of the link at 0.1 % loss, 3 at 62.9 %: a WRITE completes only once its
#                lost packets are repaired, ~1.5 round trips after they left, so the
#                transport's 1.5 BDPs in flight need about as much again waiting for
#                completion. ib_write_bw signals one WRITE in 100 and posts again only when
#                that one completes, so up to 100 more are waiting for a CQE: at 10 Gbit/s ×
#                50 ms, 100 MiB is 1.7 BDPs, and 3 BDPs alone, 179 WRITEs, read 65.6 % at 1 %
#                loss and 93.3 % at none against 85.1 % and 95.4 % with 279; at 100 ms
#                the default, 458, read 79.3 % at 1 % and 600 read 85.7 %)
#
# Each run: Debian's unmodified ib_write_bw (-s 1 MiB, -n WAN_MB, tx depth WAN_TX_DEPTH, MTU 4096,
# QP timeout exponent at least 15 = 134 ms and at least 4 round trips, so that a full 1-BDP
# queue does not fire it) between two softrdma processes whose
# devices both carry SOFTRDMA_WAN="delay=…,rate=…,queue=1bdp,loss=…" (the queue holds one
# bandwidth-delay product, rate × round trip). Goodput = perftest's BW average (MB/sec =
# 2^20 B/s), as % of the link rate (the link carries headers too: 4096 B of payload per
# ~4,150 B on the link, so ~98.7 % is the ceiling). Prints a markdown table, then the
# counters that explain it (packets sent again, selective NAKs, timeouts, emulator drops;
# the next-to-last column is the server's device: for READs, the responses it put onto the
# link and its emulated queue dropped; the last, packets dropped by a full socket buffer on
# each side — the machine falling behind in real time: a note after the table then says to
# raise WAN_TDF).
# Nothing here is a test: figures depend on the machine and its load.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
RATE=${WAN_RATE:-1gbit}
DELAY=${WAN_DELAY:-10ms}
LOSSES=${WAN_LOSSES:-"0 0.1 1"}
MB=${WAN_MB:-256}
OP=${WAN_OP:-write}
[[ $OP == write || $OP == read || $OP == send ]] ||
  { echo "WAN_OP: write, read or send, not $OP" >&2; exit 1; }
PERF=ib_${OP}_bw
MODES=${WAN_MODES:-"gbn sel gbn+dcqcn sel+dcqcn"}
ECN=${WAN_ECN:-0.25bdp}
TDF=${WAN_TDF:-1}
RUN_TIMEOUT=${WAN_TIMEOUT:-600}
tdf_args=()
[[ $TDF != 1 ]] && tdf_args=(--tdf "$TDF")
B=build
[[ -x $B/bin/softrdma ]] || { echo "build first: cmake --build build --target softrdma" >&2; exit 1; }
command -v "$PERF" >/dev/null || { echo "needs perftest ($PERF)" >&2; exit 1; }
if [[ -n ${WAN_OUT:-} ]]; then
  OUT=$WAN_OUT
  mkdir -p "$OUT"
else
  OUT=$(mktemp -d /tmp/softrdma-wan-bench.XXXXXX)
  trap 'rm -rf "$OUT"' EXIT
fi
port=19400

# Link rate in bit/s from "1gbit", "500mbit", "10g".
rate_bps() {
  awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u);
    m = (u ~ /^g/) ? 1e9 : (u ~ /^m/) ? 1e6 : (u ~ /^k/) ? 1e3 : 1; print n * m }'
}
BPS=$(rate_bps "$RATE")
# One-way delay in ms from "10ms", "1.5ms", "200us".
delay_ms() {
  awk -v d="$1" 'BEGIN { n = d + 0; u = tolower(d); sub(/^[0-9.]+/, "", u);
    print (u ~ /^us/) ? n / 1000 : (u ~ /^s/) ? n * 1000 : n }'
}
RTT_MS=$(awk -v d="$(delay_ms "$DELAY")" 'BEGIN { print 2 * d }')
# 1 MiB WRITEs outstanding: 3 bandwidth-delay products + ib_write_bw's CQ moderation (100), at
# least 128.
TX_DEPTH=${WAN_TX_DEPTH:-$(awk -v b="$BPS" -v r="$RTT_MS" 'BEGIN {
  d = int(3 * b / 8 * r / 1000 / 1048576) + 1 + 100; print (d < 128) ? 128 : d }')}
# The QP's local ACK timeout (4.096 µs × 2^u, IBTA 12.7.34): at least 15 and 4 round trips.
QP_TIMEOUT=$(awk -v r="$RTT_MS" 'BEGIN { u = 15; while (4.096e-3 * 2 ^ u < 4 * r && u < 31) u++; print u }')

# Logs of one run: OP-RATE-RTTms-MODE-LOSS.{srv,cli,stat} (several invocations may share WAN_OUT).
log_name() { echo "$OUT/$OP-$RATE-${RTT_MS}ms-$1-$2"; }

# run MODE LOSS → prints "goodput_MBps pct seconds" and leaves the logs in $(log_name MODE LOSS).*
run() {
  local mode=$1 loss=$2 sel=1 cc=none
  [[ $mode == gbn* ]] && sel=0
  local wan="delay=$DELAY,rate=$RATE,queue=1bdp,loss=$loss%,seed=$((port * 7))"
  [[ $mode == *+dcqcn ]] && cc=dcqcn && wan="$wan,ecn=$ECN"
  local log
  log=$(log_name "$mode" "$loss")
  port=$((port + 1))
  local args=(-d srdma0 -x 0 -s 1048576 -n "$MB" -m 4096 -u "$QP_TIMEOUT" -t "$TX_DEPTH" -F -p "$port")
  [[ $OP == send ]] && args+=(-r "$TX_DEPTH")
  SOFTRDMA_CC=$cc SOFTRDMA_SELECTIVE_RETX=$sel SOFTRDMA_TRANSPORT=udp timeout "$RUN_TIMEOUT" \
    $B/bin/softrdma run "${tdf_args[@]}" --addr 127.0.33.1 --wan "$wan" -- "$PERF" "${args[@]}" >"$log.srv" 2>&1 &
  local spid=$!
  sleep 0.5
  local t0=$(date +%s.%N)
  SOFTRDMA_CC=$cc SOFTRDMA_SELECTIVE_RETX=$sel SOFTRDMA_TRANSPORT=udp timeout "$RUN_TIMEOUT" \
    $B/bin/softrdma run "${tdf_args[@]}" --addr 127.0.33.2 --wan "$wan" -- "$PERF" "${args[@]}" 127.0.0.1 \
    >"$log.cli" 2>&1 &
  local cpid=$!
  # The counters of the client's device while it runs: the last snapshot that still lists
  # it survives (one taken as it exits lacks it, and its row would read 0).
  while kill -0 $cpid 2>/dev/null; do
    $B/bin/softrdma stat --json >"$log.stat.tmp" 2>/dev/null &&
      grep -q '"127.0.33.2"' "$log.stat.tmp" && mv "$log.stat.tmp" "$log.stat"
    sleep 0.2
  done
  wait $cpid $spid
  local t1=$(date +%s.%N)
  # perftest's MB/sec (2^20 B/s) is virtual already; the wall time is real: ÷ K.
  awk -v bps="$BPS" -v k="$TDF" -v t="$(echo "$t1 - $t0" | bc)" '/BW average/ {getline;
      printf "%.1f %.1f %.2f\n", $4 * 1048576 / 1e6, 100 * $4 * 1048576 * 8 / bps, t / k; f = 1; exit}
      END { if (!f) printf "nan nan %.2f\n", t / k }' "$log.cli"
}

# counter NAME FILE [ADDRESS [ABSENT]] → a device's counter in a `softrdma stat --json`
# snapshot; the client's (127.0.33.2) unless ADDRESS names the server's (127.0.33.1). ABSENT
# (default 0) if the snapshot, the device or the counter is missing: the CSV passes "" (not
# measured), the markdown table keeps 0.
counter() {
  local absent=${4-0}
  python3 - "$1" "$2" "${3:-127.0.33.2}" "$absent" <<'PY' 2>/dev/null || echo "$absent"
import json, sys
name, path, addr, absent = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
devs = [d for d in json.load(open(path))["devices"] if d["address"] == addr]
print(devs[-1]["counters"].get(name, absent) if devs else absent)
PY
}

# One CSV row per run in $WAN_OUT/wan_bench.csv (only when WAN_OUT is set: the temporary
# directory is removed at exit); "nan" (no BW average) becomes an empty field.
CSV=
CSV_COLUMNS=op,rate,rtt_ms,tdf,mb,loss_pct,mode,goodput_mbs,pct_of_link,virtual_s,resent_pkts,timeouts,queue_drops
if [[ -n ${WAN_OUT:-} ]]; then
  CSV=$OUT/wan_bench.csv
  [[ -s $CSV ]] || echo "$CSV_COLUMNS" >"$CSV"
fi
csv_row() {  # MODE LOSS MBPS PCT SECS STATFILE
  [[ -n $CSV ]] || return 0
  local mbps=$3 pct=$4
  [[ $mbps == nan ]] && mbps=
  [[ $pct == nan ]] && pct=
  local resent timeouts drops
  resent=$(counter retransmitted_pkts "$6" 127.0.33.2 "")
  timeouts=$(counter retransmit_timeouts "$6" 127.0.33.2 "")
  drops=$(counter wan_dropped_queue "$6" 127.0.33.2 "")
  echo "$OP,$RATE,$RTT_MS,$TDF,$MB,$2,$1,$mbps,$pct,$5,$resent,$timeouts,$drops" >>"$CSV"
}

echo "WAN link: $RATE, one-way delay $DELAY (RTT $RTT_MS ms), queue 1 BDP; $MB MiB of 1 MiB RDMA ${OP^^}s ($PERF); tx depth $TX_DEPTH, QP timeout $QP_TIMEOUT; time dilation K = $TDF (figures virtual)"
echo
echo "| loss | recovery | CC | goodput MB/s | % of link | virtual s | packets sent again | resends sent again | selective NAKs sent / received | READ responses placed ahead | READ gap requests | timeouts | queue drops | CNPs | server's packets onto the link / dropped by its queue | socket overflows server / client |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
overflows=0
for loss in $LOSSES; do
  for mode in $MODES; do
    read -r mbps pct secs < <(run "$mode" "$loss")
    st="$(log_name "$mode" "$loss").stat"
    name=$([[ $mode == gbn* ]] && echo "go-back-N" || echo "selective")
    cc=$([[ $mode == *+dcqcn ]] && echo "DCQCN" || echo "none")
    srv_over=$(counter rcvd_socket_overflows "$st" 127.0.33.1)
    cli_over=$(counter rcvd_socket_overflows "$st")
    echo "| $loss % | $name | $cc | $mbps | $pct | $secs | $(counter retransmitted_pkts "$st") | $(counter resend_again_pkts "$st") | $(counter selective_nak_sent "$st" 127.0.33.1) / $(counter selective_nak_rcvd "$st") | $(counter ooo_read_responses "$st") | $(counter read_gap_requests "$st") | $(counter retransmit_timeouts "$st") | $(counter wan_dropped_queue "$st") | $(counter cnp_rcvd "$st") | $(counter wan_shaped "$st" 127.0.33.1) / $(counter wan_dropped_queue "$st" 127.0.33.1) | $srv_over / $cli_over |"
    overflows=$((overflows + srv_over + cli_over))
    csv_row "$mode" "$loss" "$mbps" "$pct" "$secs" "$st"
  done
done
echo
# A full socket buffer is this machine falling behind in real time, not the emulated link:
# the figures then measure the machine (docs/wide-area.md, "Choosing K").
if ((overflows > 0)); then
  echo "note: $overflows packets were dropped by a full socket buffer: $RATE at K = $TDF is $(awk -v b="$BPS" -v k="$TDF" 'BEGIN { printf "%.2f", b / k / 1e9 }') Gbit/s of real time, more than this machine carried here beside the two polling perftest processes; raise WAN_TDF"
  echo
fi
echo "$(date -u +%F) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -n $CSV ]]; then
  echo "CSV: $CSV"
else
  echo "CSV: none written (set WAN_OUT=DIR for DIR/wan_bench.csv)"
fi
