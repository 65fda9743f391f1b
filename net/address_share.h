// Several processes on one softrdma address (issue 11): the per-address slot registry and the
// forwarding sockets between the processes that share the address.
//
// A kernel RDMA device is shared by every process of the host; a softrdma device is an IPv4 address
// whose UDP port 4791 (and same-host mailbox) one process owns. Every process that opens a device
// at address A joins A's *share*: it claims a slot 0..15 in the registry file
// "<dir>/<prefix>share-<scope><a.b.c.d>" (a bitmap of live slots and one pid per slot, claimed
// under flock(2); a slot whose pid is dead is reclaimed, checked with kill(pid, 0)) and binds the
// abstract unix datagram socket "\0<prefix>slot-<a.b.c.d>-<k>" (exclusive, freed by the kernel when
// its process dies). Abstract sockets are per network namespace, so the file is too: <scope> names
// the namespace (net/netns.h), and processes of two namespaces using the same address have two
// separate shares. The engine puts the slot in the top 4 bits of its QPNs, so the owner of port
// 4791 hands each packet whose destination QPN names another slot to that slot's socket
// (forward()), with what the datagram's headers said (ForwardedMeta), and QP1 packets (the GSI's
// MADs) to every slot. This layer knows nothing of RoCE: the caller decides what goes where.
//
// Threading: one AddressShare is used by one thread at a time (the device lock); processes
// meet only through the atomic bitmap in the mapping and the flock.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace softrdma::net {

/// Slots of one address: QPNs carry the slot in their top 4 of 24 bits.
inline constexpr uint32_t kShareSlots = 16;

/// What the owner's socket learnt about a packet it forwards (its receiver rebuilds the
/// datagram's headers from it: the ICRC and a UD receive's GRH area cover them).
struct ForwardedMeta {
  uint32_t src_ip = 0;  ///< host order
  uint16_t src_port = 0;
  uint16_t ip_id_hint = 0;  ///< the GRO segment index the packet had (engine/device_rx.cpp)
  uint8_t ttl = 0;
  uint8_t tos = 0;
  uint8_t from_shm = 0;  ///< 1: it came through a shared-memory ring (no ICRC)
  uint8_t reserved = 0;
};
static_assert(sizeof(ForwardedMeta) == 12);

/// Counters of one share (plain integers, read under the caller's lock).
struct ShareStats {
  uint64_t forwarded = 0;      ///< packets handed to another slot's socket
  uint64_t forward_drops = 0;  ///< ... that its socket refused (gone, full)
  uint64_t received = 0;       ///< packets another slot's owner forwarded to us
  uint64_t malformed = 0;      ///< forwarded datagrams too short to carry a ForwardedMeta
};

/// The addresses a.b.c.d of the files "<dir>/<lead><a.b.c.d>" (host order), in directory
/// order: the per-address files of /dev/shm (mailboxes, share registries, port tables).
std::vector<uint32_t> addresses_in_file_names(const std::string& dir, const std::string& lead);
/// Opens (creating, mode 0600) the per-address file `path` and takes its flock (LOCK_EX).
/// A file the last process of its address unlinked while this one waited for the lock is
/// let go and the path opened again (bounded). Returns the descriptor (locked; the caller
/// unlocks or closes it) or -errno.
int open_locked_file(const std::string& path);

/// The registry file of `ip` (host order) in the calling thread's network namespace:
/// "<dir>/<prefix>share-<scope><a.b.c.d>" (scope "ns<inode>-", or "" without /proc;
/// net/netns.h).
std::string share_registry_path(uint32_t ip, const std::string& dir = "/dev/shm",
                                const std::string& prefix = "softrdma-");
/// Removes the registry files "<dir>/<prefix>share-<scope><a.b.c.d>" of the calling thread's
/// network namespace in which no live process holds a slot — what processes that exited without
/// closing their device (or were killed) leave behind (a live process's file stays; the next
/// process at an address reclaims a stale one anyway). Returns the paths removed. For `softrdma
/// stat --clean`.
std::vector<std::string> share_remove_stale(const std::string& dir = "/dev/shm",
                                            const std::string& prefix = "softrdma-");

/// The pid that holds slot `slot` of the share of `ip` (host order) in the registry file of
/// `dir`/`prefix` — the process behind the QPNs whose top 4 bits are `slot` — or 0 when no
/// registry exists for the address (not a softrdma device of this host) or the slot is free.
/// A killed process's pid stays until its slot is reclaimed: check it (net/peer_liveness.h).
/// Reads the file without its lock (one aligned 32-bit load per field). Never blocks.
uint32_t share_slot_pid(uint32_t ip, uint32_t slot, const std::string& dir = "/dev/shm",
                        const std::string& prefix = "softrdma-");

/// This process's membership in the share of one address.
class AddressShare {
 public:
  AddressShare() = default;
  ~AddressShare();  ///< leave()
  AddressShare(const AddressShare&) = delete;
  AddressShare& operator=(const AddressShare&) = delete;

  /// Joins the share of `ip` (host order) in the calling thread's network namespace: maps
  /// (creating) the registry (share_registry_path()), claims the lowest free slot (a dead pid's
  /// slot is free) and binds its socket. Returns 0, EUSERS when all 16 slots are live, or the
  /// failing system call's errno.
  int join(uint32_t ip, const std::string& dir = "/dev/shm",
           const std::string& prefix = "softrdma-");
  /// Gives the slot back (clears its bit and pid), closes the socket, unmaps; the last
  /// process of the address removes the registry file. Idempotent.
  void leave();

  bool joined() const { return live_ != nullptr; }
  /// This process's slot, 0..15 (meaningful once joined()).
  uint32_t slot() const { return slot_; }
  /// Bitmap of slots whose process joined and has not left (a process killed outright
  /// leaves its bit set until its slot is reclaimed; forward() to it then fails). One
  /// relaxed load.
  uint32_t live_mask() const { return live_ ? live_->load(std::memory_order_relaxed) : 0; }
  /// Whether another process shares the address now (one relaxed load).
  bool shared() const { return (live_mask() & ~(1u << slot_)) != 0; }

  /// Sends `packet` with `meta` to slot `slot`'s socket. Never blocks; false (counted in
  /// stats().forward_drops) when the slot's process is gone or its socket is full (the
  /// packet is then lost, as a full socket buffer loses a datagram).
  bool forward(uint32_t slot, const ForwardedMeta& meta, std::span<const uint8_t> packet);

  /// The slot socket (non-blocking, CLOEXEC) for an epoll set; -1 when not joined.
  int fd() const { return fd_; }
  /// Receives one forwarded packet into `buf`: returns its length (0: none waiting; a
  /// malformed datagram is counted and skipped) and fills `meta`. Never blocks.
  size_t receive(std::span<uint8_t> buf, ForwardedMeta& meta);

  const ShareStats& stats() const { return stats_; }

 private:
  std::string name_prefix_;  // abstract socket names: "<prefix>slot-<a.b.c.d>-"
  std::string path_;         // the registry file
  uint32_t ip_ = 0;
  uint32_t slot_ = 0;
  int fd_ = -1;
  int file_fd_ = -1;
  void* map_ = nullptr;
  std::atomic<uint32_t>* live_ = nullptr;
  ShareStats stats_;
};

}  // namespace softrdma::net
