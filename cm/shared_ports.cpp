// The rdma_cm port table shared by the processes of one address: see shared_ports.h.
#include "cm/shared_ports.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/ipv4_text.h"
#include "base/locked_file.h"
#include "net/netns.h"

namespace softrdma::cm {

namespace {
constexpr uint32_t kMagic = 0x53435032;  // "SCP2"
constexpr uint32_t kEntries = 1024;

/// The start time of process `pid` (/proc/<pid>/stat field 22, clock ticks since boot), 0
/// when it does not exist: with the pid it names one process, even once pids wrap
/// (pid_max is often 32768).
uint64_t start_time(uint32_t pid) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  FILE* f = std::fopen(path, "re");
  if (!f) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and ')'
  if (!p) return 0;
  // After ") ": field 3 (state) … field 22 (starttime).
  uint64_t value = 0;
  int field = 2;
  for (const char* q = p + 1; *q && field < 22; ++q)
    if (*q == ' ') {
      ++field;
      if (field == 22) value = std::strtoull(q + 1, nullptr, 10);
    }
  return value;
}

bool alive(uint32_t pid, uint64_t start) {
  return pid != 0 && start != 0 && start_time(pid) == start;
}
}  // namespace

struct SharedPorts::Table {
  uint32_t magic;
  uint32_t reserved;
  struct Entry {
    uint32_t pid;  // 0: free
    uint16_t ps;
    uint16_t port;
    uint32_t listening;
    uint32_t reserved;
    uint64_t start;  // the process's start time (start_time), so a reused pid is not it
  } entry[kEntries];
};

std::vector<std::string> SharedPorts::remove_stale(const std::string& dir) {
  std::vector<std::string> removed;
  const std::string lead = "softrdma-cmports-";
  std::vector<std::string> paths;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind(lead, 0) == 0) paths.push_back(dir + "/" + n);
    }
    ::closedir(d);
  }
  for (const std::string& path : paths) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;
    ::flock(fd, LOCK_EX);  // a process opening it meanwhile re-checks the path (open())
    struct stat st {};
    bool empty = ::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(Table));
    void* m = empty ? ::mmap(nullptr, sizeof(Table), PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (m != MAP_FAILED) {
      const auto& t = *static_cast<const Table*>(m);
      for (uint32_t i = 0; i < kEntries && empty; ++i)
        empty = !alive(t.entry[i].pid, t.entry[i].start);
      ::munmap(m, sizeof(Table));
    }
    if (empty && ::unlink(path.c_str()) == 0) removed.push_back(path);
    ::close(fd);  // releases the flock
  }
  return removed;
}

std::string SharedPorts::table_path(uint32_t ip, const std::string& dir) {
  return dir + "/softrdma-cmports-" + net::netns_scope(net::current_netns()) + base::ipv4_text(ip);
}

SharedPorts::~SharedPorts() {
  if (map_) {
    // The last process of the address removes the table (open() copes with the race).
    auto& t = *static_cast<Table*>(map_);
    lock();
    bool empty = true;
    for (uint32_t i = 0; i < kEntries && empty; ++i)
      empty =
          t.entry[i].pid == 0 || t.entry[i].pid == pid_ || !alive(t.entry[i].pid, t.entry[i].start);
    if (empty) ::unlink(path_.c_str());
    unlock();
    ::munmap(map_, sizeof(Table));
  }
  if (fd_ >= 0) ::close(fd_);
}

int SharedPorts::open(uint32_t ip, const std::string& dir) {
  if (map_) return EINVAL;
  const std::string path = table_path(ip, dir);
  // Unlinked by the last process of the address while we waited: opened again.
  const int fd = base::open_locked_file(path);
  if (fd < 0) return -fd;
  struct stat st {};
  int err = 0;
  if (::fstat(fd, &st) != 0 ||
      (st.st_size < static_cast<off_t>(sizeof(Table)) && ::ftruncate(fd, sizeof(Table)) != 0))
    err = errno;
  void* m =
      err ? MAP_FAILED : ::mmap(nullptr, sizeof(Table), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!err && m == MAP_FAILED) err = errno;
  if (!err) {
    auto* t = static_cast<Table*>(m);
    if (t->magic != kMagic) {
      std::memset(static_cast<void*>(t), 0, sizeof *t);
      t->magic = kMagic;
    }
  }
  ::flock(fd, LOCK_UN);
  if (err) {
    ::close(fd);
    return err;
  }
  fd_ = fd;
  path_ = path;
  map_ = m;
  pid_ = static_cast<uint32_t>(::getpid());
  start_ = start_time(pid_);
  return 0;
}

void SharedPorts::lock() {
  ::flock(fd_, LOCK_EX);
}
void SharedPorts::unlock() {
  ::flock(fd_, LOCK_UN);
}

int SharedPorts::find(const Table& t, uint32_t pid, uint16_t ps, uint16_t port) const {
  for (uint32_t i = 0; i < kEntries; ++i)
    if (t.entry[i].pid == pid && t.entry[i].ps == ps && t.entry[i].port == port)
      return static_cast<int>(i);
  return -1;
}

int SharedPorts::claim(uint16_t ps, uint16_t port) {
  if (!map_) return 0;
  auto& t = *static_cast<Table*>(map_);
  // A fork()ed child is another process: it takes ports under its own pid.
  pid_ = static_cast<uint32_t>(::getpid());
  start_ = start_time(pid_);
  lock();
  int err = 0, free_slot = -1;
  bool mine = false;
  for (uint32_t i = 0; i < kEntries && !err; ++i) {
    auto& e = t.entry[i];
    if (e.pid == 0 || !alive(e.pid, e.start)) {
      e.pid = 0;  // a dead process's entry: free
      if (free_slot < 0) free_slot = static_cast<int>(i);
      continue;
    }
    if (e.ps != ps || e.port != port) continue;
    if (e.pid == pid_)
      mine = true;
    else
      err = EADDRINUSE;
  }
  if (!err && !mine) {
    if (free_slot < 0)
      err = ENOSPC;
    else
      t.entry[free_slot] = {pid_, ps, port, 0, 0, start_};
  }
  unlock();
  return err;
}

void SharedPorts::release(uint16_t ps, uint16_t port) {
  if (!map_) return;
  auto& t = *static_cast<Table*>(map_);
  lock();
  if (int i = find(t, pid_, ps, port); i >= 0) t.entry[i] = {};
  unlock();
}

void SharedPorts::set_listening(uint16_t ps, uint16_t port, bool listening) {
  if (!map_) return;
  auto& t = *static_cast<Table*>(map_);
  lock();
  if (int i = find(t, pid_, ps, port); i >= 0) t.entry[i].listening = listening;
  unlock();
}

bool SharedPorts::held_elsewhere(uint16_t ps, uint16_t port, bool listening) {
  if (!map_) return false;
  auto& t = *static_cast<Table*>(map_);
  lock();
  bool held = false;
  for (uint32_t i = 0; i < kEntries && !held; ++i) {
    const auto& e = t.entry[i];
    held = e.pid != 0 && e.pid != pid_ && e.ps == ps && e.port == port &&
           (!listening || e.listening) && alive(e.pid, e.start);
  }
  unlock();
  return held;
}

}  // namespace softrdma::cm
