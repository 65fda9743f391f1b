#include "net/fault_guard.h"

#include <setjmp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace softrdma::net {

namespace {

/// A guarded region in progress on this thread: where the handler jumps to.
struct Guard {
  sigjmp_buf env;
};

// Initial-exec TLS: the handler reads it without calling into the dynamic linker (a
// general-dynamic access may allocate, which a signal handler must not). One pointer of the
// static TLS surplus glibc keeps for libraries loaded later.
__attribute__((tls_model("initial-exec"))) thread_local Guard* t_guard = nullptr;

struct sigaction g_old_segv;
struct sigaction g_old_bus;
std::atomic<bool> g_installed{false};
std::atomic<uint64_t> g_faults{0};

void chain(int sig, siginfo_t* info, void* uctx) {
  const struct sigaction& old = sig == SIGSEGV ? g_old_segv : g_old_bus;
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction) {
      old.sa_sigaction(sig, info, uctx);
      return;
    }
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
    return;
  }
  // Default action: restore it and let the fault happen again on return (a hardware fault
  // re-executes the instruction); a signal sent by kill() is raised again.
  signal(sig, SIG_DFL);
  if (info && info->si_code <= 0) raise(sig);
}

void on_fault(int sig, siginfo_t* info, void* uctx) {
  if (Guard* g = t_guard) {
    t_guard = nullptr;
    g_faults.fetch_add(1, std::memory_order_relaxed);
    siglongjmp(g->env, 1);
  }
  chain(sig, info, uctx);
}

// The guarded regions. Each is a separate non-inlined function whose frame holds the jump
// buffer; the signal fences keep the compiler from moving the copy out of the region.
__attribute__((noinline)) bool run_guarded(void (*fn)(void*), void* arg) noexcept {
  Guard g;
  if (sigsetjmp(g.env, 0) != 0) return false;  // t_guard was cleared by the handler
  t_guard = &g;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  fn(arg);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return true;
}

__attribute__((noinline)) bool copy_guarded(void* dst, const void* src, size_t n) noexcept {
  Guard g;
  if (sigsetjmp(g.env, 0) != 0) return false;
  t_guard = &g;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return true;
}

}  // namespace

void install_fault_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sigemptyset(&sa.sa_mask);
    // SA_NODEFER: the jump out leaves the signal unblocked (sigsetjmp saved no mask).
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
    g_installed.store(true, std::memory_order_release);
  });
}

bool fault_guard_installed() {
  return g_installed.load(std::memory_order_acquire);
}

bool guarded_copy(void* dst, const void* src, size_t n) noexcept {
  if (n == 0) return true;
  if (!g_installed.load(std::memory_order_relaxed)) {
    std::memcpy(dst, src, n);  // no handler: a fault would not come back here anyway
    return true;
  }
  return copy_guarded(dst, src, n);
}

bool guarded_touch(const void* p, size_t n) noexcept {
  if (n == 0) return true;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  struct Range {
    uintptr_t first, last, page;
  } r{reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + n - 1, page};
  return run_guarded(
      [](void* a) {
        const Range& r = *static_cast<const Range*>(a);
        for (uintptr_t q = r.first;; q = (q | (r.page - 1)) + 1) {
          (void)*reinterpret_cast<const volatile uint8_t*>(q);
          if ((q | (r.page - 1)) >= r.last) break;  // that was the last page
        }
      },
      &r);
}

bool guarded_call(void (*fn)(void*), void* arg) noexcept {
  return run_guarded(fn, arg);
}

uint64_t guarded_faults() noexcept {
  return g_faults.load(std::memory_order_relaxed);
}

}  // namespace softrdma::net
