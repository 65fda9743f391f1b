#!/usr/bin/env bash
# Debian's unmodified ibv_devinfo (ibverbs-utils) on a multi-NIC softrdma host: through
# `softrdma run --addr 127.0.40.21,127.0.40.22`, `ibv_devinfo -v` must list two devices,
# srdma0 and srdma1 in that order, each with its own node GUID (0200:7fff:fe00:2815 and
# …:2816, from the address) and GID 0 (::ffff:127.0.40.21 / ::ffff:127.0.40.22, RoCE v2),
# both ports PORT_ACTIVE; and a malformed list entry is refused by `softrdma run` (status 2).
#
#   devinfo_test.sh BUILD_DIR
#
# A missing /usr/bin/ibv_devinfo is a failure (install Debian's ibverbs-utils), never a skip.
set -uo pipefail

# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
# shellcheck disable=SC2034  # read by fail() in test_lib.sh
TEST_NAME=devinfo
[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
resolve_build_dir "$1"
require_softrdma_built
[[ -x /usr/bin/ibv_devinfo ]] || fail "/usr/bin/ibv_devinfo is missing: install Debian's ibverbs-utils"

make_work_dir softrdma-devinfo
LOG=$WORK/devinfo.log
timeout 30 "$SOFTRDMA" run --addr 127.0.40.21,127.0.40.22 -- /usr/bin/ibv_devinfo -v >"$LOG" 2>&1 ||
  { show_logs "$LOG"; fail "ibv_devinfo failed"; }

got=$(grep -E '^hca_id:|node_guid:|GID\[ *0\]:|state:.*PORT_' "$LOG" | tr -s ' \t' ' ' | sed 's/^ //')
want="hca_id: srdma0
node_guid: 0200:7fff:fe00:2815
state: PORT_ACTIVE (4)
GID[ 0]: ::ffff:127.0.40.21, RoCE v2
hca_id: srdma1
node_guid: 0200:7fff:fe00:2816
state: PORT_ACTIVE (4)
GID[ 0]: ::ffff:127.0.40.22, RoCE v2"
[[ $got == "$want" ]] || { show_logs "$LOG"; fail "expected:
$want
got:
$got"; }

"$SOFTRDMA" run --addr 127.0.40.21,not-an-ip -- /usr/bin/ibv_devinfo >"$LOG" 2>&1
rc=$?
[[ $rc -eq 2 ]] || { show_logs "$LOG"; fail "a malformed --addr entry gave status $rc, expected 2"; }
echo "devinfo: PASS (srdma0 and srdma1 listed, each at its own address)"
