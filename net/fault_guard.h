// Copies that survive memory unmapped under them. softrdma reaches registered memory through
// the process's own page tables and pins nothing, so an application may unmap (or mprotect,
// or truncate the file behind) memory it registered; a later remote WRITE or READ through
// that MR must then fail with an access error, not kill the process with SIGSEGV/SIGBUS as
// a plain memcpy would.
//
// How: the copies the engine makes into or out of application memory run inside a guard —
// sigsetjmp(env, 0) (no signal-mask system call: ~10-20 ns) and a thread-local pointer to the
// guard — and a SIGSEGV/SIGBUS handler, installed once by install_fault_guard(), jumps back
// out of a guarded copy that faulted. Faults outside a guard go to whatever handler was
// installed before (or the default action), so the application's own crashes still crash
// and its own handlers still run. The fast path costs one sigsetjmp per copy and nothing
// else; alternatives measured or considered (docs/architecture.md, "Memory unmapped after
// registration"): a validity check before each copy (msync/mincore: one system call per
// packet), process_vm_readv/writev (a system call per copy, refused in some containers),
// userfaultfd (a thread and a system call per fault, and it must own the ranges).
//
// Limits: a handler the application installs for SIGSEGV/SIGBUS after the first device was
// opened replaces this one (then a fault inside a guard reaches the application's handler
// instead). Async-signal safety: the handler touches only an initial-exec thread-local
// pointer and siglongjmp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace softrdma::net {

/// Installs the SIGSEGV and SIGBUS handlers (SA_SIGINFO | SA_NODEFER | SA_ONSTACK), keeping
/// the previous actions to chain to. Idempotent and thread-safe; the device calls it when it
/// opens.
void install_fault_guard();

/// Whether the handlers are installed.
bool fault_guard_installed();

/// memcpy(dst, src, n) that returns false instead of crashing when either range faults
/// (unmapped, protected, or a file mapping beyond its end). Bytes before the fault may have
/// been written. Without install_fault_guard() it is a plain memcpy.
bool guarded_copy(void* dst, const void* src, size_t n) noexcept;

/// Reads one byte of every page of [p, p+n): false when any of them faults. Makes the pages
/// present (for prefetch) and checks a range before it is handed to a later copy.
bool guarded_touch(const void* p, size_t n) noexcept;

/// Runs fn(arg) under the guard: false when it faulted (fn is abandoned at the fault, so it
/// must hold no resource that needs releasing: no locks taken, no allocations).
bool guarded_call(void (*fn)(void*), void* arg) noexcept;

/// Faults recovered since the process started (all threads).
uint64_t guarded_faults() noexcept;

}  // namespace softrdma::net
