#!/usr/bin/env bash
# Time dilation (SOFTRDMA_TDF, `softrdma run --tdf`; docs/wide-area.md, "Time dilation").
#
#   tdf_test.sh BUILD_DIR preload|agreement
#
# preload:   an unmodified program started by `softrdma run --tdf 10` sees dilated time:
#            `sleep 0.2` takes ~2 s of real time (1.9–6 s accepted: start-up on a loaded
#            machine), and 0.2 s at K = 1; Python's time.monotonic, time.perf_counter and
#            time.time each measure a time.sleep(0.1) as ~0.1 s while the real time outside
#            is ~1 s, and so do a threading.Event().wait(0.1) and Condition.wait(0.1) that
#            time out (sem_clockwait with a dilated deadline); a small C++ program's
#            steady_clock, this_thread::sleep_for and condition_variable::wait_for
#            (pthread_cond_clockwait) likewise, when a compiler is at hand; `date` reads
#            within a few seconds of the real date (the epoch is the run's start). The hint
#            about TSC-timed programs (perftest) is on stderr. Bad factors (0.5, "abc", 1e9,
#            via --tdf or SOFTRDMA_TDF) are usage errors (exit 2) naming the variable.
# agreement: the same KV-cache hand-off (kv-demo: Llama-3-8B, 32 tokens = 4 MiB, whole
#            cache, 1 QP, 6 requests at K = 1 and 3 at K = 10) through the same emulated link
#            (100 Mbit/s, 5 ms each way, DCQCN pacing) at K = 1 and K = 10: the fastest
#            request's virtual completion time (hence goodput) must agree within 10 %, and
#            both must lie within [0.95, 1.25] x the link's ideal (bytes x 8 / rate + RTT =
#            345.5 ms). Why 10 %: the transfer is paced at the link rate (330 µs per 4 KiB
#            packet) and the window has grown after the first request, so what differs
#            between the two runs is only the CPU time (per-packet work, a scheduler delay of
#            a few ms on 2 shared cores) that K = 10 shrinks tenfold — a few % of a ~345 ms
#            transfer. The rate is chosen so that K = 1 is not limited by the machine even
#            when the full suite runs beside it: at 1 Gbit/s (16 MiB) the K = 1 run reached
#            only 0.70 Gbit/s (192.6 ms against 144.2 ms ideal) in a clean-clone CI run at
#            load ~8 — the limit dilation exists to remove, but not the property this test
#            checks. At K = 10 the machine carries 10 Mbit/s, at K = 1 100 Mbit/s.
set -uo pipefail
B=$(cd "${1:?usage: tdf_test.sh BUILD_DIR preload|agreement}" && pwd)
case_=${2:?usage: tdf_test.sh BUILD_DIR preload|agreement}
S="$B/bin/softrdma"
out=$(mktemp -d /tmp/softrdma-tdf-test.XXXXXX)
trap 'rm -rf "$out"' EXIT
# shellcheck source=scripts/lib/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/test_lib.sh"
fail() { echo "FAIL: $*"; exit 1; }
# python3, bash and the other unmodified programs here leave their own allocations at exit.
SOFTRDMA=$S
no_leak_checks_under_asan
now_ns() { date +%s%N; }

if [[ $case_ == preload ]]; then
  t0=$(now_ns)
  "$S" run --tdf 10 -- sleep 0.2 2>"$out/err" || fail "softrdma run --tdf 10 -- sleep 0.2 failed: $(cat "$out/err")"
  t1=$(now_ns)
  real_ms=$(( (t1 - t0) / 1000000 ))
  echo "sleep 0.2 at K = 10: $real_ms ms real"
  (( real_ms >= 1900 && real_ms <= 6000 )) || fail "expected ~2000 ms real, got $real_ms"
  grep -q "TSC" "$out/err" || fail "no hint about TSC-timed programs on stderr: $(cat "$out/err")"
  # Real-time figures convert to virtual ones by dividing durations by K (a virtual second
  # lasts K real seconds) and multiplying rates by K.
  grep -q "divide their durations by 10 (multiply their rates)" "$out/err" ||
    fail "the hint does not say to divide durations (multiply rates) by K: $(cat "$out/err")"

  t0=$(now_ns)
  "$S" run -- sleep 0.2 2>"$out/err1" || fail "softrdma run -- sleep 0.2 failed"
  t1=$(now_ns)
  real_ms=$(( (t1 - t0) / 1000000 ))
  echo "sleep 0.2 at K = 1: $real_ms ms real"
  (( real_ms < 1500 )) || fail "K = 1 is not real time: $real_ms ms"
  ! grep -q "time dilation" "$out/err1" || fail "a hint without --tdf"

  if command -v python3 >/dev/null; then
    t0=$(now_ns)
    "$S" run --tdf 10 -- python3 -c '
import time
import threading
m, p, w = time.monotonic(), time.perf_counter(), time.time()
time.sleep(0.1)
m, p, w = time.monotonic() - m, time.perf_counter() - p, time.time() - w
e = time.monotonic()
threading.Event().wait(0.1)
c = threading.Condition()
with c:
    c.wait(0.1)
print("%.4f %.4f %.4f %.4f" % (m, p, w, (time.monotonic() - e) / 2))' \
      >"$out/py" 2>"$out/pyerr" || fail "python3 under --tdf failed (exit $?): $(tail -40 "$out/pyerr")"
    t1=$(now_ns)
    real_ms=$(( (t1 - t0) / 1000000 ))
    echo "python at K = 10, time.sleep(0.1) by monotonic, perf_counter, time; Event/Condition wait(0.1): $(cat "$out/py") s; $real_ms ms real"
    awk '{ for (i = 1; i <= 3; i++) if ($i < 0.099 || $i > 0.2) exit 1;
           if ($4 < 0.099 || $4 > 0.2) exit 1 }' "$out/py" ||
      fail "python did not measure ~0.1 s virtual: $(cat "$out/py")"
    (( real_ms >= 3000 )) || fail "three waits of 0.1 s took $real_ms ms real, expected >= 3000"
  fi

  if command -v c++ >/dev/null; then
    # An unmodified C++ program: steady_clock, this_thread::sleep_for and a
    # condition_variable::wait_for that times out (pthread_cond_clockwait).
    cat >"$out/cv.cpp" <<'CPP'
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
int main() {
  using C = std::chrono::steady_clock;
  std::mutex m;
  std::condition_variable cv;
  std::unique_lock<std::mutex> l(m);
  auto t0 = C::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto t1 = C::now();
  bool timed_out = cv.wait_for(l, std::chrono::milliseconds(100)) == std::cv_status::timeout;
  auto t2 = C::now();
  std::printf("%.4f %.4f %d\n", std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count(), timed_out ? 1 : 0);
}
CPP
    if c++ -O1 -o "$out/cv" "$out/cv.cpp" 2>"$out/cc"; then
      t0=$(now_ns)
      "$S" run --tdf 10 -- "$out/cv" >"$out/cv.out" 2>"$out/cverr" ||
        fail "the C++ program failed (exit $?): $(tail -40 "$out/cverr")"
      t1=$(now_ns)
      real_ms=$(( (t1 - t0) / 1000000 ))
      echo "C++ at K = 10, sleep_for(100ms), cv.wait_for(100ms): $(cat "$out/cv.out"); $real_ms ms real"
      awk '{ exit !($1 >= 0.099 && $1 < 0.2 && $2 >= 0.099 && $2 < 0.2 && $3 == 1) }' "$out/cv.out" ||
        fail "the C++ program did not see 0.1 s virtual: $(cat "$out/cv.out")"
      (( real_ms >= 2000 )) || fail "two waits of 0.1 s took $real_ms ms real, expected >= 2000"
    fi
  fi

  real_s=$(date +%s)
  virt_s=$("$S" run --tdf 10 -- date +%s 2>/dev/null)
  echo "date: real $real_s, under --tdf 10: $virt_s"
  (( virt_s - real_s < 5 && real_s - virt_s < 5 )) || fail "the dilated date is not near the real one"

  for bad in 0.5 abc 1e9; do
    "$S" run --tdf "$bad" -- true 2>"$out/bad"
    rc=$?
    [[ $rc == 2 ]] || fail "--tdf $bad: exit $rc, expected 2"
    grep -q "expected a real number in 1..1000000, got '$bad'" "$out/bad" || fail "--tdf $bad: $(cat "$out/bad")"
    SOFTRDMA_TDF=$bad "$S" run -- true 2>"$out/bad"
    rc=$?
    [[ $rc == 2 ]] || fail "SOFTRDMA_TDF=$bad: exit $rc, expected 2"
    grep -q "SOFTRDMA_TDF: expected" "$out/bad" || fail "SOFTRDMA_TDF=$bad: $(cat "$out/bad")"
  done
  echo "PASS"
  exit 0
fi

[[ $case_ == agreement ]] || fail "unknown case $case_"
# A port per K (the test may run beside others); the WAN's shared link state is per K too.
# K = 1 runs in real time on a shared machine: a scheduler delay of a few ms (load 7 on 2
# cores) lengthens a request there, so it gets 6 requests (0.35 s real each) for one
# undisturbed one; K = 10 shrinks such delays tenfold and needs 3 (3.5 s each).
declare -A best requests=([1]=6 [10]=3)
for K in 1 10; do
  port=$((17860 + K))
  t0=$(now_ns)
  SOFTRDMA_KV_QPS=1 SOFTRDMA_CC=dcqcn SOFTRDMA_WAN="delay=5ms,rate=100mbit,queue=2m,seed=$K" SOFTRDMA_KV_IB_TIMEOUT=17 \
    timeout 120 "$S" run --tdf "$K" -- "$B/bin/kv-demo" --role both \
    --metadata "tcp://127.0.0.1:$port" --tokens 32 --layer_ms 1 --requests "${requests[$K]}" --modes whole \
    >"$out/demo.$K" 2>&1 || { cat "$out/demo.$K"; fail "kv-demo at K = $K failed"; }
  t1=$(now_ns)
  grep -q "blocks verified by decode: all match" "$out/demo.$K" || { cat "$out/demo.$K"; fail "data"; }
  # Per-request rows: "whole <n> <...> <exposed> ms <...> ms <blocks>"; the fastest request.
  best[$K]=$(awk '$1 == "whole" && $2 ~ /^[0-9]+$/ && $5 == "ms" { if (b == "" || $4 < b) b = $4 }
                  END { print b }' "$out/demo.$K")
  [[ -n ${best[$K]} ]] || { cat "$out/demo.$K"; fail "no per-request rows at K = $K"; }
  echo "K = $K: fastest hand-off ${best[$K]} ms virtual ($(( (t1 - t0) / 1000000 )) ms real for the run)"
  grep -E "^ +whole" "$out/demo.$K"
done
bytes=$((32 * 128 * 1024))
awk -v a="${best[1]}" -v b="${best[10]}" -v n="$bytes" 'BEGIN {
  ideal = n * 8 / 1e8 * 1000 + 10
  printf "ideal %.1f ms; K = 1: %.2f ms (%.1f Mbit/s goodput), K = 10: %.2f ms (%.1f Mbit/s); difference %.1f %%\n",
    ideal, a, n * 8 / a / 1e3, b, n * 8 / b / 1e3, (b - a) / a * 100
  ok = 1
  if (b > a * 1.10 || b < a / 1.10) { print "FAIL: K = 1 and K = 10 differ by more than 10 %"; ok = 0 }
  if (a < 0.95 * ideal || a > 1.25 * ideal) { print "FAIL: K = 1 outside [0.95, 1.25] x ideal"; ok = 0 }
  if (b < 0.95 * ideal || b > 1.25 * ideal) { print "FAIL: K = 10 outside [0.95, 1.25] x ideal"; ok = 0 }
  exit !ok }' || exit 1
echo "PASS"
