// The rdma_cm port space of one address, shared by the processes that share the address
// (net/address_share.h), as the kernel's rdma_cm ports are shared by every process.
//
// A file "<dir>/softrdma-cmports-<scope><a.b.c.d>" (scope: the network namespace, net/netns.h:
// one address in two namespaces is two hosts' addresses) holds one entry per (process, port
// space, port) taken at the address, with a listening flag; every access is under flock(2), and
// entries of dead processes (pid and start time, /proc/<pid>/stat: pids wrap) count as free; the
// last process of the address removes it. CmDevice claims a port here when its first local ID takes
// it (a port another live process holds is EADDRINUSE, as a second rdma_bind_addr of a taken port
// is with the kernel), and the CommManager asks it whether a REQ / SIDR_REQ it has no listener for
// is another process's (CmConfig::listened_elsewhere).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace softrdma::cm {

class SharedPorts {
 public:
  /// Removes the tables "<dir>/softrdma-cmports-*" (of every network namespace) in which no
  /// live process holds a port (left by processes that exited without closing their
  /// devices). Returns the paths removed. For `softrdma stat --clean`.
  static std::vector<std::string> remove_stale(const std::string& dir = "/dev/shm");
  /// The table of `ip` (host order) in the calling thread's network namespace:
  /// "<dir>/softrdma-cmports-<scope><a.b.c.d>" (scope "ns<inode>-", or "" without /proc).
  static std::string table_path(uint32_t ip, const std::string& dir = "/dev/shm");

  SharedPorts() = default;
  ~SharedPorts();
  SharedPorts(const SharedPorts&) = delete;
  SharedPorts& operator=(const SharedPorts&) = delete;

  /// Maps (creating) the table of `ip` (host order) in `dir` (table_path()). Returns 0 or the
  /// failing system call's errno; while not open every port counts as this process's alone.
  int open(uint32_t ip, const std::string& dir = "/dev/shm");
  bool is_open() const { return map_ != nullptr; }

  /// Takes (ps, port) for this process. Returns 0 (also when it holds it already),
  /// EADDRINUSE when another live process holds it, ENOSPC when the table is full.
  int claim(uint16_t ps, uint16_t port);
  /// Gives (ps, port) back. Unknown ports are ignored.
  void release(uint16_t ps, uint16_t port);
  /// Marks this process's (ps, port) as listened to (or not).
  void set_listening(uint16_t ps, uint16_t port, bool listening);
  /// Whether another live process holds (ps, port).
  bool taken_elsewhere(uint16_t ps, uint16_t port) { return held_elsewhere(ps, port, false); }
  /// Whether another live process listens on (ps, port).
  bool listened_elsewhere(uint16_t ps, uint16_t port) { return held_elsewhere(ps, port, true); }

 private:
  struct Table;
  /// Whether another live process holds (ps, port) (and, `listening`, listens on it).
  bool held_elsewhere(uint16_t ps, uint16_t port, bool listening);
  /// The entry of (pid, ps, port), or -1.
  int find(const Table& t, uint32_t pid, uint16_t ps, uint16_t port) const;
  void lock();
  void unlock();

  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  uint32_t pid_ = 0;
  uint64_t start_ = 0;  // this process's start time (a pid names a process only with it)
};

}  // namespace softrdma::cm
