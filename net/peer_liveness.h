// Whether the process behind a same-host peer is alive, stopped or gone — what a requester
// asks before it spends its retry budget on a peer that does not answer.
//
// A RoCE NIC keeps acknowledging while its host's process is stopped (SIGSTOP, a debugger)
// or descheduled; a softrdma device is a thread of that process and stops with it. So a
// requester whose peer is on this host asks here why the peer is silent: gone (its pid is
// absent or a zombie) is an error at once, stopped or starved of CPU is a stall that costs
// no retry (bounded by the engine), and running but silent counts as IBTA says (9.7.6:
// retry_cnt). The process is found through the address's share registry
// (net/address_share.h: one pid per slot, the slot being a QPN's top 4 bits) and read from
// /proc/<pid>/stat (proc(5)): its state letter and its CPU time. Peers on other hosts (or in
// another pid namespace) are unknown here.
#pragma once

#include <cstdint>
#include <string>

namespace softrdma::net {

/// What proc(5) says of a process.
enum class ProcessState : uint8_t {
  kGone,      ///< no such process, or a zombie / dead task ('Z', 'X'): it will never answer
  kRunnable,  ///< running or waiting for a CPU ('R', of any of its threads)
  kSleeping,  ///< waiting for an event ('S', 'D', 'I', …): it runs when a packet wakes it
  kStopped,   ///< stopped by a signal or a tracer ('T', 't'): alive, answers after SIGCONT
};
/// The name of `s`, e.g. "stopped".
const char* to_string(ProcessState s);

/// One look at a process: its state and its CPU time so far (user + system, clock ticks of
/// sysconf(_SC_CLK_TCK), all threads).
struct ProcessSample {
  ProcessState state = ProcessState::kGone;
  uint64_t cpu_ticks = 0;
};

/// Reads /proc/<pid>/stat (fields 3, 14 and 15 of proc(5)); a process whose main thread
/// sleeps is kRunnable when another of its threads is ('R' in /proc/<pid>/task/*/stat: a
/// device's progress thread waiting for a CPU while the application blocks in
/// ibv_get_cq_event). kGone when the file is absent
/// (and kill(pid, 0) says ESRCH) or the state is 'Z'/'X'. When /proc cannot be read but
/// kill(pid, 0) finds the process, kSleeping (alive, nothing more known). Never blocks.
ProcessSample sample_process(uint32_t pid);

}  // namespace softrdma::net
