// The one clock of the softrdma stack, and time dilation.
//
// Time dilation (Gupta et al., "To Infinity and Beyond: Time-Warped Network Emulation", NSDI
// 2006): with SOFTRDMA_TDF=K (a real number, K ≥ 1) this clock runs K times slower than real
// time, so the machine — its CPUs, copies and system calls — looks K times faster to
// everything that measures with it. Emulated link rates and delays, the engine's timers,
// the collectives' and KV engine's timeouts and the tools' measurements are all in virtual
// units: a 100 Gbit/s link at K = 50 is paced at 2 Gbit/s of real time, a 25 ms delay waits
// 1.25 s of real time. K = 1 (the default) is the identity: virtual time is real time.
//
// Virtual monotonic time is CLOCK_MONOTONIC / K, an absolute function of the host's clock,
// so all processes of one emulated system (same K) agree on it without coordination — the
// shared-memory link state of the WAN emulator and the same-host rings compare times taken
// in different processes. Virtual wall-clock time is E + (CLOCK_REALTIME − E) / K for an
// epoch E: SOFTRDMA_TDF_EPOCH (ns since 1970; `softrdma run --tdf` sets it to its own start
// so the processes it starts agree and dates stay near the real date), else the host's boot
// time (CLOCK_REALTIME − CLOCK_MONOTONIC), which every process on the host also agrees on.
//
// Nothing in softrdma reads the system clock or sleeps directly except this module (and
// the few places marked as real: a random seed, waits for a lock holder or an exiting
// thread — real_sleep_ns — and bench/ programs that measure the machine itself). Kernel
// waits take real durations: poll/epoll/ppoll timeouts and condition-variable deadlines are
// converted with to_real_*() or wait_until() (a wait of d virtual ns is d·K real ns). The real
// clock itself is read through libc's own clock_gettime (looked up in libc.so.6, not through
// the symbol search order), so that the LD_PRELOAD interposer of `softrdma run --tdf`
// (libsoftrdma_tdf.so, base/tdf_interpose.cpp) never dilates this module a second time;
// its sleeps and condition-variable waits call libc's own functions the same way.
//
// For tests, FakeClock replaces the real clock with a settable one (and may set K), in this
// process only.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <string>
#include <string_view>

namespace softrdma::clock {

/// Largest accepted time dilation factor (a virtual second then lasts 11.6 real days).
inline constexpr double kMaxTdf = 1'000'000.0;

/// Parses a time dilation factor: a decimal real number (e.g. "10", "2.5", "1e2") in
/// [1, kMaxTdf], nothing else (no blanks, no suffix, not NaN or infinity). On success sets
/// `out` and returns true; on failure returns false and sets `error` to
/// "SOFTRDMA_TDF: expected a real number in 1..1000000, got '<text>'".
bool parse_tdf(std::string_view text, double& out, std::string& error);

/// Reads SOFTRDMA_TDF and SOFTRDMA_TDF_EPOCH from the environment now (not the values this
/// process's clock took at its first use): `tdf` = K (1 when unset or empty), `epoch_ns` =
/// the epoch (0 when unset: the boot time is used). Returns false with `error` naming the
/// variable and the accepted form on a malformed value — what a device open or a tool's
/// start-up checks so that the problem is reported, not fatal.
bool read_environment(double& tdf, uint64_t& epoch_ns, std::string& error);

/// This process's time dilation factor K (≥ 1): SOFTRDMA_TDF, read once, at the first use of
/// this module (the clock must not change speed while the process runs). Unset or empty: 1.
/// A malformed value is fatal: the message of parse_tdf() goes to stderr and the process
/// exits with status 2 — an emulation that silently ran in real time would give wrong numbers.
double tdf();

/// True when tdf() is not 1 (time is dilated).
bool dilated();

/// Virtual monotonic time in ns: CLOCK_MONOTONIC / K, rounded down. Never decreases.
uint64_t now_ns();

/// now_ns() from CLOCK_MONOTONIC_COARSE: cheaper, resolution of a scheduler tick (1–4 ms
/// real), for timers of 100 ms and more.
uint64_t coarse_now_ns();

/// Virtual wall-clock time in ns since 1970: E + (CLOCK_REALTIME − E) / K (see above).
uint64_t realtime_ns();

/// The virtual time of a reading `real_ns` of CLOCK_MONOTONIC (or of another clock that
/// counts from boot: CLOCK_BOOTTIME, CLOCK_MONOTONIC_RAW): real / K, rounded down — what
/// now_ns() returns at that instant.
uint64_t dilate_monotonic(uint64_t real_ns);

/// The virtual wall-clock time (ns since 1970) of a CLOCK_REALTIME reading `real_ns`.
uint64_t dilate_realtime(uint64_t real_ns);

/// The real CLOCK_REALTIME time (ns since 1970) at which the virtual wall clock reads
/// `virtual_ns` (the inverse of dilate_realtime, rounded up; saturating).
uint64_t undilate_realtime(uint64_t virtual_ns);

/// Real CLOCK_MONOTONIC in ns, undilated — only for what must stay real (a kernel deadline,
/// a measurement of the machine itself); say why where you use it.
uint64_t real_now_ns();

/// Real CLOCK_REALTIME in ns since 1970, undilated.
uint64_t real_realtime_ns();

/// A virtual duration (ns) as real ns: ⌈d · K⌉, saturating at UINT64_MAX. A wait of the
/// result never ends before `d` virtual ns have passed.
uint64_t to_real_ns(uint64_t virtual_ns);

/// A real duration (ns) as virtual ns: ⌊d / K⌋.
uint64_t to_virtual_ns(uint64_t real_ns);

/// A poll/epoll_wait timeout given in virtual ms, as the real ms to pass to the kernel:
/// negative (wait forever) stays -1, 0 stays 0, others ⌈ms · K⌉ saturating at INT32_MAX.
int to_real_timeout_ms(int virtual_ms);

/// A virtual duration (ns) as a real relative timespec (ppoll, epoll_pwait2, nanosleep).
timespec to_real_timespec(uint64_t virtual_ns);

/// An absolute virtual monotonic time (ns, the now_ns() clock) as the real CLOCK_MONOTONIC
/// time (ns) at which it is reached: ⌈t · K⌉, saturating.
uint64_t to_real_deadline_ns(uint64_t virtual_deadline_ns);

/// Sleeps at least `virtual_ns` virtual ns (⌈virtual_ns · K⌉ real ns; restarts after
/// signals). Under a FakeClock it advances the fake clock instead of sleeping.
void sleep_for_ns(uint64_t virtual_ns);

/// Sleeps until now_ns() ≥ `virtual_deadline_ns` (returns at once if it has passed).
void sleep_until_ns(uint64_t virtual_deadline_ns);

/// A std::chrono clock over now_ns(): what `using Clock = std::chrono::steady_clock` becomes
/// in code that measures or keeps deadlines. Never hand its time points or durations to a
/// standard wait (condition_variable::wait_until/wait_for, this_thread::sleep_*): convert
/// with to_real() or use sleep_for()/sleep_until() below.
struct Steady {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<Steady, duration>;
  static constexpr bool is_steady = true;
  /// now_ns() as a time point.
  static time_point now() noexcept { return time_point(duration(static_cast<rep>(now_ns()))); }
};

/// A virtual deadline as the real std::chrono::steady_clock time point at which it is
/// reached (libstdc++'s steady_clock is CLOCK_MONOTONIC). Reads no clock. For condition
/// variables use clock::wait_until below.
std::chrono::steady_clock::time_point to_real(Steady::time_point deadline);

/// A virtual duration as a real one, rounded up (a wait never ends early); negative → 0.
template <class Rep, class Period>
std::chrono::nanoseconds to_real(std::chrono::duration<Rep, Period> d) {
  const auto ns = std::chrono::ceil<std::chrono::nanoseconds>(d).count();
  return std::chrono::nanoseconds(
      ns <= 0 ? 0
              : static_cast<int64_t>(std::min<uint64_t>(to_real_ns(static_cast<uint64_t>(ns)),
                                                        uint64_t{INT64_MAX})));
}

/// Waits on `cv` (`lock` held) until notified or until the virtual deadline has passed:
/// std::condition_variable::wait_until on this clock (spurious wake-ups included). Calls
/// libc's own pthread_cond_clockwait with the real CLOCK_MONOTONIC deadline and takes the
/// timeout from its result: libstdc++'s waits would reach libsoftrdma_tdf.so's interposer in
/// a preloaded process, which takes deadlines for virtual ones, and would decide the timeout
/// from a dilated steady_clock read. Not for use under FakeClock.
std::cv_status wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          Steady::time_point deadline);

/// wait_until with a predicate: false when `pred` is still false at the deadline.
template <class Predicate>
bool wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                Steady::time_point deadline, Predicate pred) {
  while (!pred())
    if (wait_until(cv, lock, deadline) == std::cv_status::timeout) return pred();
  return true;
}

/// condition_variable::wait_for(lock, d, pred) for a virtual duration `d`.
template <class Rep, class Period, class Predicate>
bool wait_for(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
              std::chrono::duration<Rep, Period> d, Predicate pred) {
  return wait_until(cv, lock,
                    Steady::now() + std::chrono::ceil<std::chrono::nanoseconds>(
                                        std::max(d, std::chrono::duration<Rep, Period>::zero())),
                    pred);
}

/// Sleeps `real_ns` of real time, undilated and past LD_PRELOAD interposers — for waits on
/// the machine itself (a lock holder, an exiting thread), not on the emulated system.
void real_sleep_ns(uint64_t real_ns);

/// sleep_for_ns over a chrono duration (negative: no sleep).
template <class Rep, class Period>
void sleep_for(std::chrono::duration<Rep, Period> d) {
  const auto ns = std::chrono::ceil<std::chrono::nanoseconds>(d).count();
  if (ns > 0) sleep_for_ns(static_cast<uint64_t>(ns));
}

/// sleep_until_ns over a Steady time point.
inline void sleep_until(Steady::time_point t) {
  const auto ns = t.time_since_epoch().count();
  if (ns > 0) sleep_until_ns(static_cast<uint64_t>(ns));
}

/// Replaces the real clocks (CLOCK_MONOTONIC and CLOCK_REALTIME) of this process with
/// settable ones while it lives, and sets K (default 1) — for unit tests of code that reads
/// this module. One at a time; not thread-safe against concurrent readers that start or end
/// with it. sleep_for_ns/sleep_until_ns advance it instead of sleeping.
class FakeClock {
 public:
  /// Starts at real monotonic time `real_ns` (wall clock: `real_ns` + 1.7e18) with factor
  /// `tdf` (≥ 1; throws std::invalid_argument otherwise) and epoch `epoch_ns` for the wall
  /// clock.
  explicit FakeClock(double tdf = 1.0, uint64_t real_ns = 1'000'000'000, uint64_t epoch_ns = 0);
  ~FakeClock();
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  /// Sets the fake real monotonic time (ns); the wall clock moves by the same amount.
  void set_real_ns(uint64_t real_ns);
  /// Advances the fake real clocks by `real_ns`.
  void advance_real_ns(uint64_t real_ns);
  /// The fake real monotonic time (ns).
  uint64_t real_ns() const;
};

/// Offset of FakeClock's wall clock from its monotonic clock (ns): a date in 2023.
inline constexpr uint64_t kFakeWallOffsetNs = 1'700'000'000'000'000'000ull;

}  // namespace softrdma::clock
