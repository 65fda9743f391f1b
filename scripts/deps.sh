#!/usr/bin/env bash
# Installs the Debian 12 packages softrdma needs to build, test and demo, if missing.
#
#   bash scripts/deps.sh
#
# Checks each package with `dpkg -s`; installs only the missing ones with
# `apt-get install -y --no-install-recommends`, running `apt-get update` first only if the
# install fails without it (fresh images have empty package lists). Uses sudo when not
# root. Non-interactive: tshark's "should non-superusers capture packets?" debconf
# question is pre-answered (no) so it never blocks.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config g++ clang libclang-rt-14-dev
  libibverbs-dev ibverbs-utils perftest librdmacm-dev rdmacm-utils
  libpcap-dev zlib1g-dev libisal-dev
  libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  tshark tcpdump iproute2 procps python3
  openmpi-bin libopenmpi-dev ucx-utils libfabric-bin qperf dapl2-utils libgloo-dev gnuplot-nox
  python3-torch libtorch-dev pybind11-dev python3-pytest python3-pyverbs dataset-fashion-mnist
)

# dpkg -s also succeeds for a removed package whose configuration files remain: require
# the status "install ok installed".
installed() { dpkg -s "$1" 2>/dev/null | grep '^Status: install ok installed$' >/dev/null; }

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "deps: all ${#PACKAGES[@]} packages are installed"
  exit 0
fi
echo "deps: installing ${missing[*]}"

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then
    SUDO=(sudo)
  else
    echo "deps: not root and sudo is not available; as root run:" >&2
    echo "  apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
# sudo drops the environment by default: pass DEBIAN_FRONTEND explicitly.
as_root() { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive "$@"; }

# Answer tshark's question (allow non-root capture via the wireshark group?) before it
# is asked. debconf-set-selections comes with debconf, present on every Debian system.
if [[ " ${missing[*]} " == *" tshark "* ]] && command -v debconf-set-selections >/dev/null; then
  echo "wireshark-common wireshark-common/install-setuid boolean false" |
    as_root debconf-set-selections
fi

apt_install() {
  as_root apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confdef \
    -o Dpkg::Options::=--force-confold "${missing[@]}"
}

if ! apt_install; then
  echo "deps: install failed; running apt-get update and retrying"
  as_root apt-get update
  apt_install
fi

# Verify: a package that apt could not provide must not go unnoticed.
still=()
for p in "${missing[@]}"; do
  installed "$p" || still+=("$p")
done
if ((${#still[@]})); then
  echo "deps: still missing after install: ${still[*]}" >&2
  exit 1
fi
echo "deps: installed ${#missing[@]} package(s)"
