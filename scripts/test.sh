#!/usr/bin/env bash
# Builds softrdma and runs every test: the default preset (RelWithDebInfo, build/) once on
# the same-host shared-memory path (the default) and once forced to UDP
# (SOFTRDMA_TRANSPORT=udp; tests labelled single_pass only once), and the asan preset
# (AddressSanitizer + UBSan, build-asan/).
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
  elif [[ $preset == default ]] && ! SOFTRDMA_TRANSPORT=udp ctest --preset "$preset" -LE single_pass; then
    # Peers on one host take the shared-memory path by default (SOFTRDMA_TRANSPORT=auto):
    # run the tests once more over the UDP wire path — all but those labelled single_pass,
    # which that would repeat unchanged (unit tests that open no device; cases that choose
    # their path themselves) or which cost minutes without testing the path (riostream;
    # each label's CMakeLists.txt says why).
    step="ctest (SOFTRDMA_TRANSPORT=udp)"
  else
    results+=("$preset: ok ($((SECONDS - t0)) s)")
    return 0
  fi
  # Name the failed tests in the summary, which is what a CI log's tail shows.
  local dir=build names=""
  [[ $preset == default ]] || dir=build-$preset
  if [[ $step == ctest* && -s $dir/Testing/Temporary/LastTestsFailed.log ]]; then
    # One name per line: a parameterised gtest's ctest name carries its parameter
    # ("Suite/Test/Case  # GetParam() = ..."), spaces included.
    local -a failed_names
    mapfile -t failed_names < <(cut -d: -f2- "$dir/Testing/Temporary/LastTestsFailed.log" | head -20)
    names=$(printf '%s\n' "${failed_names[@]}" | paste -sd';')
    # Their output from this run (ctest printed it mid-log; the rerun below overwrites the
    # log), kept for the diagnostic section at the end.
    first_output "$dir/Testing/Temporary/LastTest.log" "${failed_names[@]}" >"$dir/first-failures.log"
  fi
  results+=("$preset: FAILED at $step ($((SECONDS - t0)) s)${names:+ [$names]}")
  [[ -n $names ]] && rerun+=("$preset|$step")
  failed=1
  return 1
}

# first_output LOG NAME...: the last 120 lines of each named test's section of ctest's
# LastTest.log (a section runs from "N/M Testing: NAME" to its "end time" line).
first_output() {
  local log=$1 name
  shift
  for name in "$@"; do
    echo "---- $name: output of the failed run (last 120 lines) ----"
    # Whole-name matches (names may hold spaces, '#', '=' and quotes): the line is exactly
    # "N/M Testing: NAME", and the section ends at "\"NAME\" end time:".
    awk -v n="$name" '!on && $0 ~ /^[0-9]+\/[0-9]+ Testing: / && substr($0, index($0, "Testing: ") + 9) == n { on = 1 }
      on { print } on && index($0, "\"" n "\" end time:") == 1 { on = 0 }' "$log" | tail -120
  done
}

rerun=()
run_preset default
run_preset asan

# The failed tests once more, with their output, so that a CI log's tail shows why they
# failed and whether they fail again. Diagnostic only: the verdict above stands.
for r in "${rerun[@]}"; do
  preset=${r%%|*}
  env=()
  [[ ${r#*|} == *udp* ]] && env=(SOFTRDMA_TRANSPORT=udp)
  dir=build
  [[ $preset == default ]] || dir=build-$preset
  echo "==== preset $preset: the failed tests' output (${env[*]:-auto transport}) ===="
  cat "$dir/first-failures.log" 2>/dev/null
  echo "==== preset $preset: the failed tests again (${env[*]:-auto transport}), diagnostic only ===="
  env "${env[@]}" ctest --preset "$preset" --rerun-failed --output-on-failure 2>&1 | tail -150
done

echo "==== summary ===="
printf '  %s\n' "${results[@]}"
summary=$(IFS=';'; echo "${results[*]}")
if ((failed)); then
  echo "test.sh: FAILED — ${summary//;/, } — $((SECONDS - start)) s total"
  exit 1
fi
echo "test.sh: PASSED — ${summary//;/, } — $((SECONDS - start)) s total"
