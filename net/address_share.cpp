// The per-address slot registry and forwarding sockets: see address_share.h.
#include "net/address_share.h"

#include "net/netns.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace softrdma::net {

namespace {

/// The registry file's layout (one page; only the first bytes are used).
struct Registry {
  uint32_t magic;
  std::atomic<uint32_t> live;  // bit k: slot k joined and has not left
  uint32_t pid[kShareSlots];   // the process holding each slot (0: none); under flock
};
constexpr uint32_t kMagic = 0x53524131;  // "SRA1"
constexpr size_t kFileBytes = 4096;
static_assert(sizeof(Registry) <= kFileBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

std::string dotted(uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string((ip >> 16) & 0xff) + "." +
         std::to_string((ip >> 8) & 0xff) + "." + std::to_string(ip & 0xff);
}

/// The abstract address of `name` (no leading NUL in `name`) and its length.
socklen_t abstract_addr(const std::string& name, sockaddr_un& a) {
  a = sockaddr_un{};
  a.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof a.sun_path - 1);
  std::memcpy(a.sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

bool pid_dead(uint32_t pid) {
  return pid == 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
}

}  // namespace

std::vector<uint32_t> addresses_in_file_names(const std::string& dir, const std::string& lead) {
  std::vector<uint32_t> ips;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      in_addr a{};
      if (n.rfind(lead, 0) == 0 && ::inet_pton(AF_INET, n.c_str() + lead.size(), &a) == 1)
        ips.push_back(ntohl(a.s_addr));
    }
    ::closedir(d);
  }
  return ips;
}

int open_locked_file(const std::string& path) {
  for (int tries = 0;; ++tries) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    if (::flock(fd, LOCK_EX) != 0) {
      const int e = errno;
      ::close(fd);
      return -e;
    }
    struct stat opened {
    }, named{};
    if (tries < 16 && ::fstat(fd, &opened) == 0 &&
        (::stat(path.c_str(), &named) != 0 || named.st_ino != opened.st_ino)) {
      ::close(fd);  // unlinked meanwhile by the address's last process
      continue;
    }
    return fd;
  }
}

std::vector<std::string> share_remove_stale(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> removed;
  const std::string lead = prefix + "share-" + netns_scope(current_netns());
  for (uint32_t ip : addresses_in_file_names(dir, lead)) {
    // Joining reclaims the slots of dead processes; leaving, when no live one is left,
    // removes the file (both under its flock).
    const std::string path = dir + "/" + lead + dotted(ip);
    AddressShare s;
    if (s.join(ip, dir, prefix) != 0) continue;
    s.leave();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) removed.push_back(path);
  }
  return removed;
}

std::string share_registry_path(uint32_t ip, const std::string& dir, const std::string& prefix) {
  return dir + "/" + prefix + "share-" + netns_scope(current_netns()) + dotted(ip);
}

uint32_t share_slot_pid(uint32_t ip, uint32_t slot, const std::string& dir,
                        const std::string& prefix) {
  if (slot >= kShareSlots) return 0;
  const std::string path = share_registry_path(ip, dir, prefix);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return 0;
  uint32_t magic = 0, pid = 0;
  const bool ok = ::pread(fd, &magic, sizeof magic, offsetof(Registry, magic)) == sizeof magic &&
                  magic == kMagic &&
                  ::pread(fd, &pid, sizeof pid,
                          offsetof(Registry, pid) + slot * sizeof(uint32_t)) == sizeof pid;
  ::close(fd);
  return ok ? pid : 0;
}

AddressShare::~AddressShare() {
  leave();
}

int AddressShare::join(uint32_t ip, const std::string& dir, const std::string& prefix) {
  if (joined()) return EINVAL;
  const std::string path = share_registry_path(ip, dir, prefix);
  // The last process to leave unlinks the file (under the flock): see open_locked_file.
  const int fd = open_locked_file(path);
  if (fd < 0) return -fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0 ||
      (st.st_size < static_cast<off_t>(kFileBytes) && ::ftruncate(fd, kFileBytes) != 0)) {
    const int e = errno;
    ::close(fd);  // releases the flock
    return e;
  }
  void* m = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return e;
  }
  auto* reg = static_cast<Registry*>(m);
  if (reg->magic != kMagic) {  // a new (zeroed) file, or one of another layout
    std::memset(static_cast<void*>(reg), 0, sizeof *reg);
    reg->magic = kMagic;
  }
  name_prefix_ = prefix + "slot-" + dotted(ip) + "-";
  // Slots of processes that died without leave() (killed) are free again: their bits too.
  for (uint32_t k = 0; k < kShareSlots; ++k)
    if (reg->pid[k] != 0 && pid_dead(reg->pid[k])) {
      reg->pid[k] = 0;
      reg->live.fetch_and(~(1u << k), std::memory_order_acq_rel);
    }
  for (uint32_t k = 0; k < kShareSlots; ++k)
    if (reg->pid[k] == 0) reg->live.fetch_and(~(1u << k), std::memory_order_acq_rel);
  int err = EUSERS;
  for (uint32_t k = 0; k < kShareSlots; ++k) {
    if (!pid_dead(reg->pid[k])) continue;
    const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
      err = errno;
      break;
    }
    sockaddr_un a;
    const socklen_t len = abstract_addr(name_prefix_ + std::to_string(k), a);
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), len) != 0) {
      err = errno;
      ::close(s);
      if (err == EADDRINUSE) continue;  // a live process holds it (pid reused): next slot
      break;
    }
    const int buf = 4 << 20;
    ::setsockopt(s, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    ::setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    reg->pid[k] = static_cast<uint32_t>(::getpid());
    reg->live.fetch_or(1u << k, std::memory_order_acq_rel);
    slot_ = k;
    fd_ = s;
    err = 0;
    break;
  }
  ::flock(fd, LOCK_UN);
  if (err != 0) {
    ::munmap(m, kFileBytes);
    ::close(fd);
    return err;
  }
  ip_ = ip;
  path_ = path;
  file_fd_ = fd;
  map_ = m;
  live_ = &reg->live;
  return 0;
}

void AddressShare::leave() {
  if (!joined()) return;
  auto* reg = static_cast<Registry*>(map_);
  ::flock(file_fd_, LOCK_EX);
  if (reg->pid[slot_] == static_cast<uint32_t>(::getpid())) {
    reg->live.fetch_and(~(1u << slot_), std::memory_order_acq_rel);
    reg->pid[slot_] = 0;
  }
  bool empty = true;
  for (uint32_t k = 0; k < kShareSlots; ++k) empty = empty && pid_dead(reg->pid[k]);
  if (empty) ::unlink(path_.c_str());  // the last one out (join() copes with the race)
  ::flock(file_fd_, LOCK_UN);
  ::close(fd_);
  ::munmap(map_, kFileBytes);
  ::close(file_fd_);
  fd_ = file_fd_ = -1;
  map_ = nullptr;
  live_ = nullptr;
}

bool AddressShare::forward(uint32_t slot, const ForwardedMeta& meta,
                           std::span<const uint8_t> packet) {
  if (!joined() || slot >= kShareSlots) return false;
  sockaddr_un a;
  const socklen_t len = abstract_addr(name_prefix_ + std::to_string(slot), a);
  iovec iov[2] = {{const_cast<ForwardedMeta*>(&meta), sizeof meta},
                  {const_cast<uint8_t*>(packet.data()), packet.size()}};
  msghdr h{};
  h.msg_name = &a;
  h.msg_namelen = len;
  h.msg_iov = iov;
  h.msg_iovlen = 2;
  if (::sendmsg(fd_, &h, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) {
    ++stats_.forwarded;
    return true;
  }
  const int e = errno;
  ++stats_.forward_drops;
  if (e == ECONNREFUSED || e == ENOENT) {
    // Nobody holds the socket: a process killed without leave(). Clear its bit so later
    // packets are dropped without a system call (under the flock: a joiner may be taking the
    // slot right now).
    auto* reg = static_cast<Registry*>(map_);
    ::flock(file_fd_, LOCK_EX);
    if (pid_dead(reg->pid[slot])) {
      reg->pid[slot] = 0;
      reg->live.fetch_and(~(1u << slot), std::memory_order_acq_rel);
    }
    ::flock(file_fd_, LOCK_UN);
  }
  return false;
}

size_t AddressShare::receive(std::span<uint8_t> buf, ForwardedMeta& meta) {
  if (!joined()) return 0;
  for (int tries = 0; tries < 64; ++tries) {
    iovec iov[2] = {{&meta, sizeof meta}, {buf.data(), buf.size()}};
    msghdr h{};
    h.msg_iov = iov;
    h.msg_iovlen = 2;
    const ssize_t n = ::recvmsg(fd_, &h, MSG_DONTWAIT);
    if (n < 0) return 0;
    if (static_cast<size_t>(n) <= sizeof meta || (h.msg_flags & MSG_TRUNC)) {
      ++stats_.malformed;
      continue;
    }
    ++stats_.received;
    return static_cast<size_t>(n) - sizeof meta;
  }
  return 0;
}

}  // namespace softrdma::net
