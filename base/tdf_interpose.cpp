// libsoftrdma_tdf.so: an LD_PRELOAD library (loaded by `softrdma run --tdf K`) that shows an
// unmodified program the dilated clock of base/clock.h, so a program that times itself
// (perftest-style tools using clock_gettime, Python's time module, date, sleep) measures
// and sleeps in virtual time, in step with the softrdma devices it drives.
//
// Interposed (glibc names): clock_gettime — CLOCK_MONOTONIC, _RAW, _COARSE and
// CLOCK_BOOTTIME read real / K, CLOCK_REALTIME, _COARSE and CLOCK_TAI read
// E + (real − E) / K (clock.h: E = SOFTRDMA_TDF_EPOCH, set by `softrdma run`, else the boot
// time), CPU-time clocks are left alone; gettimeofday and time (the wall clock); nanosleep,
// clock_nanosleep (relative and TIMER_ABSTIME), usleep and sleep wait K times longer in real
// time and report what is left of an interrupted sleep in virtual units;
// pthread_cond_clockwait and sem_clockwait take absolute deadlines on the dilated clock
// (what libstdc++'s condition_variable::wait_for/wait_until and Python's threading waits
// compute) and wait until the real time that reaches them.
//
// Not covered (documented in docs/wide-area.md): programs that read the TSC (rdtsc: perftest
// on x86) or make system calls without libc; timeouts of poll/select/epoll_wait (real), and
// absolute deadlines handed to pthread_cond_timedwait, sem_timedwait or a futex after being
// computed from the dilated clock — these fire at once (the clock of a condition variable
// waited on with pthread_cond_timedwait is not visible to an interposer).
//
// With SOFTRDMA_TDF unset or 1 every function passes straight through.
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

#include "base/clock.h"

namespace clk = softrdma::clock;

namespace {

/// The next definition of libc function `name` (the real one), looked up once.
#define REAL(name)                                                                 \
  ([]() {                                                                          \
    static auto fn = reinterpret_cast<decltype(&::name)>(dlsym(RTLD_NEXT, #name)); \
    return fn;                                                                     \
  }())

constexpr uint64_t kNsPerSec = 1'000'000'000;

uint64_t to_ns(const timespec& ts) {
  if (ts.tv_sec < 0) return 0;
  return uint64_t(ts.tv_sec) * kNsPerSec + uint64_t(ts.tv_nsec);
}

timespec to_timespec(uint64_t ns) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(ns / kNsPerSec);
  ts.tv_nsec = static_cast<long>(ns % kNsPerSec);
  return ts;
}

bool boot_based(clockid_t id) {
  return id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_RAW || id == CLOCK_MONOTONIC_COARSE ||
         id == CLOCK_BOOTTIME || id == CLOCK_BOOTTIME_ALARM;
}

bool wall(clockid_t id) {
  return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI ||
         id == CLOCK_REALTIME_ALARM;
}

/// Real nanosleep of a virtual duration; on EINTR, `rem` (when given) gets the virtual time
/// left. Returns 0 or an error number (clock_nanosleep's convention).
int sleep_virtual(uint64_t virtual_ns, timespec* rem) {
  const timespec real = clk::to_real_timespec(virtual_ns);
  timespec real_rem{};
  const int r = REAL(clock_nanosleep)(CLOCK_MONOTONIC, 0, &real, &real_rem);
  if (r == EINTR && rem) *rem = to_timespec(clk::to_virtual_ns(to_ns(real_rem)));
  return r;
}

/// The real time, on clock `id`, at which that clock's dilated reading is `virtual_abs`.
timespec real_deadline(clockid_t id, const timespec& virtual_abs) {
  const uint64_t v = to_ns(virtual_abs);
  return to_timespec(wall(id) ? clk::undilate_realtime(v) : clk::to_real_deadline_ns(v));
}

}  // namespace

extern "C" {

int clock_gettime(clockid_t id, timespec* ts) {
  const int r = REAL(clock_gettime)(id, ts);
  if (r != 0 || !clk::dilated()) return r;
  if (boot_based(id))
    *ts = to_timespec(clk::dilate_monotonic(to_ns(*ts)));
  else if (wall(id))
    *ts = to_timespec(clk::dilate_realtime(to_ns(*ts)));
  return r;
}

int gettimeofday(struct timeval* __restrict tv, void* __restrict tz) {
  const int r = REAL(gettimeofday)(tv, tz);
  if (r != 0 || !clk::dilated()) return r;
  const uint64_t real = uint64_t(tv->tv_sec) * kNsPerSec + uint64_t(tv->tv_usec) * 1000;
  const uint64_t v = clk::dilate_realtime(real);
  tv->tv_sec = static_cast<time_t>(v / kNsPerSec);
  tv->tv_usec = static_cast<suseconds_t>((v % kNsPerSec) / 1000);
  return r;
}

time_t time(time_t* out) {
  if (!clk::dilated()) return REAL(time)(out);
  const time_t t = static_cast<time_t>(clk::realtime_ns() / kNsPerSec);
  if (out) *out = t;
  return t;
}

int nanosleep(const timespec* req, timespec* rem) {
  if (!clk::dilated()) return REAL(nanosleep)(req, rem);
  if (!req || req->tv_nsec < 0 || req->tv_nsec >= long(kNsPerSec) || req->tv_sec < 0) {
    errno = EINVAL;
    return -1;
  }
  const int r = sleep_virtual(to_ns(*req), rem);
  if (r == 0) return 0;
  errno = r;
  return -1;
}

int clock_nanosleep(clockid_t id, int flags, const timespec* req, timespec* rem) {
  if (!clk::dilated() || !(boot_based(id) || wall(id)) || !req)
    return REAL(clock_nanosleep)(id, flags, req, rem);
  if (req->tv_nsec < 0 || req->tv_nsec >= long(kNsPerSec) || req->tv_sec < 0) return EINVAL;
  if (!(flags & TIMER_ABSTIME)) return sleep_virtual(to_ns(*req), rem);
  // An absolute virtual time: the real time of the same clock at which it is reached.
  const timespec ts = real_deadline(id, *req);
  return REAL(clock_nanosleep)(id, flags, &ts, nullptr);
}

int pthread_cond_clockwait(pthread_cond_t* cond, pthread_mutex_t* mutex, clockid_t id,
                           const timespec* abstime) {
  if (!clk::dilated() || !(boot_based(id) || wall(id)))
    return REAL(pthread_cond_clockwait)(cond, mutex, id, abstime);
  const timespec ts = real_deadline(id, *abstime);
  return REAL(pthread_cond_clockwait)(cond, mutex, id, &ts);
}

int sem_clockwait(sem_t* sem, clockid_t id, const timespec* abstime) {
  if (!clk::dilated() || !(boot_based(id) || wall(id)))
    return REAL(sem_clockwait)(sem, id, abstime);
  const timespec ts = real_deadline(id, *abstime);
  return REAL(sem_clockwait)(sem, id, &ts);
}

int usleep(useconds_t us) {
  if (!clk::dilated()) return REAL(usleep)(us);
  const int r = sleep_virtual(uint64_t(us) * 1000, nullptr);
  if (r == 0) return 0;
  errno = r;
  return -1;
}

unsigned int sleep(unsigned int seconds) {
  if (!clk::dilated()) return REAL(sleep)(seconds);
  timespec rem{};
  if (sleep_virtual(uint64_t(seconds) * kNsPerSec, &rem) != EINTR) return 0;
  return static_cast<unsigned>(rem.tv_sec + (rem.tv_nsec > 0 ? 1 : 0));  // rounded up, as glibc
}

}  // extern "C"
