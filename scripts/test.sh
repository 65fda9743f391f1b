#!/usr/bin/env bash
# Builds softrdma and runs every test: the default preset (RelWithDebInfo, build/) once on
# the same-host shared-memory path (the default) and once forced to UDP
# (SOFTRDMA_TRANSPORT=udp), and the asan preset (AddressSanitizer + UBSan, build-asan/).
#
#   bash scripts/test.sh
#
# Installs missing Debian packages first (scripts/deps.sh). For each preset:
#   cmake --preset P && cmake --build --preset P -j $(nproc) && ctest --preset P
# The second preset runs even if the first fails. Exits non-zero if any step failed and
# ends with one summary line. Sized for CI: 2 cores, 30 minutes.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
start=$SECONDS

bash scripts/deps.sh || { echo "test.sh: FAILED installing dependencies (scripts/deps.sh)"; exit 1; }

JOBS=$(nproc 2>/dev/null || echo 2)
results=()
failed=0

run_preset() {
  local preset=$1 t0=$SECONDS step
  echo "==== preset $preset: configure, build (-j $JOBS), test ===="
  if ! cmake --preset "$preset"; then
    step=configure
  elif ! cmake --build --preset "$preset" -j "$JOBS"; then
    step=build
  elif ! ctest --preset "$preset"; then
    step=ctest
  elif [[ $preset == default ]] && ! SOFTRDMA_TRANSPORT=udp ctest --preset "$preset"; then
    # Peers on one host take the shared-memory path by default (SOFTRDMA_TRANSPORT=auto):
    # run every test once more over the UDP wire path.
    step="ctest (SOFTRDMA_TRANSPORT=udp)"
  else
    results+=("$preset: ok ($((SECONDS - t0)) s)")
    return 0
  fi
  results+=("$preset: FAILED at $step ($((SECONDS - t0)) s)")
  failed=1
  return 1
}

run_preset default
run_preset asan

echo "==== summary ===="
printf '  %s\n' "${results[@]}"
summary=$(IFS=';'; echo "${results[*]}")
if ((failed)); then
  echo "test.sh: FAILED — ${summary//;/, } — $((SECONDS - start)) s total"
  exit 1
fi
echo "test.sh: PASSED — ${summary//;/, } — $((SECONDS - start)) s total"
