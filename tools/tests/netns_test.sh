#!/usr/bin/env bash
# softrdma between network namespaces of one host, with the DEFAULT transport (issue 21): the
# same-host shared-memory path must be taken only inside one namespace, UDP between them, and
# one address in two namespaces must be two separate devices.
#
#   netns_test.sh BUILD_DIR CASE
#
# CASE:
#   veth          namespaces srnsA1 (198.18.7.1/24) and srnsA2 (198.18.7.2/24) joined by a veth
#                 pair; the server runs in srnsA1, the client in srnsA2, one program after the
#                 other: ib_write_bw -s 2, ib_write_bw -s 65536, ib_read_bw, ib_atomic_bw,
#                 ib_write_lat, ib_read_lat (-n 200 each), ibv_rc_pingpong -e, rping -C 50 -V
#                 and ib_write_bw -R (connections through the RDMA-CM). Before issue 21 they
#                 found each other's mailbox in the shared /dev/shm, never woke each other (the
#                 doorbell is per namespace) and exhausted retry_cnt or hung.
#   same_address  namespaces srnsA3 and srnsA4, both with 198.18.8.1/24, and clients' addresses
#                 198.18.8.2 (srnsA3) and 198.18.8.3 (srnsA4), on their ends of a veth pair
#                 (traffic between local addresses stays inside the namespace). In both
#                 namespaces at the same time a server at .1 and the namespace's client run
#                 ibv_rc_pingpong -c (received data checked), then rping -C 50 -V (data
#                 verified, same RDMA-CM port in both) and ib_write_bw -s 65536 (same TCP
#                 port). Every pair must complete. Before issue 21 the client of one namespace
#                 found the other namespace's server mailbox for .1 (one file name for both)
#                 and wrote its packets into that process; the servers also shared one
#                 RDMA-CM port table (rdma_bind_addr: EADDRINUSE in the second).
#
# Needs root with CAP_NET_ADMIN (ip netns add): otherwise it exits 77, which ctest reports as
# skipped (SKIP_RETURN_CODE), saying why. The namespaces (names srnsA*, addresses in
# 198.18.0.0/15) are deleted at exit, also on failure. Every process is bounded by `timeout`;
# perftest's TCP ports are 18700-18799. On failure both sides' logs are printed. A missing
# /usr/bin program (perftest, ibverbs-utils, rdmacm-utils) is a failure, never a skip.
set -uo pipefail

CASES="veth same_address"
# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
case_test_args netns "$CASES" "$@"
require_softrdma_built

STEP_TIMEOUT=${NETNS_TIMEOUT:-45} # seconds per process
LISTEN_WAIT=30
SKIP=77

case "$CASE" in
  veth) NS=(srnsA1 srnsA2) ;;
  same_address) NS=(srnsA3 srnsA4) ;;
esac

if ((EUID != 0)); then
  echo "SKIP [$TEST_NAME]: needs root with CAP_NET_ADMIN to create network namespaces" >&2
  exit $SKIP
fi
for tool in ib_write_bw ib_read_bw ib_atomic_bw ib_write_lat ib_read_lat ibv_rc_pingpong rping; do
  [[ -x /usr/bin/$tool ]] ||
    fail "/usr/bin/$tool is missing (apt-get install perftest ibverbs-utils rdmacm-utils)"
done

make_work_dir "softrdma-netns-$CASE"
suppress_perftest_leaks  # under ASan: perftest's own leaks only
PIDS=()
# shellcheck disable=SC2317  # called at exit by test_lib.sh
on_exit() {
  local p ns
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  # Programs that exit without closing their device (ib_write_bw -R, rping) leave their
  # mailbox and share files; those of a namespace can only be cleaned from inside it.
  for ns in "${NS[@]}"; do
    ip netns exec "$ns" "$SOFTRDMA" stat --clean >/dev/null 2>&1
    ip netns del "$ns" 2>/dev/null
  done
  return 0
}

# Namespaces left by an interrupted run of this case go first.
for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null; done
if ! ip netns add "${NS[0]}" 2>"$WORK/netns.err"; then
  echo "SKIP [$TEST_NAME]: cannot create a network namespace (needs CAP_NET_ADMIN):" \
    "$(cat "$WORK/netns.err")" >&2
  exit $SKIP
fi
ip netns add "${NS[1]}" || fail "ip netns add ${NS[1]}"
ip link add "${NS[0]}v" netns "${NS[0]}" type veth peer name "${NS[1]}v" netns "${NS[1]}" ||
  fail "cannot create a veth pair between ${NS[0]} and ${NS[1]}"
if [[ $CASE == veth ]]; then
  ip -n "${NS[0]}" addr add 198.18.7.1/24 dev "${NS[0]}v" || fail "address 198.18.7.1"
  ip -n "${NS[1]}" addr add 198.18.7.2/24 dev "${NS[1]}v" || fail "address 198.18.7.2"
else
  k=2
  for ns in "${NS[@]}"; do
    ip -n "$ns" addr add 198.18.8.1/24 dev "${ns}v" || fail "address 198.18.8.1 in $ns"
    ip -n "$ns" addr add "198.18.8.$k/24" dev "${ns}v" || fail "address 198.18.8.$k in $ns"
    k=$((k + 1))
  done
fi
for ns in "${NS[@]}"; do
  ip -n "$ns" link set lo up || fail "lo up in $ns"
  ip -n "$ns" link set "${ns}v" up || fail "${ns}v up in $ns"
done

# in_ns NS ADDR LOG PROGRAM ARGS...: runs PROGRAM through `softrdma run --addr ADDR` inside NS
# in the background, bounded by STEP_TIMEOUT, output to LOG; its pid is in LAST_PID. With KIND
# cm, softrdma logs at info level (its RDMA-CM says when it listens). stdbuf:
# line-buffered stdout, so a log killed by timeout still shows how far it got (after `softrdma
# run`, whose preloads must come first).
in_ns() {
  local ns=$1 addr=$2 log=$3 prog=$4
  shift 4
  echo "$ns: softrdma run --addr $addr -- $prog $*" >>"$WORK/commands"
  local opts=()
  [[ ${KIND:-} == cm ]] && opts=(--log info)
  ip netns exec "$ns" timeout -k 5 "$STEP_TIMEOUT" "$SOFTRDMA" run --addr "$addr" "${opts[@]}" -- \
    stdbuf -oL "/usr/bin/$prog" "$@" >"$log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

# ns_tcp_listening NS PORT: whether something in NS listens on TCP PORT (/proc/net/tcp is the
# reader's namespace's).
ns_tcp_listening() {
  ip netns exec "$1" bash -c "$(declare -f tcp_listening); tcp_listening $2"
}

# wait_ready NS PID LOG KIND PORT ADDR: waits until the server PID in NS listens: on TCP PORT
# (KIND tcp) or, through softrdma's RDMA-CM, on ADDR:PORT (KIND cm; its --log info line).
wait_ready() {
  local ns=$1 pid=$2 log=$3 kind=$4 port=$5 addr=$6 waited=0 rc
  if [[ $kind == cm ]]; then
    wait_for_cm_listener "$addr" "$port" "$pid" "$LISTEN_WAIT" "$log"
    return
  fi
  until ns_tcp_listening "$ns" "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      rc=$?
      show_logs "$log"
      fail "server in $ns exited ($(status_text $rc)) before listening on TCP port $port"
    fi
    ((waited < LISTEN_WAIT * 10)) || { show_logs "$log"; fail "server in $ns not listening on $port"; }
    sleep 0.1
    waited=$((waited + 1))
  done
}

# check_log LOG SIDE RE: the log has a line matching the extended regexp RE and no error line.
check_log() {
  local log=$1 side=$2 re=$3
  if grep -E -i 'completion with error|couldn.?t|failed|unable to|mismatch|error' "$log" >"$WORK/errors"; then
    echo "$side: error messages in its log:" >&2
    cat "$WORK/errors" >&2
    return 1
  fi
  [[ -z $re ]] || grep -qE "$re" "$log" || { echo "$side: no line matching '$re'" >&2; return 1; }
}

# Result lines: perftest's row under its table header starts with the message size;
# ibv_rc_pingpong prints "N iters in T seconds".
perftest_row() { echo "^ *$1 +[0-9]+ +[0-9.]+"; }
PINGPONG_ROW='[0-9]+ iters in [0-9.]+ seconds'

# start_pair NAME KIND PORT SERVER_NS SERVER_ADDR CLIENT_NS CLIENT_ADDR PROG ARGS... --
#   SERVER_ONLY... -- CLIENT_ONLY...
# Starts the server, waits until it listens, starts the client; both in the background. The
# pids go to PAIR_SERVER / PAIR_CLIENT; finish_pair checks them.
start_pair() {
  local name=$1 kind=$2 port=$3 sns=$4 saddr=$5 cns=$6 caddr=$7 prog=$8
  shift 8
  KIND=$kind
  local common=() sargs=() cargs=()
  while (($#)) && [[ $1 != -- ]]; do common+=("$1"); shift; done
  shift
  while (($#)) && [[ $1 != -- ]]; do sargs+=("$1"); shift; done
  shift
  cargs=("$@")
  in_ns "$sns" "$saddr" "$WORK/$name.server.log" "$prog" "${common[@]}" "${sargs[@]}"
  PAIR_SERVER=$LAST_PID
  wait_ready "$sns" "$PAIR_SERVER" "$WORK/$name.server.log" "$kind" "$port" "$saddr"
  in_ns "$cns" "$caddr" "$WORK/$name.client.log" "$prog" "${common[@]}" "${cargs[@]}"
  PAIR_CLIENT=$LAST_PID
}

# finish_pair NAME SERVER_PID CLIENT_PID SERVER_RE CLIENT_RE: waits for both, checks their exit
# status and logs; fails showing both logs.
finish_pair() {
  local name=$1 spid=$2 cpid=$3 sre=$4 cre=$5 src=0 crc=0 ok=1
  wait "$cpid" || crc=$?
  if ((crc != 0)); then
    # The client failed: give the server a few seconds, then stop it.
    local i
    for ((i = 0; i < 50; i++)); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
    kill "$spid" 2>/dev/null
  fi
  wait "$spid" || src=$?
  ((src == 0)) || { echo "$name: server exited with $(status_text $src)" >&2; ok=0; }
  ((crc == 0)) || { echo "$name: client exited with $(status_text $crc)" >&2; ok=0; }
  if ((ok)); then
    check_log "$WORK/$name.server.log" "$name server" "$sre" || ok=0
    check_log "$WORK/$name.client.log" "$name client" "$cre" || ok=0
  fi
  if ((!ok)); then
    cat "$WORK/commands" >&2
    show_logs "$WORK/$name.server.log" "$WORK/$name.client.log"
    fail "$name"
  fi
  if [[ -n $cre ]]; then
    echo "ok: $name ($(grep -m1 -E "$cre" "$WORK/$name.client.log" | tr -s ' '))"
  else
    echo "ok: $name (both sides exited 0)"
  fi
}

t0=$SECONDS
if [[ $CASE == veth ]]; then
  S=198.18.7.1
  C=198.18.7.2
  # name  kind  port  program  arguments (both sides)  result line (server, client)
  veth_pair() {
    local name=$1 kind=$2 port=$3 sre=$4 cre=$5 prog=$6
    shift 6
    start_pair "$name" "$kind" "$port" "${NS[0]}" "$S" "${NS[1]}" "$C" "$prog" "$@" -- -- "$S"
    finish_pair "$name" "$PAIR_SERVER" "$PAIR_CLIENT" "$sre" "$cre"
  }
  bw2=$(perftest_row 2) bw64k=$(perftest_row 65536) b8=$(perftest_row 8)
  veth_pair write_bw_2b tcp 18701 "$bw2" "$bw2" ib_write_bw -d srdma0 -x 0 -p 18701 -s 2 -n 200
  veth_pair write_bw_64k tcp 18702 "$bw64k" "$bw64k" ib_write_bw -d srdma0 -x 0 -p 18702 -s 65536 -n 200
  veth_pair read_bw tcp 18703 "$bw64k" "$bw64k" ib_read_bw -d srdma0 -x 0 -p 18703 -n 200
  veth_pair atomic_bw tcp 18704 "$b8" "$b8" ib_atomic_bw -d srdma0 -x 0 -p 18704 -n 200
  veth_pair write_lat tcp 18705 "$bw2" "$bw2" ib_write_lat -d srdma0 -x 0 -p 18705 -n 200
  veth_pair read_lat tcp 18706 "remote address:" "$bw2" ib_read_lat -d srdma0 -x 0 -p 18706 -n 200
  veth_pair rc_pingpong_e tcp 18707 "$PINGPONG_ROW" "$PINGPONG_ROW" ibv_rc_pingpong -g 0 -p 18707 -e -n 200
  # rping names the server's address on both sides; -V verifies every buffer.
  start_pair rping cm 18708 "${NS[0]}" "$S" "${NS[1]}" "$C" rping -a "$S" -p 18708 -C 50 -V -- -s -- -c
  finish_pair rping "$PAIR_SERVER" "$PAIR_CLIENT" "" ""
  veth_pair write_bw_cm cm 18709 "$bw64k" "$bw64k" ib_write_bw -d srdma0 -x 0 -p 18709 -R -n 200
else
  S=198.18.8.1
  CLIENT_ADDR=(198.18.8.2 198.18.8.3) # per namespace
  # Both namespaces at once, same addresses and ports: returns after both pairs finished.
  both_pairs() {
    local name=$1 kind=$2 port=$3 sre=$4 cre=$5 prog=$6
    shift 6
    KIND=$kind
    local common=() sargs=() cargs=()
    while [[ $1 != -- ]]; do common+=("$1"); shift; done
    shift
    while [[ $1 != -- ]]; do sargs+=("$1"); shift; done
    shift
    cargs=("$@")
    local ns spids=()
    for ns in "${NS[@]}"; do
      in_ns "$ns" "$S" "$WORK/$name.$ns.server.log" "$prog" "${common[@]}" "${sargs[@]}"
      spids+=("$LAST_PID")
    done
    local k=0 cpids=()
    for ns in "${NS[@]}"; do
      wait_ready "$ns" "${spids[k]}" "$WORK/$name.$ns.server.log" "$kind" "$port" "$S"
      k=$((k + 1))
    done
    k=0
    for ns in "${NS[@]}"; do
      in_ns "$ns" "${CLIENT_ADDR[k]}" "$WORK/$name.$ns.client.log" "$prog" "${common[@]}" "${cargs[@]}"
      cpids+=("$LAST_PID")
      k=$((k + 1))
    done
    k=0
    for ns in "${NS[@]}"; do
      finish_pair "$name.$ns" "${spids[k]}" "${cpids[k]}" "$sre" "$cre"
      k=$((k + 1))
    done
  }
  both_pairs rc_pingpong_chk tcp 18711 "$PINGPONG_ROW" "$PINGPONG_ROW" \
    ibv_rc_pingpong -g 0 -p 18711 -c -n 500 -- -- "$S"
  both_pairs rping cm 18712 "" "" rping -a "$S" -p 18712 -C 50 -V -- -s -- -c
  bw64k=$(perftest_row 65536)
  both_pairs write_bw tcp 18713 "$bw64k" "$bw64k" \
    ib_write_bw -d srdma0 -x 0 -p 18713 -s 65536 -n 200 -- -- "$S"
fi
echo "PASS [$TEST_NAME] ($((SECONDS - t0))s)"
