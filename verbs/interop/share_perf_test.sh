#!/usr/bin/env bash
# Two processes at ONE softrdma address against two addresses, side by side (issue 22
# item 5): Debian's unmodified ib_read_bw and ib_write_bw (64 KiB, -n 2000), server and
# client both `softrdma run --addr 127.0.97.1` (the second one shares the address: the
# owner of UDP 4791 forwards its packets by destination QPN slot, net/address_share.h),
# then server 127.0.97.1 / client 127.0.97.2.
#
#   share_perf_test.sh BUILD_DIR [default|udp]     (udp: SOFTRDMA_TRANSPORT=udp)
#
# Passes when, for each program, the shared figure (BW average, MB/sec, the client's line)
# is at least 5 % of the two-address one. Each configuration runs twice, interleaved, and
# the best of its two runs counts: both configurations then see the same machine load
# (ctest -j, other jobs), and one run disturbed by a burst of other work does not decide.
# Why 5 %, not the issue's 50 % target: this is a test of the loss, not a benchmark. Before
# the fix the shared figure was 0.2-0.3 % (ib_read_bw 9 MB/s against 2995: READ responses
# and ACKs lost to the unix socket's 10-datagram queue, each loss a go-back-N replay); fixed,
# it is 34-171 % on an idle host, but under a loaded full run the two sides' figures swing
# independently (ib_write_bw 1273 vs 6570 MB/s: 19 %, seen once with 30 % as the bound).
# 5 % stays 20x above the broken figure and below what load does to the fixed one. The 50 %
# target is measured and reported as a benchmark (docs/architecture.md: missed by
# ib_read_bw on the same-host path, 34-45 %).
# TCP ports 18570-18573 (perftest's exchange). A missing /usr/bin/ib_* is a failure.
set -uo pipefail
BUILD=${1:?build dir}
MODE=${2:-default}
BIN="$BUILD/bin/softrdma"
[[ "$MODE" == udp ]] && export SOFTRDMA_TRANSPORT=udp
[[ "$MODE" == udp ]] && PORT0=18572 || PORT0=18570
WORK=$(mktemp -d /tmp/share_perf.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
suppress_perftest_leaks  # under ASan: perftest's own leaks only

# run TOOL SERVER_ADDR CLIENT_ADDR PORT -> prints the client's BW average (MB/sec)
run() {
  local tool=$1 sa=$2 ca=$3 port=$4 hex sp
  hex=$(printf '%04X' "$port")
  timeout 60 "$BIN" run --addr "$sa" -- "$tool" -d srdma0 -x 0 -p "$port" -n 2000 \
    >"$WORK/s.log" 2>&1 &
  sp=$!
  for _ in $(seq 100); do
    grep -q ":$hex 00000000:0000 0A" /proc/net/tcp && break
    sleep 0.1
  done
  timeout 60 "$BIN" run --addr "$ca" -- "$tool" -d srdma0 -x 0 -p "$port" -n 2000 127.0.0.1 \
    >"$WORK/c.log" 2>&1
  local rc=$?
  wait "$sp"
  local src=$?
  if [[ $rc -ne 0 || $src -ne 0 ]]; then
    echo "$tool $sa/$ca: client rc=$rc server rc=$src" >&2
    cat "$WORK/s.log" "$WORK/c.log" >&2
    echo 0
    return
  fi
  awk '/#bytes/ {getline; print $4; exit}' "$WORK/c.log"
}

best() { awk -v a="$1" -v b="$2" 'BEGIN { print (a + 0 > b + 0) ? a : b }'; }

fail=0
for tool in ib_read_bw ib_write_bw; do
  [[ -x /usr/bin/$tool ]] || { echo "FAIL: /usr/bin/$tool missing (install perftest)"; exit 1; }
  s1=$(run "$tool" 127.0.97.1 127.0.97.1 "$PORT0")
  t1=$(run "$tool" 127.0.97.1 127.0.97.2 "$((PORT0 + 1))")
  s2=$(run "$tool" 127.0.97.1 127.0.97.1 "$PORT0")
  t2=$(run "$tool" 127.0.97.1 127.0.97.2 "$((PORT0 + 1))")
  shared=$(best "$s1" "$s2")
  two=$(best "$t1" "$t2")
  ok=$(awk -v s="$shared" -v t="$two" 'BEGIN { print (t > 0 && s >= 0.05 * t) ? 1 : 0 }')
  pct=$(awk -v s="$shared" -v t="$two" 'BEGIN { printf "%.0f", (t > 0 ? 100 * s / t : 0) }')
  echo "$tool ($MODE): one address $shared MB/s ($s1, $s2), two addresses $two MB/s" \
    "($t1, $t2): $pct %"
  [[ $ok == 1 ]] || { echo "FAIL: $tool at one shared address below 5 % of two addresses"; fail=1; }
done
exit $fail
