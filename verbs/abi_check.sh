#!/usr/bin/env bash
# ABI check: every symbol a Debian library exports at its default version (the one binaries
# bind to) must be exported by softrdma's drop-in at the same version.
# Usage: abi_check.sh <our library> [<system library> [<version prefix>]]
#   defaults: /usr/lib/x86_64-linux-gnu/libibverbs.so.1, prefix IBVERBS (cm/ passes its
#   librdmacm.so.1 with Debian's and RDMACM).
set -euo pipefail
ours=$1
system=${2:-/usr/lib/x86_64-linux-gnu/libibverbs.so.1}
prefix=${3:-IBVERBS}
if [[ ! -e $system ]]; then
  echo "FAIL: $system not found (install libibverbs1 / librdmacm1: scripts/deps.sh)" >&2
  exit 1
fi
# objdump -T rows end in "<version> <name>"; "(VER)" marks a hidden (compat) version.
defaults() { objdump -T "$1" | awk -v prefix="$prefix" 'NF >= 2 && $0 !~ /\*UND\*/ && $(NF-1) ~ "^" prefix && $(NF-1) != $NF {print $(NF-1), $NF}' | sort -u; }
missing=$(comm -23 <(defaults "$system") <(defaults "$ours"))
if [[ -n $missing ]]; then
  echo "FAIL: symbols of $system missing from $ours at the same version:" >&2
  echo "$missing" >&2
  exit 1
fi
n=$(defaults "$system" | wc -l)
echo "ok: all $n default-version symbols of $system are exported by $ours"
