#include "base/clock.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "base/params.h"

namespace softrdma::clock {

namespace {

__extension__ typedef unsigned __int128 Uint128;

using ClockGettime = int (*)(clockid_t, timespec*);
using ClockNanosleep = int (*)(clockid_t, int, const timespec*, timespec*);

/// libc's own function `name`, from libc.so.6's handle: a lookup in one library's scope, so
/// an LD_PRELOAD definition of the same name (libsoftrdma_tdf.so's) is not found.
void* libc_function(const char* name) {
  void* libc = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  void* fn = libc ? ::dlsym(libc, name) : nullptr;
  if (libc) ::dlclose(libc);
  return fn;
}

int real_clock_gettime(clockid_t id, timespec* ts) {
  static const auto fn = reinterpret_cast<ClockGettime>(libc_function("clock_gettime"));
  if (fn) return fn(id, ts);
  return static_cast<int>(::syscall(SYS_clock_gettime, id, ts));  // no libc.so.6 (static)
}

int real_clock_nanosleep(clockid_t id, int flags, const timespec* t, timespec* rem) {
  static const auto fn = reinterpret_cast<ClockNanosleep>(libc_function("clock_nanosleep"));
  if (fn) return fn(id, flags, t, rem);
  return ::syscall(SYS_clock_nanosleep, id, flags, t, rem) == 0 ? 0 : errno;
}

uint64_t read_clock(clockid_t id) {
  timespec ts{};
  real_clock_gettime(id, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

/// The dilation in force: K, ⌈2^64 / K⌉ for the division on the hot path (now_ns), the
/// wall-clock epoch.
struct Dilation {
  double k = 1.0;
  uint64_t inv_q64 = 0;  // unused when k == 1
  uint64_t epoch_ns = 0;
};

Dilation make_dilation(double k, uint64_t epoch_ns) {
  Dilation d;
  d.k = k;
  d.epoch_ns = epoch_ns;
  if (k != 1.0) {
    // One above the quotient as long double computes it (≥ 64-bit mantissa: within one
    // unit), so real·inv/2^64 is never below real/K: an exact quotient is never rounded down
    // to the integer below, and the error upwards stays under 1 ns for any real time
    // below 2^64 ns.
    const long double q = std::ldexp(1.0L, 64) / static_cast<long double>(k);
    d.inv_q64 = q >= std::ldexp(1.0L, 64) - 1 ? UINT64_MAX : static_cast<uint64_t>(q) + 1;
  }
  return d;
}

[[noreturn]] void fatal(const std::string& error) {
  std::fprintf(stderr, "softrdma: %s\n", error.c_str());
  std::fflush(stderr);
  std::_Exit(2);
}

Dilation from_environment() {
  double k = 1.0;
  uint64_t epoch = 0;
  std::string error;
  if (!read_environment(k, epoch, error)) fatal(error);
  if (k != 1.0 && epoch == 0) epoch = read_clock(CLOCK_REALTIME) - read_clock(CLOCK_MONOTONIC);
  return make_dilation(k, epoch);
}

// The process's dilation, read from the environment at the first clock read. Not a
// function-local static: reading the environment allocates, and an allocator may read the
// clock itself (AddressSanitizer's calls clock_gettime, interposed by libsoftrdma_tdf.so,
// under its lock), so the read can re-enter, which a static's guard treats as a recursive
// initialisation (docs/wide-area.md, "Time dilation"). The thread reading the environment gets
// real time (K = 1) if it re-enters, and other threads wait the few microseconds the read takes.
Dilation g_dilation;
Dilation g_identity;                   // K = 1: what a re-entered read sees
std::atomic<int> g_dilation_state{0};  // 0: not read, 1: being read, 2: ready
std::atomic<pthread_t> g_dilation_reader{};

Dilation& dilation() {
  if (g_dilation_state.load(std::memory_order_acquire) == 2) [[likely]]
    return g_dilation;
  int expected = 0;
  if (g_dilation_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    g_dilation_reader.store(::pthread_self(), std::memory_order_relaxed);
    g_dilation = from_environment();
    g_dilation_state.store(2, std::memory_order_release);
    return g_dilation;
  }
  if (expected == 1 &&
      ::pthread_equal(g_dilation_reader.load(std::memory_order_relaxed), ::pthread_self()))
    return g_identity;  // re-entered while reading: real time meanwhile
  while (g_dilation_state.load(std::memory_order_acquire) != 2) ::sched_yield();
  return g_dilation;
}

// FakeClock: the fake real monotonic time, and whether one is in force.
std::atomic<bool> g_fake{false};
std::atomic<uint64_t> g_fake_real_ns{0};
Dilation g_saved;

uint64_t monotonic_raw() {
  if (g_fake.load(std::memory_order_relaxed)) return g_fake_real_ns.load(std::memory_order_relaxed);
  return read_clock(CLOCK_MONOTONIC);
}

uint64_t realtime_raw() {
  if (g_fake.load(std::memory_order_relaxed))
    return g_fake_real_ns.load(std::memory_order_relaxed) + kFakeWallOffsetNs;
  return read_clock(CLOCK_REALTIME);
}

uint64_t divide(const Dilation& d, uint64_t real_ns) {
  if (d.k == 1.0) return real_ns;
  return static_cast<uint64_t>((static_cast<Uint128>(real_ns) * d.inv_q64) >> 64);
}

uint64_t multiply_up(const Dilation& d, uint64_t virtual_ns) {
  if (d.k == 1.0) return virtual_ns;
  const long double r = std::ceil(static_cast<long double>(virtual_ns) * d.k);
  return r >= std::ldexp(1.0L, 64) ? UINT64_MAX : static_cast<uint64_t>(r);
}

}  // namespace

bool parse_tdf(std::string_view text, double& out, std::string& error) {
  const std::string s(text);
  auto bad = [&] {
    error = "SOFTRDMA_TDF: expected a real number in 1..1000000, got '" + s + "'";
    return false;
  };
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.'))
    return bad();   // no blanks, signs, "inf" or "nan"
  for (char c : s)  // decimal only (strtod would take "0x10")
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' &&
        c != '-' && c != '+')
      return bad();
  errno = 0;
  char* end = nullptr;
  const double k = std::strtod(s.c_str(), &end);
  if (errno == ERANGE || *end != 0 || !std::isfinite(k) || k < 1.0 || k > kMaxTdf) return bad();
  out = k;
  return true;
}

bool read_environment(double& tdf, uint64_t& epoch_ns, std::string& error) {
  double k = 1.0;
  if (const char* v = params::raw(params::kTdf); v && !parse_tdf(v, k, error)) return false;
  int64_t epoch = 0;
  if (!params::read_integer(params::kTdfEpoch, epoch, error)) return false;
  tdf = k;
  epoch_ns = static_cast<uint64_t>(epoch);
  return true;
}

double tdf() {
  return dilation().k;
}

bool dilated() {
  return dilation().k != 1.0;
}

uint64_t now_ns() {
  return divide(dilation(), monotonic_raw());
}

uint64_t coarse_now_ns() {
  if (g_fake.load(std::memory_order_relaxed)) return now_ns();
  return divide(dilation(), read_clock(CLOCK_MONOTONIC_COARSE));
}

uint64_t realtime_ns() {
  return dilate_realtime(realtime_raw());
}

uint64_t dilate_monotonic(uint64_t real_ns) {
  return divide(dilation(), real_ns);
}

uint64_t dilate_realtime(uint64_t r) {
  const Dilation& d = dilation();
  if (d.k == 1.0) return r;
  return r >= d.epoch_ns ? d.epoch_ns + divide(d, r - d.epoch_ns)
                         : d.epoch_ns - divide(d, d.epoch_ns - r);
}

uint64_t undilate_realtime(uint64_t v) {
  const Dilation& d = dilation();
  if (d.k == 1.0) return v;
  if (v >= d.epoch_ns) {
    const uint64_t span = multiply_up(d, v - d.epoch_ns);
    return span > UINT64_MAX - d.epoch_ns ? UINT64_MAX : d.epoch_ns + span;
  }
  const uint64_t back = static_cast<uint64_t>(
      std::floor(static_cast<long double>(d.epoch_ns - v) * static_cast<long double>(d.k)));
  return back >= d.epoch_ns ? 0 : d.epoch_ns - back;
}

uint64_t real_now_ns() {
  return monotonic_raw();
}

uint64_t real_realtime_ns() {
  return realtime_raw();
}

uint64_t to_real_ns(uint64_t virtual_ns) {
  return multiply_up(dilation(), virtual_ns);
}

uint64_t to_virtual_ns(uint64_t real_ns) {
  const Dilation& d = dilation();
  if (d.k == 1.0) return real_ns;
  // Durations are converted exactly (rounded down), not through the hot path's ⌈2^64/K⌉.
  return static_cast<uint64_t>(std::floor(static_cast<long double>(real_ns) / d.k));
}

int to_real_timeout_ms(int virtual_ms) {
  if (virtual_ms < 0) return -1;
  const uint64_t r = multiply_up(dilation(), static_cast<uint64_t>(virtual_ms));
  return r > uint64_t{INT32_MAX} ? INT32_MAX : static_cast<int>(r);
}

timespec to_real_timespec(uint64_t virtual_ns) {
  const uint64_t r = to_real_ns(virtual_ns);
  timespec ts{};
  // time_t holds 2^63 s; UINT64_MAX ns is 584 years.
  ts.tv_sec = static_cast<time_t>(r / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(r % 1'000'000'000);
  return ts;
}

uint64_t to_real_deadline_ns(uint64_t virtual_deadline_ns) {
  return multiply_up(dilation(), virtual_deadline_ns);
}

std::chrono::steady_clock::time_point to_real(Steady::time_point deadline) {
  const auto ns = deadline.time_since_epoch().count();
  const uint64_t r = ns <= 0 ? 0 : to_real_deadline_ns(static_cast<uint64_t>(ns));
  return std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(static_cast<int64_t>(std::min<uint64_t>(r, INT64_MAX))));
}

void sleep_for_ns(uint64_t virtual_ns) {
  if (virtual_ns == 0) return;
  sleep_until_ns(now_ns() + virtual_ns);
}

void sleep_until_ns(uint64_t virtual_deadline_ns) {
  while (now_ns() < virtual_deadline_ns) {
    const uint64_t real = to_real_deadline_ns(virtual_deadline_ns);
    if (g_fake.load(std::memory_order_relaxed)) {
      if (g_fake_real_ns.load() < real) g_fake_real_ns.store(real);
      continue;
    }
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(real / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(real % 1'000'000'000);
    // Absolute on CLOCK_MONOTONIC: a signal or a late wake-up costs nothing extra. The loop
    // covers the last ns of rounding between ⌈t·K⌉ and the hot path's division.
    real_clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
    if (now_ns() < virtual_deadline_ns && read_clock(CLOCK_MONOTONIC) >= real) {
      timespec one{0, 1000};
      real_clock_nanosleep(CLOCK_MONOTONIC, 0, &one, nullptr);
    }
  }
}

std::cv_status wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          Steady::time_point deadline) {
  const auto ns = deadline.time_since_epoch().count();
  const uint64_t real = ns <= 0 ? 0 : to_real_deadline_ns(static_cast<uint64_t>(ns));
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(std::min<uint64_t>(real / 1'000'000'000, INT64_MAX));
  ts.tv_nsec = static_cast<long>(real % 1'000'000'000);
  // libc's own: libsoftrdma_tdf.so's pthread_cond_clockwait would take `ts` for virtual.
  using CondClockwait = int (*)(pthread_cond_t*, pthread_mutex_t*, clockid_t, const timespec*);
  static const auto fn = reinterpret_cast<CondClockwait>(libc_function("pthread_cond_clockwait"));
  const int r = (fn ? fn : &::pthread_cond_clockwait)(
      cv.native_handle(), lock.mutex()->native_handle(), CLOCK_MONOTONIC, &ts);
  return r == ETIMEDOUT ? std::cv_status::timeout : std::cv_status::no_timeout;
}

void real_sleep_ns(uint64_t real_ns) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(real_ns / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(real_ns % 1'000'000'000);
  while (real_clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR) {
  }
}

FakeClock::FakeClock(double tdf, uint64_t real_ns, uint64_t epoch_ns) {
  if (!(tdf >= 1.0 && tdf <= kMaxTdf)) throw std::invalid_argument("FakeClock: tdf out of range");
  if (g_fake.load()) throw std::logic_error("FakeClock: one at a time");
  g_saved = dilation();
  dilation() = make_dilation(tdf, epoch_ns);
  g_fake_real_ns.store(real_ns);
  g_fake.store(true);
}

FakeClock::~FakeClock() {
  g_fake.store(false);
  dilation() = g_saved;
}

void FakeClock::set_real_ns(uint64_t real_ns) {
  g_fake_real_ns.store(real_ns);
}

void FakeClock::advance_real_ns(uint64_t real_ns) {
  g_fake_real_ns.fetch_add(real_ns);
}

uint64_t FakeClock::real_ns() const {
  return g_fake_real_ns.load();
}

}  // namespace softrdma::clock
