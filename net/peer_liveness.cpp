// /proc/<pid>/stat as a liveness oracle: see peer_liveness.h.
#include "net/peer_liveness.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace softrdma::net {

const char* to_string(ProcessState s) {
  switch (s) {
    case ProcessState::kGone:
      return "gone";
    case ProcessState::kRunnable:
      return "runnable";
    case ProcessState::kSleeping:
      return "sleeping";
    case ProcessState::kStopped:
      return "stopped";
  }
  return "?";
}

ProcessSample sample_process(uint32_t pid) {
  ProcessSample s;
  if (pid == 0) return s;
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  char buf[512];
  ssize_t n = -1;
  if (const int fd = ::open(path, O_RDONLY | O_CLOEXEC); fd >= 0) {
    n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
  }
  if (n <= 0) {
    // No /proc (or not this pid namespace's): kill() still tells alive from gone.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)
      s.state = ProcessState::kSleeping;
    return s;
  }
  buf[n] = '\0';
  // "pid (comm) S ppid …": comm may hold spaces and parentheses, so parse after the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ' || p[2] == '\0') return s;
  const char state = p[2];
  switch (state) {
    case 'Z':
    case 'X':
    case 'x':
      return s;  // kGone
    case 'R':
      s.state = ProcessState::kRunnable;
      break;
    case 'T':
    case 't':
      s.state = ProcessState::kStopped;
      break;
    default:
      s.state = ProcessState::kSleeping;
      break;
  }
  // Fields after the state: 4 ppid … 13 majflt, 14 utime, 15 stime (proc(5)).
  const char* q = p + 3;
  for (int field = 4; field < 14 && q; ++field) {
    q = std::strchr(q, ' ');
    if (q) ++q;
  }
  if (q) {
    char* end = nullptr;
    const uint64_t utime = std::strtoull(q, &end, 10);
    const uint64_t stime = end ? std::strtoull(end, nullptr, 10) : 0;
    s.cpu_ticks = utime + stime;
  }
  return s;
}

}  // namespace softrdma::net
