#!/usr/bin/env bash
# A multi-host lab on one machine (issue 22, "multi-host"): network namespaces made here, each
# one a "host" with its own softrdma device, joined by veth pairs (two hosts) or a bridge that
# lives in its own namespace (four hosts) — with softrdma's DEFAULT settings: no
# SOFTRDMA_TRANSPORT, SOFTRDMA_GSO or other workaround variable (the ones a caller set are
# removed). What runs between the namespaces is what would run between two machines
# (docs/multi-host.md, "Two machines"):
#
#   topo_test.sh BUILD_DIR CASE
#
# CASE (namespaces srnsT<tag>1, srnsT<tag>2, ...; subnet 198.18.<net>.0/24, host k at .k;
# TCP ports 18400 + 5 * (net - 20) ... + 4; veth MTU 1500 unless said otherwise):
#   perftest    (pf, 20)  ibv_devinfo in both namespaces says active_mtu 1024 (MTU 1500);
#                         ib_send_lat, ib_write_bw, ib_read_bw (-n 200; both sides print
#                         "Mtu : 1024[B]" and a result row), rping -C 50 -V (data verified)
#   ud          (ud, 21)  ibv_ud_pingpong -g 0 -s 1024 -n 500 -c (received buffers checked)
#   allreduce2  (a2, 22)  all_reduce_perf -c 1 with 2 ranks, one per namespace, started with
#                         Slurm's variables (SLURM_PROCID, SLURM_NTASKS, SLURM_NNODES=2,
#                         SLURM_JOB_ID) and SOFTRDMA_CCL_MASTER=<rank 0's address>:port (what
#                         the ccl bootstrap asks for when a Slurm job spans several nodes)
#   allreduce4  (a4, 23)  the same with 4 ranks in 4 namespaces joined by a bridge in a fifth
#                         (srnsTa4br), started with torchrun's variables (RANK, WORLD_SIZE,
#                         LOCAL_RANK=0, MASTER_ADDR=rank 0's address, MASTER_PORT); a bridge
#                         because every rank talks to every other one (recursive doubling,
#                         rings): one L2 segment, as a switch in a rack, instead of 6 veth
#                         pairs with per-pair addresses and routes
#   kv          (kv, 24)  kv-demo: decode with the metadata store in namespace 1, prefill in
#                         namespace 2; "blocks verified by decode: all match"
#   ucx         (ux, 25)  ucx_perftest tag_bw, tag_lat, put_bw (UCX_NET_DEVICES=srdma0:1
#                         UCX_TLS=rc_verbs,ud_verbs, as verbs/interop/ucx_test.sh); the
#                         client's Final: line checked
#   mpi_ucx     (mp, 26)  Open MPI `mpirun --mca pml ucx` run in namespace 1, its second
#                         host reached through an rsh agent (plm_rsh_agent) that is
#                         `ip netns exec` instead of ssh: mpi_allreduce (every size 16 B ...
#                         1 MiB, 0 wrong) and mpi_pingpong (PASS)
#   capture     (cp, 27)  tcpdump on namespace 1's veth during ib_write_bw -s 65536 -n 50;
#                         tshark decodes every frame as RoCEv2 (UDP 4791 -> InfiniBand) with
#                         RDMA Write First/Middle/Last (or Only) and Acknowledge, and every frame's
#                         ICRC is the one its bytes call for (tools/tests/pcap_icrc.py;
#                         tshark 4.0 shows the ICRC but does not check it). The veths get
#                         gso_max_segs 1: a veth, like a NIC with UDP segmentation offload,
#                         passes a GSO batch unsegmented, and tcpdump would see one datagram
#                         holding many RoCEv2 packets (docs/multi-host.md)
#   mtu9000     (mt, 28)  veth MTU 9000: ibv_devinfo active_mtu 4096, ib_write_bw (both sides
#                         "Mtu : 4096[B]") and ibv_ud_pingpong -s 4096 -c (one 4 KiB
#                         datagram per message, which needs the large MTU)
#   wan         (wn, 29)  both ranks of a 2-rank all_reduce_perf -c 1 (torchrun variables)
#                         with `softrdma run --wan delay=5ms,loss=1%` (10 ms RTT, 1 % loss
#                         each way): results checked (0 wrong), 8 B AllReduce >= 5 ms (the
#                         delay is really there; a lower bound, safe on a loaded host), and
#                         the devices' counters show WAN-held and loss-dropped packets;
#                         no rank logs IBV_WC_RETRY_EXC_ERR (before Device::drain_wan the
#                         link dropped the last ACK at its sender's close, every run)
#   libfabric   (lf, 30)  fi_pingpong -p verbs -e msg, then -e rdm (libfabric's verbs
#                         provider, verbs;ofi_rxm), 100 iterations of 64 B .. 1 MiB each
#   dapl        (dp, 31)  uDAPL's dtest (cma provider, one dat.conf entry per side at its
#                         address, as cm/interop/dapl_test.sh): PASSED on both sides
#
# Needs root with CAP_NET_ADMIN (ip netns add): otherwise it exits 77, which ctest reports as
# skipped (SKIP_RETURN_CODE), saying why. The namespaces are deleted at exit, also on failure
# (and first, if an interrupted run left them). Every process is bounded by `timeout`. A
# missing program (perftest, ibverbs-utils, rdmacm-utils, ucx-utils, openmpi-bin, tcpdump,
# tshark, python3) is a failure, never a skip. On failure the logs are printed.
set -uo pipefail

CASES="perftest ud allreduce2 allreduce4 kv ucx mpi_ucx capture mtu9000 wan libfabric dapl"
# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
case_test_args topo "$CASES" "$@"
require_softrdma_built
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$BUILD_DIR/bin

STEP_TIMEOUT=${TOPO_TIMEOUT:-90} # seconds per process
LISTEN_WAIT=30
SKIP=77

# Defaults only: a variable the caller exported would change what is tested.
unset SOFTRDMA_TRANSPORT SOFTRDMA_GSO SOFTRDMA_NETEM SOFTRDMA_WAN SOFTRDMA_PCAP \
  SOFTRDMA_SELECTIVE_RETX SOFTRDMA_CC SOFTRDMA_SPIN_US SOFTRDMA_ADDR SOFTRDMA_CCL_MASTER \
  RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT UCX_UD_VERBS_ETH_DGID_CHECK \
  UCX_IB_ETH_DGID_CHECK

# tag, subnet (198.18.NET.0/24), number of hosts, veth MTU.
MTU=1500 HOSTS=2
case "$CASE" in
  perftest) TAG=pf NET=20 ;;
  ud) TAG=ud NET=21 ;;
  allreduce2) TAG=a2 NET=22 ;;
  allreduce4) TAG=a4 NET=23 HOSTS=4 ;;
  kv) TAG=kv NET=24 ;;
  ucx) TAG=ux NET=25 ;;
  mpi_ucx) TAG=mp NET=26 ;;
  capture) TAG=cp NET=27 ;;
  mtu9000) TAG=mt NET=28 MTU=9000 ;;
  wan) TAG=wn NET=29 ;;
  libfabric) TAG=lf NET=30 ;;
  dapl) TAG=dp NET=31 ;;
esac
PORT=$((18400 + 5 * (NET - 20))) # this case's TCP ports: PORT ... PORT+4
NS=() ADDR=()
for ((k = 1; k <= HOSTS; k++)); do
  NS+=("srnsT$TAG$k")
  ADDR+=("198.18.$NET.$k")
done
BRIDGE_NS=""
((HOSTS > 2)) && BRIDGE_NS=srnsT${TAG}br

if ((EUID != 0)); then
  echo "SKIP [$TEST_NAME]: needs root with CAP_NET_ADMIN to create network namespaces" >&2
  exit $SKIP
fi

# Programs: a missing one is a failure.
need() {
  local p
  for p in "$@"; do
    command -v "$p" >/dev/null || fail "$p is missing (install the Debian packages: bash scripts/deps.sh)"
  done
}
need ip timeout stdbuf
case "$CASE" in
  perftest) need ibv_devinfo ib_send_lat ib_write_bw ib_read_bw rping ;;
  ud) need ibv_ud_pingpong ;;
  ucx) need ucx_perftest ;;
  mpi_ucx) need mpirun ;;
  capture) need ib_write_bw tcpdump tshark python3 ;;
  mtu9000) need ibv_devinfo ib_write_bw ibv_ud_pingpong ;;
  wan) need python3 ;;
  libfabric) need fi_pingpong ;;
  dapl) need dtest ;;
esac

make_work_dir "softrdma-topo-$CASE"
suppress_perftest_leaks # under ASan: perftest's own leaks only
PIDS=()
ALL_NS=("${NS[@]}")
[[ -n $BRIDGE_NS ]] && ALL_NS+=("$BRIDGE_NS")
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  local p ns
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  # Programs that exit without closing their device (rping) leave their mailbox and share
  # files; those of a namespace can only be cleaned from inside it.
  for ns in "${NS[@]}"; do
    ip netns exec "$ns" "$SOFTRDMA" stat --clean >/dev/null 2>&1
  done
  for ns in "${ALL_NS[@]}"; do ip netns del "$ns" 2>/dev/null; done
  return 0
}

# ---- the topology ----
for ns in "${ALL_NS[@]}"; do ip netns del "$ns" 2>/dev/null; done
if ! ip netns add "${NS[0]}" 2>"$WORK/netns.err"; then
  echo "SKIP [$TEST_NAME]: cannot create a network namespace (needs CAP_NET_ADMIN):" \
    "$(cat "$WORK/netns.err")" >&2
  exit $SKIP
fi
for ns in "${ALL_NS[@]:1}"; do ip netns add "$ns" || fail "ip netns add $ns"; done
if [[ -z $BRIDGE_NS ]]; then
  # Two hosts: one veth pair, as a cable between two NICs.
  ip link add "${NS[0]}v" netns "${NS[0]}" type veth peer name "${NS[1]}v" netns "${NS[1]}" ||
    fail "cannot create a veth pair between ${NS[0]} and ${NS[1]}"
else
  # Several hosts: a bridge (the switch) in its own namespace, one veth pair per host.
  ip -n "$BRIDGE_NS" link add br0 type bridge || fail "cannot create a bridge in $BRIDGE_NS"
  ip -n "$BRIDGE_NS" link set br0 up || fail "br0 up"
  for ns in "${NS[@]}"; do
    ip link add "${ns}v" netns "$ns" type veth peer name "${ns}p" netns "$BRIDGE_NS" ||
      fail "cannot create a veth pair between $ns and $BRIDGE_NS"
    ip -n "$BRIDGE_NS" link set "${ns}p" mtu "$MTU" master br0 up || fail "${ns}p on br0"
  done
fi
for k in "${!NS[@]}"; do
  ns=${NS[k]}
  ip -n "$ns" link set "${ns}v" mtu "$MTU" || fail "MTU $MTU on ${ns}v"
  ip -n "$ns" addr add "${ADDR[k]}/24" dev "${ns}v" || fail "address ${ADDR[k]} in $ns"
  ip -n "$ns" link set lo up || fail "lo up in $ns"
  ip -n "$ns" link set "${ns}v" up || fail "${ns}v up in $ns"
done
echo "topology: ${NS[*]}${BRIDGE_NS:+ (bridge br0 in $BRIDGE_NS)}, 198.18.$NET.0/24, MTU $MTU"

# ---- helpers ----
# in_ns NS ADDR LOG [VAR=VALUE...] -- PROGRAM ARGS...: runs PROGRAM through `softrdma run
# --addr ADDR ${SR_OPTS[@]}` inside NS in the background with the given variables, bounded by
# STEP_TIMEOUT, output to LOG; its pid is in LAST_PID. stdbuf: line-buffered stdout, so a log
# killed by timeout still shows how far it got (after `softrdma run`, whose preloads come
# first).
SR_OPTS=()
in_ns() {
  local ns=$1 addr=$2 log=$3 vars=()
  shift 3
  while (($#)) && [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  echo "$ns: ${vars[*]} softrdma run --addr $addr ${SR_OPTS[*]} -- $*" >>"$WORK/commands"
  ip netns exec "$ns" env "${vars[@]}" timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run \
    --addr "$addr" "${SR_OPTS[@]}" -- stdbuf -oL "$@" >"$log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

# ns_tcp_listening NS PORT: whether something in NS listens on TCP PORT (/proc/net/tcp is the
# reader's namespace's).
ns_tcp_listening() {
  ip netns exec "$1" bash -c "$(declare -f tcp_listening); tcp_listening $2"
}

# wait_tcp NS PID PORT LOG: waits until PID (a server in NS) listens on TCP PORT.
wait_tcp() {
  local ns=$1 pid=$2 port=$3 log=$4 waited=0 rc
  until ns_tcp_listening "$ns" "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rc=0
      wait "$pid" || rc=$?
      show_logs "$log"
      fail "server in $ns exited ($(status_text $rc)) before listening on TCP port $port"
    fi
    ((waited < LISTEN_WAIT * 10)) || { show_logs "$log"; fail "server in $ns not listening on $port"; }
    sleep 0.1
    waited=$((waited + 1))
  done
}

# wait_ok PID NAME LOG...: waits for PID; fails (showing the LOGs) unless it exits 0.
wait_ok() {
  local pid=$1 name=$2 rc=0
  shift 2
  wait "$pid" || rc=$?
  if ((rc != 0)); then
    cat "$WORK/commands" >&2
    show_logs "$@"
    fail "$name exited with $(status_text $rc)"
  fi
}

# finish_pair NAME SPID CPID: waits for the client, then the server (given a few seconds after
# a failed client, then stopped); both must exit 0; fails showing both logs.
finish_pair() {
  local name=$1 spid=$2 cpid=$3 src=0 crc=0 i
  wait "$cpid" || crc=$?
  if ((crc != 0)); then
    for ((i = 0; i < 50; i++)); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
    kill "$spid" 2>/dev/null
  fi
  wait "$spid" || src=$?
  PAIR_RC=$((src != 0 || crc != 0))
  ((src == 0)) || echo "$name: server exited with $(status_text $src)" >&2
  ((crc == 0)) || echo "$name: client exited with $(status_text $crc)" >&2
}

# check_log LOG SIDE RE...: LOG has a line matching each extended regexp RE and no error line.
check_log() {
  local log=$1 side=$2 re
  shift 2
  if grep -E -i 'completion with error|couldn.?t|failed|unable to|mismatch|error' "$log" >"$WORK/errors"; then
    echo "$side: error messages in its log:" >&2
    cat "$WORK/errors" >&2
    return 1
  fi
  for re in "$@"; do
    grep -qE -- "$re" "$log" || { echo "$side: no line matching '$re'" >&2; return 1; }
  done
}

# A perftest result row of SIZE bytes: size, iterations, then a number.
row() { echo "^ *$1 +[0-9]+ +[0-9.]+"; }
mtu_line() { echo "^ *Mtu +: +$1\[B\]"; }

# pair NAME PORT SRE CRE PROGRAM ARGS...: PROGRAM ARGS (server) in NS[0] at ADDR[0], waits
# until it listens on TCP PORT, then PROGRAM ARGS ADDR[0] (client) in NS[1]; both must exit 0
# with logs matching SRE / CRE ('|'-separated list of regexps; empty: none) and no errors.
# perftest's own CPU-clock measurement can fail on a busy host ("Correlation coefficient
# r^2 ... < 0.9", figures void): that alone is retried, twice at most (not softrdma's).
pair() {
  local name=$1 port=$2 sre=$3 cre=$4 attempt
  shift 4
  for attempt in 1 2 3; do
    local slog="$WORK/$name.server.log" clog="$WORK/$name.client.log"
    in_ns "${NS[0]}" "${ADDR[0]}" "$slog" -- "$@"
    local spid=$LAST_PID
    wait_tcp "${NS[0]}" "$spid" "$port" "$slog"
    in_ns "${NS[1]}" "${ADDR[1]}" "$clog" -- "$@" "${ADDR[0]}"
    finish_pair "$name" "$spid" "$LAST_PID"
    local ok=$((!PAIR_RC)) sres cres
    IFS='|' read -r -a sres <<<"$sre"
    IFS='|' read -r -a cres <<<"$cre"
    if ((ok)); then
      check_log "$slog" "$name server" "${sres[@]}" || ok=0
      check_log "$clog" "$name client" "${cres[@]}" || ok=0
    fi
    if ((ok)); then
      echo "ok: $name (${cres[0]:+$(grep -m1 -E -- "${cres[0]}" "$clog" | tr -s ' \t' ' ')})"
      return 0
    fi
    if grep -q 'Correlation coefficient r^2' "$slog" "$clog" && ((attempt < 3)); then
      echo "$name: perftest could not measure the CPU clock (host too busy): retrying" >&2
      continue
    fi
    cat "$WORK/commands" >&2
    show_logs "$slog" "$clog"
    fail "$name"
  done
}

# ibv_devinfo in every namespace must report active_mtu WANT (the IB MTU that fits the veth's).
check_devinfo_mtu() {
  local want=$1 k log
  for k in "${!NS[@]}"; do
    log="$WORK/devinfo.$k.log"
    in_ns "${NS[k]}" "${ADDR[k]}" "$log" -- ibv_devinfo -v
    wait_ok "$LAST_PID" "ibv_devinfo in ${NS[k]}" "$log"
    grep -qE "active_mtu:[[:space:]]+$want \(" "$log" ||
      { show_logs "$log"; fail "ibv_devinfo in ${NS[k]}: active_mtu is not $want (veth MTU $MTU)"; }
  done
  echo "ok: ibv_devinfo active_mtu $want in ${NS[*]} (veth MTU $MTU)"
}

# check_allreduce LOG: an all_reduce_perf rank-0 table with #wrong 0 everywhere, N rows.
check_allreduce() {
  local log=$1 want_rows=$2 rows bad
  rows=$(grep -cE '^ +[0-9]+ +[0-9]+ ' "$log")
  bad=$(awk '/^ +[0-9]+ +[0-9]+ / { if (NF != 13 || $9 != "0" || $13 != "0") print }' "$log")
  [[ $rows == "$want_rows" && -z $bad ]] && grep -q '^# Out of bounds values : 0 OK$' "$log" && return 0
  echo "all_reduce_perf: $rows result rows (want $want_rows), wrong or malformed rows: ${bad:-none}" >&2
  return 1
}

# allreduce NAME VARS_FUNC ARGS...: all_reduce_perf ARGS with one rank per namespace; rank r's
# launcher variables come from `VARS_FUNC r` (one VAR=VALUE per line). Checks rank 0's table.
allreduce() {
  local name=$1 vars_func=$2 r pids=() logs=() vars
  shift 2
  for r in "${!NS[@]}"; do
    mapfile -t vars < <("$vars_func" "$r")
    logs+=("$WORK/$name.$r.log")
    in_ns "${NS[r]}" "${ADDR[r]}" "${logs[r]}" "${vars[@]}" -- "$BIN/all_reduce_perf" "$@"
    pids+=("$LAST_PID")
  done
  local bad=0 rc
  for r in "${!pids[@]}"; do
    rc=0
    wait "${pids[r]}" || rc=$?
    ((rc == 0)) || { echo "$name: rank $r exited with $(status_text $rc)" >&2; bad=1; }
  done
  ((bad)) || check_allreduce "${logs[0]}" "$ALLREDUCE_ROWS" || bad=1
  # A QP that gave up after the collectives succeeded: the peer's last packet lost at its
  # close (through --wan: the emulated link's held ACK, fixed in Device::drain_wan).
  if grep -H 'RETRY_EXC_ERR' "${logs[@]}" >&2; then
    echo "$name: a QP exhausted its retries (above)" >&2
    bad=1
  fi
  if ((bad)); then
    cat "$WORK/commands" >&2
    show_logs "${logs[@]}"
    fail "$name"
  fi
  grep -E '^#  Rank|^ +[0-9]+ +[0-9]+ ' "${logs[0]}"
  echo "ok: $name ($HOSTS ranks, #wrong 0)"
}

slurm_vars() {
  echo "SLURM_PROCID=$1"
  echo "SLURM_LOCALID=0"
  echo "SLURM_NTASKS=$HOSTS"
  echo "SLURM_NNODES=$HOSTS"
  echo "SLURM_JOB_ID=4242"
  echo "SLURM_STEP_ID=0"
  echo "SOFTRDMA_CCL_MASTER=${ADDR[0]}:$PORT"
}
torchrun_vars() {
  echo "RANK=$1"
  echo "LOCAL_RANK=0"
  echo "WORLD_SIZE=$HOSTS"
  echo "MASTER_ADDR=${ADDR[0]}"
  echo "MASTER_PORT=$PORT" # ccl's bootstrap root listens on MASTER_PORT + 1
}

# ---- the cases ----
case_perftest() {
  check_devinfo_mtu 1024
  pair send_lat "$PORT" "$(mtu_line 1024)|$(row 2)" "$(row 2)|$(mtu_line 1024)" \
    ib_send_lat -d srdma0 -x 0 -p "$PORT" -n 200
  pair write_bw $((PORT + 1)) "$(mtu_line 1024)|$(row 65536)" "$(row 65536)|$(mtu_line 1024)" \
    ib_write_bw -d srdma0 -x 0 -p $((PORT + 1)) -n 200
  pair read_bw $((PORT + 2)) "$(mtu_line 1024)|$(row 65536)" "$(row 65536)|$(mtu_line 1024)" \
    ib_read_bw -d srdma0 -x 0 -p $((PORT + 2)) -n 200
  # rping: the RDMA-CM (no TCP socket to wait for: its --log info line says it listens);
  # -V verifies every buffer; both name the server's address.
  SR_OPTS=(--log info)
  local slog="$WORK/rping.server.log" clog="$WORK/rping.client.log"
  in_ns "${NS[0]}" "${ADDR[0]}" "$slog" -- rping -s -a "${ADDR[0]}" -p $((PORT + 3)) -C 50 -V
  local spid=$LAST_PID
  wait_for_cm_listener "${ADDR[0]}" $((PORT + 3)) "$spid" "$LISTEN_WAIT" "$slog"
  in_ns "${NS[1]}" "${ADDR[1]}" "$clog" -- rping -c -a "${ADDR[0]}" -p $((PORT + 3)) -C 50 -V
  finish_pair rping "$spid" "$LAST_PID"
  SR_OPTS=()
  if ((PAIR_RC)) || ! check_log "$slog" "rping server" || ! check_log "$clog" "rping client"; then
    cat "$WORK/commands" >&2
    show_logs "$slog" "$clog"
    fail "rping -C 50 -V"
  fi
  echo "ok: rping -C 50 -V"
}

case_ud() {
  pair ud_pingpong "$PORT" '[0-9]+ iters in [0-9.]+ seconds' '[0-9]+ iters in [0-9.]+ seconds' \
    ibv_ud_pingpong -g 0 -p "$PORT" -s 1024 -n 500 -c
}

case_allreduce2() {
  ALLREDUCE_ROWS=4
  allreduce allreduce_slurm slurm_vars -b 8 -e 1M -f 32 -c 1 -n 5 -w 2
}

case_allreduce4() {
  ALLREDUCE_ROWS=4
  allreduce allreduce_torchrun torchrun_vars -b 8 -e 1M -f 32 -c 1 -n 5 -w 2
}

case_kv() {
  local store="tcp://${ADDR[0]}:$PORT" dlog="$WORK/decode.log" plog="$WORK/prefill.log"
  local args=(--metadata "$store" --model qwen2.5-7b --tokens 512 --layer_ms 1 --requests 2)
  in_ns "${NS[0]}" "${ADDR[0]}" "$dlog" -- "$BIN/kv-demo" --role decode --serve-metadata "${args[@]}"
  local dpid=$LAST_PID
  wait_tcp "${NS[0]}" "$dpid" "$PORT" "$dlog"
  in_ns "${NS[1]}" "${ADDR[1]}" "$plog" -- "$BIN/kv-demo" --role prefill "${args[@]}"
  finish_pair kv-demo "$dpid" "$LAST_PID"
  if ((PAIR_RC)) || ! grep -q 'blocks verified by decode: all match' "$plog" ||
    ! grep -q 'layerwise.*layer transfers' "$plog"; then
    show_logs "$dlog" "$plog"
    fail "kv-demo prefill ${ADDR[1]} -> decode ${ADDR[0]}"
  fi
  grep -E '^ +(whole|layerwise) ' "$plog"
  echo "ok: kv-demo (blocks verified by decode: all match)"
}

# check_final LOG ITERS: ucx_perftest's `Final: iterations v50 avg overall bw_avg bw_overall
# rate_avg rate_overall` with ITERS iterations, latencies and rates positive (bandwidth may
# round to 0.00 for 8 B messages on a loaded host; verbs/interop/ucx_test.sh).
check_final() {
  awk -v want="$2" '
    function num(x) { return x ~ /^[0-9]*\.?[0-9]+$/ }
    $1 == "Final:" {
      finals++
      if (NF != 9 || $2 + 0 != want) bad++
      for (i = 3; i <= 9; i++)
        if (!num($i) || ((i <= 5 || i >= 8) && $i <= 0)) bad++
    }
    END { exit !(finals == 1 && !bad) }' "$1"
}

case_ucx() {
  export UCX_NET_DEVICES=srdma0:1 UCX_TLS=rc_verbs,ud_verbs
  local t args p=$PORT
  for t in tag_bw tag_lat put_bw; do
    case $t in
      tag_bw) args=(-t tag_bw -s 65536 -n 1000 -w 50) ;;
      tag_lat) args=(-t tag_lat -s 8 -n 1000 -w 50) ;;
      put_bw) args=(-t put_bw -d srdma0:1 -x rc_verbs -D zcopy -s 65536 -n 1000 -w 50) ;;
    esac
    local slog="$WORK/$t.server.log" clog="$WORK/$t.client.log"
    in_ns "${NS[0]}" "${ADDR[0]}" "$slog" -- ucx_perftest -p "$p"
    local spid=$LAST_PID
    wait_tcp "${NS[0]}" "$spid" "$p" "$slog"
    in_ns "${NS[1]}" "${ADDR[1]}" "$clog" -- ucx_perftest "${ADDR[0]}" -p "$p" "${args[@]}"
    finish_pair "$t" "$spid" "$LAST_PID"
    if ((PAIR_RC)) || grep -E 'UCX +(ERROR|FATAL)|Fatal:' "$slog" "$clog" >&2 ||
      ! check_final "$clog" 1000; then
      cat "$WORK/commands" >&2
      show_logs "$slog" "$clog"
      fail "ucx_perftest ${args[*]}"
    fi
    echo "ok: ucx_perftest $t ($(grep -m1 '^Final:' "$clog" | tr -s ' '))"
    p=$((p + 1))
  done
}

case_mpi_ucx() {
  local allreduce="$BIN/mpi_allreduce" pingpong="$BIN/mpi_pingpong"
  [[ -x $allreduce && -x $pingpong ]] ||
    fail "$allreduce or $pingpong not built (needs libopenmpi-dev at configure time)"
  # The rsh agent: Open MPI runs `AGENT HOST orted ...` for each host but its own; here HOST
  # is an address and the agent runs the command in the namespace that has it, as ssh would
  # on that machine.
  local agent="$WORK/netns_rsh"
  local k map=""
  for k in "${!NS[@]}"; do map+="  ${ADDR[k]}) ns=${NS[k]} ;;"$'\n'; done
  {
    cat <<'AGENT'
#!/bin/bash
host=$1
shift
case $host in
AGENT
    printf '%s' "$map"
    cat <<'AGENT'
  *) echo "netns_rsh: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" /bin/sh -c "$*"
AGENT
  } >"$agent"
  chmod +x "$agent"
  export UCX_NET_DEVICES=srdma0:1 UCX_TLS=rc_verbs,ud_verbs
  run_mpi() {
    local log=$1
    shift
    echo "${NS[0]}: mpirun --mca plm_rsh_agent $agent --mca pml ucx -np 1 --host ${ADDR[0]}" \
      "softrdma run --addr ${ADDR[0]} -- $* : -np 1 --host ${ADDR[1]} ..." >>"$WORK/commands"
    ip netns exec "${NS[0]}" timeout -k 5 "$STEP_TIMEOUT" mpirun --allow-run-as-root \
      --oversubscribe --bind-to none --mca plm_rsh_agent "$agent" --mca pml ucx \
      -x UCX_NET_DEVICES -x UCX_TLS \
      -np 1 --host "${ADDR[0]}" "$SOFTRDMA" run --addr "${ADDR[0]}" -- "$@" : \
      -np 1 --host "${ADDR[1]}" "$SOFTRDMA" run --addr "${ADDR[1]}" -- "$@" >"$log" 2>&1 &
    LAST_PID=$!
    PIDS+=("$LAST_PID")
    wait_ok "$LAST_PID" "mpirun $(basename "$1")" "$log"
  }
  local alog="$WORK/allreduce.log" plog="$WORK/pingpong.log"
  run_mpi "$alog" "$allreduce" -b 16 -e 1M -f 4 -n 5 -w 2 -c 1
  # Rows: size count type redop root, out-of-place and in-place time algbw busbw #wrong.
  awk 'BEGIN { want = 16 }
    $1 ~ /^[0-9]+$/ && $3 == "float" {
      rows++
      if ($1 + 0 != want || $9 != "0" || $NF != "0") bad++
      want *= 4
    }
    END { exit !(rows == 9 && !bad) }' "$alog" ||
    { show_logs "$alog"; fail "mpi_allreduce: want sizes 16 B ... 1 MiB with 0 wrong"; }
  grep -E '^ +[0-9]' "$alog"
  echo "ok: mpirun --mca pml ucx mpi_allreduce (2 namespaces, 0 wrong)"
  run_mpi "$plog" "$pingpong"
  grep -q '^mpi_pingpong: PASS' "$plog" || { show_logs "$plog"; fail "mpi_pingpong: no PASS line"; }
  echo "ok: mpirun --mca pml ucx mpi_pingpong (2 namespaces, every message checked)"
}

case_capture() {
  local pcap="$WORK/veth.pcap" tlog="$WORK/tcpdump.log" ns
  # One frame per RoCEv2 packet on the wire: see the header.
  for ns in "${NS[@]}"; do
    ip -n "$ns" link set "${ns}v" gso_max_segs 1 || fail "gso_max_segs 1 on ${ns}v"
  done
  # -B: a 32 MiB buffer holds the whole capture, so a starved tcpdump drops nothing.
  ip netns exec "${NS[0]}" timeout -k 5 "$STEP_TIMEOUT" tcpdump -i "${NS[0]}v" -n -U -B 32768 \
    -w "$pcap" udp port 4791 >"$tlog" 2>&1 &
  local tpid=$!
  PIDS+=("$tpid")
  wait_for_log_line 'listening on' "$tpid" "$LISTEN_WAIT" "$tlog" "tcpdump listens on ${NS[0]}v"
  pair write_bw "$PORT" "$(row 65536)" "$(row 65536)" \
    ib_write_bw -d srdma0 -x 0 -p "$PORT" -s 65536 -n 50
  # The last ACKs, then until tcpdump has written what its filter took: on a loaded host it
  # lags, and SIGINT stops it with packets still queued ("received by filter" above
  # "captured": one run lost its last 93 frames, a whole message's First among them). The
  # file must stop growing for 0.5 s (at most 20 s).
  local size=-1 stable=0 i
  for ((i = 0; i < 200 && stable < 5; i++)); do
    sleep 0.1
    local now
    now=$(stat -c %s "$pcap" 2>/dev/null || echo 0)
    if ((now == size)); then stable=$((stable + 1)); else stable=0 size=$now; fi
  done
  kill -INT "$tpid"
  wait "$tpid"
  cat "$tlog"
  grep -qE '^0 packets dropped by kernel' "$tlog" || { show_logs "$tlog"; fail "tcpdump dropped packets"; }
  local captured filtered
  captured=$(awk '/packets captured/ { print $1 }' "$tlog")
  filtered=$(awk '/packets received by filter/ { print $1 }' "$tlog")
  ((captured == filtered)) ||
    { show_logs "$tlog"; fail "tcpdump stopped with $((filtered - captured)) packets not yet written"; }
  # tshark: every frame is RoCEv2 (no other protocol on the port) with the expected opcodes.
  local total roce
  total=$(tshark -r "$pcap" 2>/dev/null | wc -l)
  roce=$(tshark -r "$pcap" -Y 'udp.dstport == 4791 && infiniband.bth' 2>/dev/null | wc -l)
  ((total > 0 && roce == total)) ||
    fail "tshark: $roce of $total frames decoded as RoCEv2 (UDP 4791 -> InfiniBand BTH)"
  tshark -r "$pcap" --disable-protocol rpcordma -T fields -e infiniband.bth.opcode 2>/dev/null |
    sort | uniq -c >"$WORK/opcodes"
  # 6 RDMA Write First, 7 Middle, 8 Last, 17 Acknowledge (IBTA RC opcodes).
  local op n want=(6 7 8 17)
  for op in "${want[@]}"; do
    n=$(awk -v op="$op" '$2 == op { print $1 }' "$WORK/opcodes")
    ((${n:-0} > 0)) || { cat "$WORK/opcodes" >&2; fail "tshark: no frame with BTH opcode $op"; }
  done
  # Frames with a RETH: a Write First per message — or, once the responder has reported a gap
  # on a path measured long (a loaded ASan run's veth), a Write Only (10) per packet
  # (docs/wide-area.md, "A RETH in every packet").
  n=$(awk '$2 == 6 || $2 == 10 { n += $1 } END { print n + 0 }' "$WORK/opcodes")
  ((n >= 50)) || fail "capture: $n RDMA Write First/Only frames, expected >= 50 (one per message)"
  echo "tshark: $total frames, all RoCEv2; BTH opcodes (count opcode): $(tr -s ' \n' ' ' <"$WORK/opcodes")"
  tshark -r "$pcap" --disable-protocol rpcordma -c 4 2>/dev/null
  # Every frame's ICRC, computed from its own bytes, and what tshark shows as the ICRC.
  python3 "$HERE/pcap_icrc.py" "$pcap" >"$WORK/icrc.log" 2>&1 ||
    { cat "$WORK/icrc.log" >&2; fail "ICRC check of $pcap"; }
  tshark -r "$pcap" -T fields -e infiniband.invariant.crc 2>/dev/null >"$WORK/tshark.icrc"
  python3 "$HERE/pcap_icrc.py" --print "$pcap" | cmp -s - "$WORK/tshark.icrc" ||
    fail "the ICRCs tshark shows differ from the frames' trailing 4 bytes"
  cat "$WORK/icrc.log"
  echo "ok: capture on ${NS[0]}v: every frame RoCEv2, every ICRC valid"
}

case_mtu9000() {
  check_devinfo_mtu 4096
  pair write_bw "$PORT" "$(mtu_line 4096)|$(row 1048576)" "$(row 1048576)|$(mtu_line 4096)" \
    ib_write_bw -d srdma0 -x 0 -p "$PORT" -s 1048576 -n 50
  pair ud_pingpong_4k $((PORT + 1)) '[0-9]+ iters in [0-9.]+ seconds' '[0-9]+ iters in [0-9.]+ seconds' \
    ibv_ud_pingpong -g 0 -p $((PORT + 1)) -s 4096 -n 300 -c
}

case_wan() {
  SR_OPTS=(--wan "delay=5ms,loss=1%")
  # The devices' counters while it runs (their files go when they close), one JSON
  # snapshot per line.
  (
    while :; do
      "$SOFTRDMA" stat --json 2>/dev/null | tr -d '\n' >>"$WORK/stat.jsonl"
      echo >>"$WORK/stat.jsonl"
      sleep 0.2
    done
  ) &
  local spid=$!
  PIDS+=("$spid")
  ALLREDUCE_ROWS=4
  allreduce allreduce_wan torchrun_vars -b 8 -e 1M -f 32 -c 1 -n 5 -w 1
  kill "$spid"
  SR_OPTS=()
  local t8
  t8=$(awk '$1 == 8 && $3 == "float" { print $6 }' "$WORK/allreduce_wan.0.log")
  awk -v t="$t8" 'BEGIN { exit !(t >= 5000) }' ||
    fail "8 B AllReduce took $t8 us through a 5 ms one-way link (less than one way)"
  python3 - "$WORK/stat.jsonl" "198.18.$NET." <<'EOF' || fail "WAN counters (softrdma stat)"
import json, sys
# The largest value each device showed in any snapshot, summed over this case's devices.
most = {}
for line in open(sys.argv[1]):
    try:
        snap = json.loads(line)
    except ValueError:
        continue  # cut short by the kill
    for d in snap["devices"]:
        if d["address"].startswith(sys.argv[2]):
            key = (d["address"], d["pid"])
            for c in ("wan_held", "wan_dropped_loss"):
                most[key, c] = max(most.get((key, c), 0), d["counters"].get(c, 0))
held = sum(v for (k, c), v in most.items() if c == "wan_held")
lost = sum(v for (k, c), v in most.items() if c == "wan_dropped_loss")
print(f"softrdma stat during the run: wan_held {held}, wan_dropped_loss {lost}")
sys.exit(0 if held > 0 and lost > 0 else 1)
EOF
  echo "ok: AllReduce through 10 ms RTT and 1 % loss each way, 0 wrong (8 B: $t8 us)"
}

# libfabric's verbs provider (fi_pingpong -p verbs) between the namespaces, as
# cm/interop/libfabric_test.sh's msg/rdm cases on one host.
case_libfabric() {
  local ep p=$PORT
  for ep in msg rdm; do
    local slog="$WORK/fi_$ep.server.log" clog="$WORK/fi_$ep.client.log"
    in_ns "${NS[0]}" "${ADDR[0]}" "$slog" -- fi_pingpong -p verbs -e "$ep" -B "$p" -I 100
    local spid=$LAST_PID
    wait_tcp "${NS[0]}" "$spid" "$p" "$slog"
    in_ns "${NS[1]}" "${ADDR[1]}" "$clog" -- fi_pingpong -p verbs -e "$ep" -P "$p" -I 100 "${ADDR[0]}"
    finish_pair "fi_pingpong -e $ep" "$spid" "$LAST_PID"
    local f size ok=$((!PAIR_RC))
    for f in "$slog" "$clog"; do
      for size in 64 256 1k 4k 64k 1m; do
        grep -qE "^$size +100 +=100 " "$f" || ok=0
      done
    done
    ((ok)) || { show_logs "$slog" "$clog"; fail "fi_pingpong -p verbs -e $ep"; }
    echo "ok: fi_pingpong -p verbs -e $ep ($(grep -m1 -E '^1m ' "$clog" | tr -s ' '))"
    p=$((p + 1))
  done
}

# uDAPL's dtest between the namespaces (its TCP port is fixed, 15828: each namespace has its
# own). DAT_OVERRIDE names a registry with one entry at the side's own address, under one
# provider name on both sides (the server sends its name to the client).
case_dapl() {
  local slog="$WORK/dtest.server.log" clog="$WORK/dtest.client.log" f
  echo "ofa-v2-softrdma u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 \"${ADDR[0]} 0\" \"\"" >"$WORK/s.conf"
  echo "ofa-v2-softrdma u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 \"${ADDR[1]} 0\" \"\"" >"$WORK/c.conf"
  # Under ASan, DAPL's own leaks at exit (dapl_test.sh explains) must not fail the run.
  no_leak_checks_under_asan
  in_ns "${NS[0]}" "${ADDR[0]}" "$slog" DAT_OVERRIDE="$WORK/s.conf" -- \
    dtest -P ofa-v2-softrdma -s
  local spid=$LAST_PID
  wait_tcp "${NS[0]}" "$spid" 15828 "$slog"
  in_ns "${NS[1]}" "${ADDR[1]}" "$clog" DAT_OVERRIDE="$WORK/c.conf" -- \
    dtest -P ofa-v2-softrdma -h "${ADDR[0]}"
  finish_pair dtest "$spid" "$LAST_PID"
  local ok=$((!PAIR_RC))
  # dtest exits 0 even when it prints FAILED: the verdict line decides.
  for f in "$slog" "$clog"; do grep -q 'DAPL Test Complete. PASSED' "$f" || ok=0; done
  ((ok)) || { show_logs "$slog" "$clog"; fail "dtest between the namespaces"; }
  echo "ok: dtest (uDAPL cma provider) between the namespaces: PASSED on both sides"
}

t0=$SECONDS
"case_$CASE"
echo "PASS [$TEST_NAME] ($((SECONDS - t0))s)"
