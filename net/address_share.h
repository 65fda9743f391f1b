// Several processes on one softrdma address: the per-address slot registry and the
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
// The registry also names the owner's slot (become_owner()). The owner forwards to slot k from
// a socket of its own for k, "\0<prefix>fwd-<a.b.c.d>-<owner>-<k>", and slot k's socket is
// connected to it (follow_owner()): Linux queues at most net.unix.max_dgram_qlen (10 by
// default) datagrams on a unix datagram socket from senders it is not connected to, so a burst
// of READ responses or ACKs forwarded to an unconnected socket would overflow it and be lost
// (docs/architecture.md, "Queue limit"); from the socket it is connected to, only that sender's
// send buffer bounds
// what may wait — one per slot, so a slow or stopped process holds up only its own packets.
//
// Threading: one AddressShare is used by one thread at a time (the device lock); processes
// meet only through the atomic bitmap in the mapping and the flock.
#pragma once

#include "base/locked_file.h"

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
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
  uint64_t forward_drops = 0;  ///< ... that its socket refused (gone; full and backlog full)
  uint64_t backlogged = 0;     ///< ... that waited in the backlog (its socket was full)
  uint64_t received = 0;       ///< packets another slot's owner forwarded to us
  uint64_t malformed = 0;      ///< forwarded datagrams too short to carry a ForwardedMeta
};

/// The addresses a.b.c.d of the files "<dir>/<lead><a.b.c.d>" (host order), in directory
/// order: the per-address files of /dev/shm (mailboxes, share registries, port tables).
std::vector<uint32_t> addresses_in_file_names(const std::string& dir, const std::string& lead);
/// The per-address files are opened and locked with base::open_locked_file.
using base::open_locked_file;

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

  /// Records this process as the one that owns the address's UDP 4791 (the one that
  /// forwards), and stops following another owner (a member that took over). Call once the
  /// port is bound.
  void become_owner();
  /// A member: connects its slot socket to the owner's forwarding socket for this slot when
  /// the registry names an owner other than the one it follows (a connected unix datagram
  /// socket takes its peer's datagrams past net.unix.max_dgram_qlen, and only its peer's).
  /// The owner creates that socket when it first forwards here: until then this fails and is
  /// tried again. Reconnecting discards what is still queued from the previous owner:
  /// receive() everything first. One relaxed load when nothing changed. Returns whether the
  /// socket follows the registered owner now.
  bool follow_owner();
  /// The slot of the process the registry names as the owner; kShareSlots when none.
  uint32_t owner_slot() const {
    const uint32_t o = owner_ ? owner_->load(std::memory_order_relaxed) : 0;
    return o == 0 ? kShareSlots : o - 1;
  }

  /// Queues `packet` with `meta` for slot `slot`'s socket: packets for one slot travel
  /// together, several to a datagram (records: ForwardedMeta, 32-bit length, the packet,
  /// padded to 4 bytes; up to kBatchBytes), sent when the batch is full or by send_batches(),
  /// which the caller runs after each burst. One datagram per packet was one system call on
  /// each side per packet: the member read READ responses at ~770 MB/s against ~3 GB/s
  /// between two addresses. Never blocks; false when not joined or `slot` is out of range.
  bool forward(uint32_t slot, const ForwardedMeta& meta, std::span<const uint8_t> packet);
  /// Sends the queued batches. A datagram the socket cannot take (full: this process's
  /// send buffer to that slot holds all its receiver can take) waits in the slot's backlog,
  /// in order, and is sent by a later call as the receiver reads: a member slower than the
  /// owner for a while is not made to lose and retransmit whole READ responses (each packet
  /// lost costs a go-back-N replay). Packets are lost (stats().forward_drops) when the slot's
  /// process is gone, or the backlog holds kMaxBacklogBytes already. Returns whether some
  /// wait in the backlog (call again soon: no event says when). Never blocks.
  bool send_batches();
  /// Whether packets wait in a batch or the backlog (one relaxed load: any thread).
  bool backlogged() const { return backlog_mask_.load(std::memory_order_relaxed) != 0; }
  /// The most bytes the backlog holds before packets are dropped.
  static constexpr size_t kMaxBacklogBytes = 16u << 20;
  /// The most bytes of one forwarded datagram (records of several packets): 192 KiB, below
  /// the 212,992-byte socket buffer Linux gives by default (net.core.wmem_max), which bounds
  /// a unix datagram (EMSGSIZE above it). 60 KiB per datagram (14 packets of 4 KiB) left one
  /// address at 32-47 % of two addresses' ib_write_bw / ib_read_bw on the same-host path, 192
  /// KiB at 56-66 % (perftest.shared_address_default, docs/architecture.md). A host with a
  /// smaller wmem_max gets batch_bytes() below this.
  static constexpr size_t kBatchBytes = 192u << 10;
  /// The most bytes of one forwarded datagram here: kBatchBytes, or less when the socket
  /// buffer the kernel granted is smaller (known once joined).
  size_t batch_bytes() const { return batch_bytes_; }

  /// The slot socket (non-blocking, CLOEXEC) for an epoll set; -1 when not joined.
  int fd() const { return fd_; }
  /// The epoll set to which the owner adds each forwarding socket it creates (they carry the
  /// members' packets back to it), with fd() as the event's data: receive() reads them all.
  void set_epoll(int epoll_fd) { epoll_fd_ = epoll_fd; }
  /// Receives one forwarded packet into `buf`: returns its length (0: none waiting; a
  /// malformed datagram or record is counted and skipped) and fills `meta`. A datagram holds
  /// several packets: the rest wait here for the next calls. Never blocks.
  size_t receive(std::span<uint8_t> buf, ForwardedMeta& meta);
  /// receive() without the copy: the packet where it lies in the datagram read, valid until
  /// the next call (empty: none waiting).
  std::span<uint8_t> next(ForwardedMeta& meta);
  /// Whether receive() holds packets of a datagram it has read (no epoll event announces
  /// them).
  bool rx_pending() const { return rx_pending_.load(std::memory_order_relaxed); }

  const ShareStats& stats() const { return stats_; }

 private:
  std::string name_prefix_;  // abstract socket names: "<prefix>slot-<a.b.c.d>-"
  std::string fwd_prefix_;   // the owner's forwarding sockets: "<prefix>fwd-<a.b.c.d>-"
  std::string path_;         // the registry file
  uint32_t ip_ = 0;
  uint32_t slot_ = 0;
  uint32_t following_ = 0;  // the owner's slot + 1 this socket is connected to; 0: none
  int fd_ = -1;
  int file_fd_ = -1;
  void* map_ = nullptr;
  std::atomic<uint32_t>* live_ = nullptr;
  std::atomic<uint32_t>* owner_ = nullptr;  // the registry's owner field: slot + 1, 0: none
  ShareStats stats_;
  /// One slot's datagram: records, and how many packets they hold.
  struct Batch {
    std::vector<uint8_t> bytes;
    uint32_t packets = 0;
  };
  Batch batch_[kShareSlots];                // being filled, per destination slot
  std::deque<Batch> backlog_[kShareSlots];  // refused (full), per slot, oldest first
  std::atomic<uint32_t> backlog_mask_{0};   // bit k: batch_[k] or backlog_[k] not empty
  size_t backlog_bytes_ = 0;
  size_t batch_bytes_ = kBatchBytes;     // see batch_bytes()
  std::vector<uint8_t> rx_;              // receive()'s datagram
  size_t rx_at_ = 0, rx_len_ = 0;        // its next record, its end
  std::atomic<bool> rx_pending_{false};  // rx_at_ < rx_len_ (any thread reads)
  int out_fd_[kShareSlots];  // the owner's forwarding socket per destination slot (-1: none)
  uint32_t out_pid_[kShareSlots] = {};  // the pid in the slot when out_fd_ was made
  bool out_init_ = false;
  int epoll_fd_ = -1;  // set_epoll()
  /// The owner's socket for `slot` (created and named on first use; fd_ when that fails).
  int out_fd(uint32_t slot);
  /// Closes the forwarding sockets and drops the backlog.
  void close_out();
  /// One sendmsg of `b` to `slot`'s socket: 0 sent, else the errno (EAGAIN: full).
  int send_to(uint32_t slot, const Batch& b);
  /// Sends slot `k`'s backlog, then its batch; what the socket refuses waits or is dropped.
  void send_slot(uint32_t k);
  /// A slot whose socket nobody holds (killed without leave()): its bit cleared.
  void forget_slot(uint32_t slot);
};

}  // namespace softrdma::net
