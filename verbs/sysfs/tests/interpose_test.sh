#!/usr/bin/env bash
# The virtual sysfs and /dev entries of srdma0 as programs started by `softrdma run` see
# them (libsoftrdma_sysfs.so, device 127.0.14.2):
#
#   interpose_test.sh BUILD_DIR
#
# Checked with ordinary programs — cat, ls, stat, readlink, python3 (os.path.exists,
# os.listdir, open, os.path.realpath) — and with Debian's unmodified ibv_devinfo -v:
#   /sys/class/infiniband lists srdma0; node_guid, ports/1/{state, phys_state, lid, gids/0,
#   gid_attrs/types/0, gid_attrs/ndevs/0}, device/net/lo (what pyverbs' RDMA-CM tests look
#   for); /sys/class/infiniband_verbs/{abi_version, uverbs0/{ibdev, dev}};
#   /dev/infiniband/uverbs0 a character device 231:192;
#   ibv_devinfo -v runs and reports the node GUID and GID the files hold;
#   ports/1/rate and ibv_devinfo's active_width/active_speed agree: 4X EDR alone, 4X NDR
#   under `--wan rate=400gbit`;
#   --no-sysfs leaves the real paths alone (checked where the host has no /sys/class/infiniband).
# Exit 0 when all hold, 1 with the differences otherwise.
set -uo pipefail

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../scripts/lib/test_lib.sh"
# shellcheck disable=SC2034  # read by fail() in test_lib.sh
TEST_NAME=sysfs_interpose
[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
resolve_build_dir "$1"
require_softrdma_built
[[ -e "$BUILD_DIR/lib/libsoftrdma_sysfs.so" ]] || fail "libsoftrdma_sysfs.so not built"
[[ -x /usr/bin/ibv_devinfo ]] || fail "/usr/bin/ibv_devinfo is missing: install ibverbs-utils"
make_work_dir softrdma-sysfs

ADDR=127.0.14.2
GUID=0200:7fff:fe00:0e02                    # 02:00:7f:ff:fe:00:0e:02 (verbs/device_identity.h)
GID=0000:0000:0000:0000:0000:ffff:7f00:0e02  # ::ffff:127.0.14.2
IB=/sys/class/infiniband/srdma0
errors=0
expect() {  # expect WHAT EXPECTED ACTUAL
  if [[ "$2" != "$3" ]]; then
    echo "FAIL [$TEST_NAME]: $1: expected '$2', got '$3'" >&2
    errors=$((errors + 1))
  fi
}
in_run() {  # in_run CMD...: CMD's stdout under softrdma run (stderr to the log)
  timeout 30 "$SOFTRDMA" run --addr "$ADDR" -- "$@" 2>>"$WORK/stderr.log"
}

expect "ls /sys/class/infiniband" srdma0 "$(in_run ls /sys/class/infiniband)"
expect "node_guid" "$GUID" "$(in_run cat $IB/node_guid)"
expect "node_type" "1: CA" "$(in_run cat $IB/node_type)"
expect "ports/1/state" "4: ACTIVE" "$(in_run cat $IB/ports/1/state)"
expect "ports/1/phys_state" "5: LinkUp" "$(in_run cat $IB/ports/1/phys_state)"
expect "ports/1/lid" "0x0" "$(in_run cat $IB/ports/1/lid)"
expect "ports/1/gids/0" "$GID" "$(in_run cat $IB/ports/1/gids/0)"
expect "ports/1/gids/15 (empty entry)" "0000:0000:0000:0000:0000:0000:0000:0000" \
  "$(in_run cat $IB/ports/1/gids/15)"
expect "gid_attrs/types/0" "RoCE v2" "$(in_run cat $IB/ports/1/gid_attrs/types/0)"
expect "gid_attrs/ndevs/0" lo "$(in_run cat $IB/ports/1/gid_attrs/ndevs/0)"
expect "ls device/net" lo "$(in_run ls $IB/device/net/)"
expect "readlink device/net/lo" /sys/class/net/lo "$(in_run readlink $IB/device/net/lo)"
expect "infiniband_verbs/abi_version" 6 "$(in_run cat /sys/class/infiniband_verbs/abi_version)"
expect "uverbs0/ibdev" srdma0 "$(in_run cat /sys/class/infiniband_verbs/uverbs0/ibdev)"
expect "uverbs0/dev" 231:192 "$(in_run cat /sys/class/infiniband_verbs/uverbs0/dev)"
expect "stat /dev/infiniband/uverbs0" "character special file e7:c0" \
  "$(in_run stat -c '%F %t:%T' /dev/infiniband/uverbs0)"
expect "python3" "True ['srdma0'] $GUID $IB/device" "$(in_run /usr/bin/python3 -c "
import os
print(os.path.exists('$IB/device/net/'), os.listdir('/sys/class/infiniband'),
      open('$IB/node_guid').read().strip(),
      os.path.realpath('/sys/class/infiniband_verbs/uverbs0/device'))")"

# ibv_devinfo -v through the drop-in: the same GUID and GID as the files.
in_run /usr/bin/ibv_devinfo -v >"$WORK/devinfo.log"
rc=$?
expect "ibv_devinfo -v status" 0 "$rc"
expect "ibv_devinfo node_guid" "$GUID" "$(awk '$1 == "node_guid:" {print $2}' "$WORK/devinfo.log")"
grep -q "GID\[  0\]:.*::ffff:127.0.14.2, RoCE v2" "$WORK/devinfo.log" || {
  echo "FAIL [$TEST_NAME]: ibv_devinfo -v shows no RoCE v2 GID ::ffff:$ADDR" >&2
  errors=$((errors + 1))
}

# The port's rate: 4X EDR (100 Gb/s) alone; under an emulated 400 Gbit/s link the port of a
# NIC that feeds it (4X NDR), in the file and in ibv_query_port alike.
expect "ports/1/rate" "100 Gb/sec (4X EDR)" "$(in_run cat $IB/ports/1/rate)"
expect "ibv_devinfo active_width, speed" "4X (2) 25.0 Gbps (32)" \
  "$(awk '$1 == "active_width:" {w = $2 " " $3} $1 == "active_speed:" {print w, $2, $3, $4}' \
    "$WORK/devinfo.log")"
wan_run() {  # wan_run CMD...: as in_run, with a 400 Gbit/s emulated link
  timeout 30 "$SOFTRDMA" run --addr "$ADDR" --wan "delay=1ms,rate=400gbit" -- "$@" \
    2>>"$WORK/stderr.log"
}
expect "ports/1/rate at 400 Gbit/s" "400 Gb/sec (4X NDR)" "$(wan_run cat $IB/ports/1/rate)"
expect "ibv_devinfo active_width, speed at 400 Gbit/s" "4X (2) 100.0 Gbps (128)" \
  "$(wan_run /usr/bin/ibv_devinfo -v |
    awk '$1 == "active_width:" {w = $2 " " $3} $1 == "active_speed:" {print w, $2, $3, $4}')"

if [[ ! -e /sys/class/infiniband ]]; then
  timeout 30 "$SOFTRDMA" run --no-sysfs --addr "$ADDR" -- ls /sys/class/infiniband \
    >/dev/null 2>&1 && {
    echo "FAIL [$TEST_NAME]: --no-sysfs still shows /sys/class/infiniband" >&2
    errors=$((errors + 1))
  }
fi

if ((errors)); then
  show_logs "$WORK/devinfo.log" "$WORK/stderr.log"
  fail "$errors checks failed"
fi
echo "ok: the virtual sysfs tree and ibv_devinfo -v agree"
