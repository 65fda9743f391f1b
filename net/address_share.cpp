// The per-address slot registry and forwarding sockets: see address_share.h.
#include "net/address_share.h"

#include "base/ipv4_text.h"

#include "net/netns.h"
#include "net/unix_address.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <algorithm>

#include <cerrno>
#include <cstring>

namespace softrdma::net {

namespace {

/// The registry file's layout (one page; only the first bytes are used).
struct Registry {
  uint32_t magic;
  std::atomic<uint32_t> live;   // bit k: slot k joined and has not left
  uint32_t pid[kShareSlots];    // the process holding each slot (0: none); under flock
  std::atomic<uint32_t> owner;  // slot + 1 of the process owning UDP 4791 (0: none known)
};
constexpr uint32_t kRegistryMagic = 0x53524131;  // "SRA1"
constexpr size_t kFileBytes = 4096;
static_assert(sizeof(Registry) <= kFileBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

using base::ipv4_text;

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

std::vector<std::string> share_remove_stale(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> removed;
  const std::string lead = prefix + "share-" + netns_scope(current_netns());
  for (uint32_t ip : addresses_in_file_names(dir, lead)) {
    // Joining reclaims the slots of dead processes; leaving, when no live one is left,
    // removes the file (both under its flock).
    const std::string path = dir + "/" + lead + ipv4_text(ip);
    AddressShare s;
    if (s.join(ip, dir, prefix) != 0) continue;
    s.leave();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) removed.push_back(path);
  }
  return removed;
}

std::string share_registry_path(uint32_t ip, const std::string& dir, const std::string& prefix) {
  return dir + "/" + prefix + "share-" + netns_scope(current_netns()) + ipv4_text(ip);
}

uint32_t share_slot_pid(uint32_t ip, uint32_t slot, const std::string& dir,
                        const std::string& prefix) {
  if (slot >= kShareSlots) return 0;
  const std::string path = share_registry_path(ip, dir, prefix);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return 0;
  uint32_t magic = 0, pid = 0;
  const bool ok = ::pread(fd, &magic, sizeof magic, offsetof(Registry, magic)) == sizeof magic &&
                  magic == kRegistryMagic &&
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
  if (reg->magic != kRegistryMagic) {  // a new (zeroed) file, or one of another layout
    std::memset(static_cast<void*>(reg), 0, sizeof *reg);
    reg->magic = kRegistryMagic;
  }
  name_prefix_ = prefix + "slot-" + ipv4_text(ip) + "-";
  fwd_prefix_ = prefix + "fwd-" + ipv4_text(ip) + "-";
  // Slots of processes that died without leave() (killed) are free again: their bits too.
  for (uint32_t k = 0; k < kShareSlots; ++k)
    if (reg->pid[k] != 0 && pid_dead(reg->pid[k])) {
      reg->pid[k] = 0;
      uint32_t dead_owner = k + 1;  // killed while owning the port: nobody to follow
      reg->owner.compare_exchange_strong(dead_owner, 0, std::memory_order_acq_rel);
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
    const socklen_t len = abstract_unix_address(name_prefix_ + std::to_string(k), a);
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), len) != 0) {
      err = errno;
      ::close(s);
      if (err == EADDRINUSE) continue;  // a live process holds it (pid reused): next slot
      break;
    }
    const int buf = 4 << 20;
    ::setsockopt(s, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    ::setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    // The kernel reports twice what it grants (socket(7)); a datagram must stay below the
    // grant. The forwarding sockets get the same buffer, so this bounds theirs too.
    int granted = 0;
    socklen_t granted_len = sizeof granted;
    if (::getsockopt(s, SOL_SOCKET, SO_SNDBUF, &granted, &granted_len) == 0 && granted > 0)
      batch_bytes_ = std::min(kBatchBytes, static_cast<size_t>(granted) / 2 - 1024);
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
  owner_ = &reg->owner;
  return 0;
}

void AddressShare::become_owner() {
  if (!joined()) return;
  if (following_ != 0) {  // a member that took over: datagrams from anyone again
    sockaddr_un none{};
    none.sun_family = AF_UNSPEC;
    ::connect(fd_, reinterpret_cast<sockaddr*>(&none), sizeof none.sun_family);
    following_ = 0;
  }
  owner_->store(slot_ + 1, std::memory_order_release);
}

bool AddressShare::follow_owner() {
  if (!joined()) return false;
  const uint32_t owner = owner_->load(std::memory_order_acquire);
  if (owner == following_) return owner != 0;
  if (owner == 0 || owner == slot_ + 1) return false;  // none yet, or ourselves (stale)
  sockaddr_un a;
  const socklen_t len = abstract_unix_address(
      fwd_prefix_ + std::to_string(owner - 1) + "-" + std::to_string(slot_), a);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0) return false;  // retried
  following_ = owner;
  return true;
}

void AddressShare::leave() {
  if (!joined()) return;
  auto* reg = static_cast<Registry*>(map_);
  ::flock(file_fd_, LOCK_EX);
  if (reg->pid[slot_] == static_cast<uint32_t>(::getpid())) {
    uint32_t mine = slot_ + 1;
    reg->owner.compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
    reg->live.fetch_and(~(1u << slot_), std::memory_order_acq_rel);
    reg->pid[slot_] = 0;
  }
  bool empty = true;
  for (uint32_t k = 0; k < kShareSlots; ++k) empty = empty && pid_dead(reg->pid[k]);
  if (empty) ::unlink(path_.c_str());  // the last one out (join() copes with the race)
  ::flock(file_fd_, LOCK_UN);
  ::close(fd_);
  close_out();
  ::munmap(map_, kFileBytes);
  ::close(file_fd_);
  fd_ = file_fd_ = -1;
  map_ = nullptr;
  live_ = nullptr;
  owner_ = nullptr;
  following_ = 0;
}

int AddressShare::out_fd(uint32_t slot) {
  if (!out_init_) {
    for (int& f : out_fd_) f = -1;
    out_init_ = true;
  }
  // A socket made for a process that has left the slot since (the next process there took
  // it: pyverbs forks a passive and an active side per test) may still be connected to the
  // dead one's socket, which makes the newcomer's follow_owner() fail: it is connected to
  // the newcomer instead — the same socket, never closed and made again, because the
  // newcomer may have connected to it already (when it was connected to no one: the kernel
  // disconnects it from a socket that a forward met dying). Made again, it left such a
  // newcomer connected to a closed socket, every forward to it refused (EPERM), for good.
  const uint32_t pid = static_cast<Registry*>(map_)->pid[slot];
  if (out_fd_[slot] >= 0 && out_pid_[slot] == pid) return out_fd_[slot];
  sockaddr_un peer;  // the slot's socket
  const socklen_t peer_len = abstract_unix_address(name_prefix_ + std::to_string(slot), peer);
  if (out_fd_[slot] >= 0) {
    sockaddr none{};
    none.sa_family = AF_UNSPEC;  // dissolves the old association first
    ::connect(out_fd_[slot], &none, sizeof none);
    // Refused while the newcomer still follows a previous owner: left unconnected then
    // (sends name their receiver; the newcomer's follow_owner() can connect to it).
    ::connect(out_fd_[slot], reinterpret_cast<sockaddr*>(&peer), peer_len);
    out_pid_[slot] = pid;
    return out_fd_[slot];
  }
  const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) return fd_;
  sockaddr_un a;
  const socklen_t len =
      abstract_unix_address(fwd_prefix_ + std::to_string(slot_) + "-" + std::to_string(slot), a);
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    ::close(s);
    return fd_;  // unconnected sends from the slot socket (the queue limit applies)
  }
  const int buf = 4 << 20;
  ::setsockopt(s, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  ::setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  // Connected to the slot's socket as well, so what that process sends back here (a member's
  // packets for this process's QPNs) passes the queue limit too; refused while it still
  // follows a previous owner (then this socket only sends).
  ::connect(s, reinterpret_cast<sockaddr*>(&peer), peer_len);
  if (epoll_fd_ >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd_;  // reads as the slot socket's event: receive() reads both
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, s, &ev);
  }
  out_fd_[slot] = s;
  out_pid_[slot] = pid;
  return s;
}

void AddressShare::close_out() {
  if (out_init_)
    for (int& f : out_fd_)
      if (f >= 0) {
        ::close(f);
        f = -1;
      }
  for (auto& q : backlog_) q.clear();
  for (Batch& b : batch_) b = Batch{};
  backlog_mask_.store(0, std::memory_order_relaxed);
  backlog_bytes_ = 0;
}

int AddressShare::send_to(uint32_t slot, const Batch& b) {
  sockaddr_un a;
  const socklen_t len = abstract_unix_address(name_prefix_ + std::to_string(slot), a);
  iovec iov{const_cast<uint8_t*>(b.bytes.data()), b.bytes.size()};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  // A member to the owner it follows: through its connected slot socket, to the owner's
  // socket for it (connected back: no queue limit).
  const bool to_owner = following_ != 0 && slot + 1 == following_;
  if (!to_owner) {
    h.msg_name = &a;
    h.msg_namelen = len;
  }
  if (::sendmsg(to_owner ? fd_ : out_fd(slot), &h, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return 0;
  return errno == EWOULDBLOCK ? EAGAIN : errno;
}

void AddressShare::forget_slot(uint32_t slot) {
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

namespace {
/// A record's header in a forwarded datagram: the meta, then the packet's length.
constexpr size_t kForwardRecordHeader = sizeof(ForwardedMeta) + sizeof(uint32_t);
size_t padded(size_t n) {
  return (n + 3) & ~size_t{3};
}
}  // namespace

bool AddressShare::forward(uint32_t slot, const ForwardedMeta& meta,
                           std::span<const uint8_t> packet) {
  if (!joined() || slot >= kShareSlots) return false;
  Batch& b = batch_[slot];
  const size_t record = kForwardRecordHeader + padded(packet.size());
  if (b.packets != 0 && b.bytes.size() + record > batch_bytes_) send_slot(slot);
  const size_t at = b.bytes.size();
  b.bytes.resize(at + record);
  std::memcpy(b.bytes.data() + at, &meta, sizeof meta);
  const auto length = static_cast<uint32_t>(packet.size());
  std::memcpy(b.bytes.data() + at + sizeof meta, &length, sizeof length);
  if (!packet.empty())
    std::memcpy(b.bytes.data() + at + kForwardRecordHeader, packet.data(), packet.size());
  ++b.packets;
  backlog_mask_.fetch_or(1u << slot, std::memory_order_relaxed);
  return true;
}

void AddressShare::send_slot(uint32_t k) {
  std::deque<Batch>& q = backlog_[k];
  while (!q.empty()) {  // the oldest first: the receiver's PSN checks want the order
    const int e = send_to(k, q.front());
    if (e == EAGAIN) break;  // full again: later
    if (e == 0) {
      stats_.forwarded += q.front().packets;
    } else {
      stats_.forward_drops += q.front().packets;  // its process is gone meanwhile
      if (e == ECONNREFUSED || e == ENOENT) forget_slot(k);
    }
    backlog_bytes_ -= q.front().bytes.size();
    q.pop_front();
  }
  Batch& b = batch_[k];
  if (b.packets != 0) {
    const int e = q.empty() ? send_to(k, b) : EAGAIN;
    if (e == 0) {
      stats_.forwarded += b.packets;
    } else if (e == EAGAIN && backlog_bytes_ + b.bytes.size() <= kMaxBacklogBytes) {
      stats_.backlogged += b.packets;
      backlog_bytes_ += b.bytes.size();
      q.push_back(std::move(b));
      b = Batch{};
    } else {
      stats_.forward_drops += b.packets;
      if (e == ECONNREFUSED || e == ENOENT) forget_slot(k);
    }
    b.bytes.clear();
    b.packets = 0;
  }
  if (q.empty()) backlog_mask_.fetch_and(~(1u << k), std::memory_order_relaxed);
}

bool AddressShare::send_batches() {
  const uint32_t pending = backlog_mask_.load(std::memory_order_relaxed);
  for (uint32_t k = 0; k < kShareSlots; ++k)
    if (pending & (1u << k)) send_slot(k);
  return backlogged();
}

std::span<uint8_t> AddressShare::next(ForwardedMeta& meta) {
  if (!joined()) return {};
  for (int tries = 0; tries < 64; ++tries) {
    if (rx_at_ >= rx_len_) {  // the next datagram
      if (rx_.size() < (256u << 10)) rx_.resize(256u << 10);
      iovec iov{rx_.data(), rx_.size()};
      msghdr h{};
      h.msg_iov = &iov;
      h.msg_iovlen = 1;
      rx_pending_.store(false, std::memory_order_relaxed);
      ssize_t n = ::recvmsg(fd_, &h, MSG_DONTWAIT);
      // Then the sockets for the other slots (members' packets to this process, the owner).
      for (uint32_t k = 0; n < 0 && out_init_ && k < kShareSlots; ++k)
        if (out_fd_[k] >= 0) n = ::recvmsg(out_fd_[k], &h, MSG_DONTWAIT);
      if (n < 0) return {};
      rx_at_ = 0;
      rx_len_ = static_cast<size_t>(n);
      if (h.msg_flags & MSG_TRUNC) {
        ++stats_.malformed;
        rx_len_ = 0;
        continue;
      }
    }
    uint32_t length = 0;
    if (rx_len_ - rx_at_ < kForwardRecordHeader) {
      ++stats_.malformed;
      rx_at_ = rx_len_;
      continue;
    }
    std::memcpy(&meta, rx_.data() + rx_at_, sizeof meta);
    std::memcpy(&length, rx_.data() + rx_at_ + sizeof meta, sizeof length);
    const size_t at = rx_at_ + kForwardRecordHeader;
    if (length == 0 || length > rx_len_ - at) {
      ++stats_.malformed;
      rx_at_ = rx_len_;  // the rest of this datagram cannot be trusted
      continue;
    }
    rx_at_ = at + padded(length);
    rx_pending_.store(rx_at_ < rx_len_, std::memory_order_relaxed);
    ++stats_.received;
    return {rx_.data() + at, length};
  }
  return {};
}

size_t AddressShare::receive(std::span<uint8_t> buf, ForwardedMeta& meta) {
  const std::span<uint8_t> p = next(meta);
  if (p.size() > buf.size()) {
    ++stats_.malformed;
    return 0;
  }
  if (p.empty()) return 0;  // nothing waiting (memcpy from nullptr is UB even for 0 bytes)
  std::memcpy(buf.data(), p.data(), p.size());
  return p.size();
}

}  // namespace softrdma::net
