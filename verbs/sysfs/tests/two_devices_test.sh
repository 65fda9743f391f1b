#!/usr/bin/env bash
# The virtual sysfs and /dev entries of a two-device process (`softrdma run --addr A,B`:
# srdma0 at A = 127.0.85.21, srdma1 at B = 127.0.85.22) as ordinary programs and Debian's
# unmodified ibverbs-utils see them through libsoftrdma_sysfs.so:
#
#   two_devices_test.sh BUILD_DIR
#
#   ls /sys/class/infiniband, /sys/class/infiniband_verbs and /dev/infiniband list both
#   devices; each srdma<i> has its own node_guid, node_desc, ports/1/gids/0 (its IPv4-mapped
#   address), gid_attrs/ndevs/0 (a net device that exists under /sys/class/net, as RDMA-CM
#   users look it up) and device/net link; uverbs<i>/{ibdev, dev} name srdma<i> and 231:192+i,
#   and /dev/infiniband/uverbs<i> stats as that character device; python3 resolves
#   uverbs1/device to srdma1/device;
#   ibv_devices and ibv_devinfo -v list srdma0 and srdma1 with the GUIDs and GIDs the files hold,
#   and ibv_devinfo -d srdma1 shows srdma1's alone;
#   the drop-in's ibv_read_sysfs_file (without the interposer: --no-sysfs) reads srdma1's files,
#   and with srdma1 opened first srdma0's files and ibv_get_device_guid still describe A;
#   `softrdma sysfs --create DIR` writes both devices, from --addr A,B and from SOFTRDMA_ADDR.
# Exit 0 when all hold, 1 with the differences otherwise. Missing ibverbs-utils is a failure.
set -uo pipefail

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../scripts/lib/test_lib.sh"
# shellcheck disable=SC2034  # read by fail() in test_lib.sh
TEST_NAME=sysfs_two_devices
[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
resolve_build_dir "$1"
require_softrdma_built
[[ -e "$BUILD_DIR/lib/libsoftrdma_sysfs.so" ]] || fail "libsoftrdma_sysfs.so not built"
for tool in ibv_devinfo ibv_devices; do
  [[ -x /usr/bin/$tool ]] || fail "/usr/bin/$tool is missing: install Debian's ibverbs-utils"
done
make_work_dir softrdma-sysfs2

ADDRS=127.0.85.21,127.0.85.22
IP=(127.0.85.21 127.0.85.22)
GUID=(0200:7fff:fe00:5515 0200:7fff:fe00:5516)  # 02:00:7f:ff:fe:00:55:15 (device_identity.h)
GID=(0000:0000:0000:0000:0000:ffff:7f00:5515 0000:0000:0000:0000:0000:ffff:7f00:5516)
errors=0
expect() {  # expect WHAT EXPECTED ACTUAL
  if [[ "$2" != "$3" ]]; then
    echo "FAIL [$TEST_NAME]: $1: expected '$2', got '$3'" >&2
    errors=$((errors + 1))
  fi
}
names() {  # names DIR: the entries of DIR, space-separated, sorted
  local all=("$1"/*)
  all=("${all[@]##*/}")
  echo "${all[*]}"
}
in_run() {  # in_run CMD...: CMD's stdout under softrdma run with both addresses
  timeout 30 "$SOFTRDMA" run --addr "$ADDRS" -- "$@" 2>>"$WORK/stderr.log"
}

expect "ls /sys/class/infiniband" "srdma0 srdma1" "$(in_run ls /sys/class/infiniband | xargs)"
expect "ls /sys/class/infiniband_verbs" "abi_version uverbs0 uverbs1" \
  "$(in_run ls /sys/class/infiniband_verbs | xargs)"
expect "ls /dev/infiniband" "uverbs0 uverbs1" "$(in_run ls /dev/infiniband | xargs)"
for i in 0 1; do
  IB=/sys/class/infiniband/srdma$i
  UV=/sys/class/infiniband_verbs/uverbs$i
  expect "srdma$i/node_guid" "${GUID[$i]}" "$(in_run cat $IB/node_guid)"
  expect "srdma$i/node_desc" "softrdma srdma$i" "$(in_run cat $IB/node_desc)"
  expect "srdma$i/ports/1/gids/0" "${GID[$i]}" "$(in_run cat $IB/ports/1/gids/0)"
  expect "srdma$i/ports/1/state" "4: ACTIVE" "$(in_run cat $IB/ports/1/state)"
  expect "srdma$i/gid_attrs/types/0" "RoCE v2" "$(in_run cat $IB/ports/1/gid_attrs/types/0)"
  # RDMA-CM style: the GID's net device, then that device's own sysfs directory.
  ndev=$(in_run cat $IB/ports/1/gid_attrs/ndevs/0)
  expect "srdma$i/gid_attrs/ndevs/0" lo "$ndev"
  expect "srdma$i: /sys/class/net/<ndev> exists" yes \
    "$(in_run sh -c "test -d /sys/class/net/$ndev/ && echo yes")"
  expect "srdma$i: ls device/net" "$ndev" "$(in_run ls $IB/device/net/)"
  expect "uverbs$i/ibdev" "srdma$i" "$(in_run cat $UV/ibdev)"
  expect "uverbs$i/dev" "231:$((192 + i))" "$(in_run cat $UV/dev)"
  expect "stat /dev/infiniband/uverbs$i" "character special file e7:$(printf %x $((192 + i)))" \
    "$(in_run stat -c '%F %t:%T' /dev/infiniband/uverbs$i)"
done
expect "no srdma2" "" "$(in_run ls /sys/class/infiniband/srdma2 2>/dev/null)"
expect "python3 realpath uverbs1/device" "/sys/class/infiniband/srdma1/device" \
  "$(in_run /usr/bin/python3 -c "
import os
print(os.path.realpath('/sys/class/infiniband_verbs/uverbs1/device'))")"

# ibv_devices: name and GUID of each, the GUID the files hold (without the colons).
in_run /usr/bin/ibv_devices >"$WORK/devices.log"
expect "ibv_devices status" 0 "$?"
expect "ibv_devices" "srdma0 ${GUID[0]//:/} srdma1 ${GUID[1]//:/}" \
  "$(awk '$1 ~ /^srdma/ {print $1, $2}' "$WORK/devices.log" | xargs)"

# ibv_devinfo -v: both devices, each with the files' GUID and GID 0.
in_run /usr/bin/ibv_devinfo -v >"$WORK/devinfo.log"
expect "ibv_devinfo -v status" 0 "$?"
expect "ibv_devinfo -v" "srdma0 ${GUID[0]} ::ffff:${IP[0]} srdma1 ${GUID[1]} ::ffff:${IP[1]}" \
  "$(awk '$1 == "hca_id:" {print $2} $1 == "node_guid:" {print $2}
          $1 ~ /^GID\[/ && $2 == "0]:" {sub(",", "", $3); print $3}' "$WORK/devinfo.log" | xargs)"
in_run /usr/bin/ibv_devinfo -d srdma1 >"$WORK/devinfo1.log"
expect "ibv_devinfo -d srdma1" "srdma1 ${GUID[1]}" \
  "$(awk '$1 == "hca_id:" || $1 == "node_guid:" {print $2}' "$WORK/devinfo1.log" | xargs)"

# The drop-in's ibv_read_sysfs_file, with no interposer to serve the paths; srdma1 is opened
# first, and srdma0's files (and GUID) must still be those of the first address.
expect "ibv_read_sysfs_file (--no-sysfs)" \
  "opened|${GID[1]}|lo|231:193|${GUID[0]}|${GUID[0]//:/}|${GID[0]}" \
  "$(timeout 30 "$SOFTRDMA" run --no-sysfs --addr "$ADDRS" -- /usr/bin/python3 -c "
import ctypes
v = ctypes.CDLL('libibverbs.so.1')
v.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
v.ibv_open_device.restype = ctypes.c_void_p
v.ibv_open_device.argtypes = [ctypes.c_void_p]
v.ibv_get_device_guid.restype = ctypes.c_uint64
v.ibv_get_device_guid.argtypes = [ctypes.c_void_p]
devs = v.ibv_get_device_list(None)
ctx = v.ibv_open_device(devs[1])
def rd(d, f):
    b = ctypes.create_string_buffer(64)
    n = v.ibv_read_sysfs_file(d.encode(), f.encode(), b, 64)
    return b.value.decode() if n >= 0 else 'ERR'
guid0 = v.ibv_get_device_guid(devs[0]).to_bytes(8, 'little').hex()
print('opened' if ctx else 'open failed',
      rd('/sys/class/infiniband/srdma1/ports/1', 'gids/0'),
      rd('/sys/class/infiniband/srdma1/ports/1', 'gid_attrs/ndevs/0'),
      rd('/sys/class/infiniband_verbs/uverbs1', 'dev'),
      rd('/sys/class/infiniband/srdma0', 'node_guid'), guid0,
      rd('/sys/class/infiniband/srdma0/ports/1', 'gids/0'), sep='|')" 2>>"$WORK/stderr.log")"

# softrdma sysfs --create: both devices, from --addr and from SOFTRDMA_ADDR.
"$SOFTRDMA" sysfs --create "$WORK/tree" --addr "$ADDRS" >"$WORK/create.log" 2>&1
expect "sysfs --create --addr A,B status" 0 "$?"
SOFTRDMA_ADDR=$ADDRS "$SOFTRDMA" sysfs --create "$WORK/tree-env" >>"$WORK/create.log" 2>&1
expect "sysfs --create (SOFTRDMA_ADDR=A,B) status" 0 "$?"
for t in tree tree-env; do
  R=$WORK/$t
  expect "$t: ls infiniband" "srdma0 srdma1" "$(names "$R/sys/class/infiniband")"
  expect "$t: ls dev/infiniband" "uverbs0 uverbs1" "$(names "$R/dev/infiniband")"
  expect "$t: srdma1 gids/0" "${GID[1]}" "$(cat "$R/sys/class/infiniband/srdma1/ports/1/gids/0")"
  expect "$t: srdma0 node_guid" "${GUID[0]}" "$(cat "$R/sys/class/infiniband/srdma0/node_guid")"
  expect "$t: uverbs1/dev" "231:193" "$(cat "$R/sys/class/infiniband_verbs/uverbs1/dev")"
done
grep -q "mknod /dev/infiniband/uverbs1 c 231 193" "$WORK/create.log" ||
  { echo "FAIL [$TEST_NAME]: sysfs --create prints no mknod line for uverbs1" >&2; errors=$((errors + 1)); }

if ((errors)); then
  show_logs "$WORK/devices.log" "$WORK/devinfo.log" "$WORK/create.log" "$WORK/stderr.log"
  fail "$errors checks failed"
fi
echo "ok: srdma0 and srdma1 each have their own sysfs and /dev entries, as ibv_devinfo reports them"
