// /proc/<pid>/stat as a liveness oracle: see peer_liveness.h.
#include "net/peer_liveness.h"

#include <dirent.h>
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

namespace {
// Reads the /proc stat line at `path` into buf (NUL-terminated); returns its length, or
// <= 0 when it cannot be read.
ssize_t read_stat(const char* path, char (&buf)[512]) {
  ssize_t n = -1;
  if (const int fd = ::open(path, O_RDONLY | O_CLOEXEC); fd >= 0) {
    n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
  }
  buf[n > 0 ? n : 0] = '\0';
  return n;
}

// Where the state letter of a /proc stat line is ("pid (comm) S …": comm may hold spaces and
// parentheses, so it is read after the last ')'), or nullptr.
const char* state_field(const char* line) {
  const char* p = std::strrchr(line, ')');
  return p && p[1] == ' ' && p[2] != '\0' ? p + 2 : nullptr;
}

// Whether any thread of `pid` is runnable ('R' in /proc/<pid>/task/<tid>/stat). The process's
// own stat line gives its main thread's state only, and a softrdma device's progress thread
// may be the one waiting for a CPU while the main thread sleeps in ibv_get_cq_event.
bool any_thread_runnable(uint32_t pid) {
  char dir[40];
  std::snprintf(dir, sizeof dir, "/proc/%u/task", pid);
  DIR* d = ::opendir(dir);
  if (!d) return false;
  bool runnable = false;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[320];
    std::snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
    char buf[512];
    if (read_stat(path, buf) <= 0) continue;
    if (const char* st = state_field(buf); st && *st == 'R') {
      runnable = true;
      break;
    }
  }
  ::closedir(d);
  return runnable;
}
}  // namespace

ProcessSample sample_process(uint32_t pid) {
  ProcessSample s;
  if (pid == 0) return s;
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  char buf[512];
  const ssize_t n = read_stat(path, buf);
  if (n <= 0) {
    // No /proc (or not this pid namespace's): kill() still tells alive from gone.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)
      s.state = ProcessState::kSleeping;
    return s;
  }
  const char* st = state_field(buf);
  if (st == nullptr) return s;
  const char state = *st;
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
      s.state = any_thread_runnable(pid) ? ProcessState::kRunnable : ProcessState::kSleeping;
      break;
  }
  // Fields after the state: 4 ppid … 13 majflt, 14 utime, 15 stime (proc(5)).
  const char* q = st + 1;
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
