// Same-host shared-memory packet path of one softrdma device.
//
// A device (one IPv4 address, one process) owns an inbound *mailbox*: a file in /dev/shm
// holding a small header and K single-producer/single-consumer rings. Another softrdma
// device on this host that sends to that address maps the mailbox, claims one free ring and
// appends whole RoCEv2 packets (UDP payloads, BTH…ICRC) as variable-size records; the owner
// polls its claimed rings and hands each record to the engine in place (zero copy). This is
// the ShmPort counterpart of UdpPort: the engine above keeps PSNs, ACKs and retransmission,
// so this layer may drop a packet (ring full, peer gone) but never blocks, waits on a peer,
// or trusts what a peer wrote to shared memory.
//
// Threading: one ShmPort is used by one thread at a time (the engine calls everything under
// its device lock). The only cross-process sharing is through the atomics in the mappings.
// A fork()ed child must not use its copy of a parent's port: it would be a second producer
// on the parent's rings (like a verbs context after fork without ibv_fork_init).
//
// Liveness and ownership: the device's doorbell socket, an abstract unix datagram socket
// named "\0<prefix>bell-<a.b.c.d>", is the address lock: binding it is atomic, exclusive and
// released by the kernel when the owner dies, so two processes can never both believe they
// own one mailbox (a file-only O_EXCL/unlink scheme races when two processes replace the
// same stale file). Like the UDP socket the engine binds, that descriptor is inherited by a
// fork()ed child, which then keeps the address taken while it lives.
//
// Network namespaces (issue 21): /dev/shm and kill(pid, 0) reach across network namespaces,
// the doorbell does not. A mailbox is therefore scoped to the network namespace of the device
// that opened it — its file name carries the namespace (net/netns.h) and so does its header —
// and a sender takes a mailbox for a peer only when it can reach the peer's doorbell
// (connect(2) to it succeeds). A process in another namespace, even one using the same
// address, is never written to: it is reached by UDP like a process on another host.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "net/shm_placement.h"

namespace softrdma::net {

namespace detail {
struct ShmMailboxHeader;  // layout of the shared mapping: private to shm_port.cpp
struct ShmRingCtl;
}  // namespace detail

/// ShmConfig::netns: the calling thread's network namespace, resolved by ShmPort::open.
inline constexpr uint64_t kCurrentNetns = UINT64_MAX;

/// Where mailboxes live and how big they are. Tests override `dir`/`name_prefix` so they
/// never meet a real device; the engine uses the defaults.
struct ShmConfig {
  std::string dir = "/dev/shm";           ///< directory of mailbox files (a tmpfs)
  std::string name_prefix = "softrdma-";  ///< prefix of file and doorbell names
  /// Network namespace the mailbox names are scoped to (net/netns.h): kCurrentNetns (the
  /// opening thread's, resolved by open()), 0 (unscoped), or a current_netns() value. Peers
  /// are only looked up in the same scope.
  uint64_t netns = kCurrentNetns;
  uint32_t ring_count = 64;  ///< K rings per mailbox, 1..64 (one per sender)
  /// Data bytes per ring: a power of two, 64 KiB … 1 GiB. tmpfs allocates pages lazily, so
  /// the mailbox file (K × ring_bytes) costs memory only for rings in use; a producer reserves
  /// its ring's pages with fallocate() when it claims it (so a full tmpfs gives kNoPeer, not
  /// SIGBUS later).
  uint64_t ring_bytes = 4u << 20;
  /// Largest packet carried, bytes (also capped to ring_bytes / 4). Larger ones: kNoPeer.
  uint32_t max_packet_bytes = 16384;
  /// ring_doorbells() rings a peer whose last note_polling() is older than this, ns, unless
  /// the peer published its own threshold (set_doorbell_threshold()).
  uint64_t doorbell_threshold_ns = 2000;
  /// A failed peer lookup or ring claim is retried at most this often, ns.
  uint64_t peer_retry_ns = 100'000'000;
  /// Peer pids (sender side: the receiver; receiver side: each producer) are checked with
  /// kill(pid, 0) at most this often, ns.
  uint64_t liveness_check_ns = 100'000'000;
  /// Bytes of packets send() may hold per peer when that peer's ring is full, written in
  /// order as the receiver frees room (drain_backlog()); 0: a full ring drops (kFull). The
  /// same-host analogue of a lossless (PFC) link: the sender sees the receiver's free space,
  /// so it waits instead of losing a packet that RC would have to retransmit.
  uint64_t backlog_bytes = 8u << 20;
};

/// Path of the mailbox file of `ip` (host order) in cfg.netns (kCurrentNetns: the calling
/// thread's namespace): "<dir>/<prefix>shm-<scope><a.b.c.d>", scope "ns<inode>-" or "" when
/// unscoped (netns_scope()).
std::string shm_mailbox_path(const ShmConfig& cfg, uint32_t ip);
/// Abstract-namespace doorbell socket name of `ip`, without the leading NUL:
/// "<prefix>bell-<a.b.c.d>" (abstract unix names are per network namespace already).
std::string shm_doorbell_name(const ShmConfig& cfg, uint32_t ip);
/// Removes the mailbox files of cfg.netns in cfg.dir (cfg.name_prefix + "shm-<scope><a.b.c.d>")
/// that no live device owns — what a killed device leaves behind (one that closes removes its own,
/// and the next device on the address replaces a stale one anyway). Each address is taken with the
/// same lock ShmPort::open takes, so a device opening meanwhile is never disturbed, and a sender
/// still mapping the stale mailbox is told it closed. Mailboxes of other network namespaces are
/// left alone: their lock (the doorbell) cannot be taken from here, so run it in each namespace.
/// Returns the paths removed.
std::vector<std::string> shm_remove_stale_mailboxes(const ShmConfig& cfg);
/// clock::now_ns() (virtual CLOCK_MONOTONIC, base/clock.h): the clock of note_polling() and
/// ring_doorbells().
uint64_t shm_monotonic_ns();

/// Result of ShmPort::send.
enum class ShmSendResult {
  kSent,    ///< the packet is in the peer's ring
  kQueued,  ///< the ring had no room (or older packets wait): the packet was copied to the
            ///< peer's backlog and goes into the ring, in order, when room appears
  kFull,    ///< the ring and the backlog have no room: the packet was dropped (RoCE
            ///< retransmits it)
  kNoPeer,  ///< no live mailbox for dst (or no free ring there, or the packet is larger than
            ///< max_packet_bytes): nothing was written; send by UDP or drop
  kFault,   ///< reading the packet's memory faulted (unmapped since registration): the
            ///< record was not published (net/fault_guard.h)
};

/// Counters of one port (plain integers: read them under the same lock as the port).
struct ShmStats {
  uint64_t packets_out = 0;    ///< records written by send()
  uint64_t bytes_out = 0;      ///< their packet bytes
  uint64_t full_drops = 0;     ///< send() returned kFull
  uint64_t backlogged = 0;     ///< send() returned kQueued
  uint64_t backlog_lost = 0;   ///< backlogged packets discarded because their peer went away
  uint64_t no_peer = 0;        ///< send() returned kNoPeer
  uint64_t packets_in = 0;     ///< records delivered by poll()
  uint64_t bytes_in = 0;       ///< their packet bytes
  uint64_t broken_rings = 0;   ///< inbound rings found malformed and quarantined
  uint64_t peers_found = 0;    ///< peer mailboxes mapped (a restarted peer counts again)
  uint64_t peers_lost = 0;     ///< mapped peers dropped (mailbox closed or owner pid dead)
  uint64_t rings_claimed = 0;  ///< outbound rings claimed in peers' mailboxes
  uint64_t rings_freed = 0;    ///< inbound rings returned to the free pool by this receiver
  uint64_t doorbells = 0;      ///< doorbell datagrams sent
  /// Peers dropped because their doorbell refused a datagram (ECONNREFUSED, ENOENT: no
  /// socket of that name in this network namespace; ring_doorbells()).
  uint64_t doorbell_failures = 0;
  /// Mailboxes found whose doorbell could not be reached (another namespace's process, or an
  /// owner that is exiting): not taken as peers.
  uint64_t unreachable_peers = 0;
  /// Peers whose direct-placement table placement_to() could not use: the pid does not name
  /// the mailbox's owner, or cross-memory attach is refused (ptrace rules, seccomp).
  uint64_t placement_refused_peers = 0;
};

/// The shared-memory endpoint of one device: its inbound mailbox (receiver side) and the
/// rings it holds in peers' mailboxes (sender side).
class ShmPort {
 public:
  ShmPort();
  ~ShmPort();  ///< close()
  ShmPort(const ShmPort&) = delete;
  ShmPort& operator=(const ShmPort&) = delete;

  /// Creates the mailbox of `ip` (host order) and binds its doorbell socket. Returns 0 or an
  /// errno value: EADDRINUSE when a live process owns `ip` (its doorbell socket is bound, or
  /// the existing file names a live owner pid and is not closed); EINVAL for a bad config or
  /// a port already open; otherwise the failing system call's errno (e.g. ENOENT when `dir`
  /// does not exist). A mailbox left by a dead or closed owner is unlinked and replaced.
  int open(uint32_t ip, const ShmConfig& cfg = {});
  /// Marks the mailbox closed (senders see it on their next send and stop), unlinks and
  /// unmaps it, returns this device's outbound rings to their receivers, closes the sockets.
  /// Idempotent.
  void close();

  bool is_open() const { return hdr_ != nullptr; }
  uint32_t ip() const { return ip_; }
  /// The random 64-bit epoch of this mailbox incarnation (0 when closed).
  uint64_t epoch() const { return epoch_; }
  const ShmConfig& config() const { return cfg_; }
  const ShmStats& stats() const { return stats_; }

  /// Appends one packet, gathered from `iov[0..iovcnt)`, to this device's ring in the
  /// mailbox of `dst_ip` (host order). The first send to a dst maps its mailbox and claims a
  /// ring; a failed lookup or claim is retried at most every peer_retry_ns. A mapped peer
  /// whose mailbox is closed, whose owner pid died (checked every liveness_check_ns) or that
  /// took our ring away is unmapped and looked up again (a restarted receiver has a new
  /// file and epoch). Never blocks. Returns kSent, kFull (dropped) or kNoPeer (not written).
  /// `ecn_ce`: the packet carries the Congestion Experienced mark an emulated link put on it
  /// (the IPv4 ECN field a UDP datagram would have carried), delivered with the record.
  /// A full ring does not drop while the peer's backlog has room (ShmConfig::backlog_bytes):
  /// the packet is copied there (kQueued), and while a backlog holds packets every later
  /// packet to that peer joins it, so records stay in send() order.
  ShmSendResult send(uint32_t dst_ip, const iovec* iov, size_t iovcnt, bool ecn_ce = false);

  /// Writes backlogged packets into their peers' rings while they fit (call once per
  /// progress round; ring_doorbells() afterwards). Returns the bytes still waiting, in all.
  /// A peer found closed or dead loses its backlog (stats().backlog_lost).
  uint64_t drain_backlog();
  /// Whether packets to `dst_ip` wait in a backlog: a sender that can hold back (an RC
  /// requester) should, until drain_backlog() has emptied it. One branch when no backlog
  /// exists.
  bool backlogged(uint32_t dst_ip) const { return !backlogged_.empty() && backlogged_slow(dst_ip); }
  /// Whether any peer has a backlog (the caller then polls drain_backlog() soon: the
  /// receiver frees room without telling the sender).
  bool any_backlog() const { return !backlogged_.empty(); }

  /// Sends a 1-byte doorbell datagram to every peer written to since the last call whose
  /// receiver has not noted polling within its threshold (the one it published with
  /// set_doorbell_threshold(), else doorbell_threshold_ns) before `now_ns`
  /// (CLOCK_MONOTONIC ns), or noted sleeping. Call after each batch of send()s. EAGAIN (a
  /// doorbell is already pending) is ignored. A doorbell refused with ECONNREFUSED or ENOENT
  /// means no socket of that name is reachable from this network namespace — the receiver is
  /// gone, or lives in another namespace and would never be woken: that peer is dropped (its
  /// ring given back; what it held is lost, RC resends it) and looked up again no sooner than
  /// peer_retry_ns, by then over UDP unless its doorbell answers. Returns the number of peers
  /// so dropped (also added to stats().doorbell_failures).
  size_t ring_doorbells(uint64_t now_ns);

  /// Owner side: this mailbox's direct-placement table (net/shm_placement.h), in which the
  /// engine publishes its remotely writable regions and QPs. Unattached while closed.
  PlacementTable& placement() { return placement_; }
  /// Sender side: the direct-placement table of the peer at `dst_ip` (host order), when its
  /// mailbox is mapped (looked up here as by send(), at most every peer_retry_ns) and its owner was
  /// verified as the process the pid names and reachable by process_vm_writev (checked once per
  /// mapping; a refusal is counted in stats().placement_refused_peers and final for that mapping);
  /// else nullptr.
  const PlacementTable* placement_to(uint32_t dst_ip);
  /// Sender side: while held (calls nest), peers dropped by send() or ring_doorbells() keep
  /// their mappings until the last release_mappings(), so that a PlacementTable* from
  /// placement_to(), and pins taken through it, stay valid across those calls (a sender that
  /// pushes headers between its copy and its unpin).
  void hold_mappings() { ++holds_; }
  void release_mappings();

  /// The receiver's doorbell socket (non-blocking, CLOEXEC) for the engine's epoll set: it
  /// turns readable when a sender rang. -1 when closed.
  int doorbell_fd() const { return bell_fd_; }
  /// Reads and discards every pending doorbell datagram (bounded; never blocks).
  void drain_doorbell();
  /// Receiver is busy-polling at `now_ns` (CLOCK_MONOTONIC ns): senders within the
  /// threshold skip the doorbell. One relaxed store.
  void note_polling(uint64_t now_ns);
  /// Receiver: publishes how old its note_polling() clock may be, ns, before senders ring
  /// the doorbell (0: ShmConfig::doorbell_threshold_ns). A receiver whose polling thread is
  /// often descheduled rather than stopped (more runnable threads than CPUs) raises it: a
  /// doorbell then only wakes a second thread (the engine's progress thread) that competes
  /// for the same cores, while the poller reads the ring itself when next scheduled. A
  /// store only when the value changes.
  void set_doorbell_threshold(uint64_t ns);
  /// Receiver is about to block: senders always ring from now on. The caller must poll()
  /// once more after this and before blocking (a sender that saw an earlier note_polling()
  /// may have skipped its doorbell); the store-fence here pairs with the fence in
  /// ring_doorbells() so that one of the two sides always sees the other.
  void note_sleeping();

  /// Delivers up to `budget` inbound packets, visiting the claimed rings round-robin. For
  /// each calls `on_packet(uint32_t src_ip, std::span<const uint8_t> bytes)` with the bytes
  /// in place in shared memory (valid only during the call; the ring slot is released right
  /// after it returns). Returns the number delivered. With nothing there it costs a few
  /// atomic loads. Also (at most every liveness_check_ns) frees rings whose producer died or
  /// released them, once what it wrote has been delivered (a dead producer's whole records
  /// still arrive, as datagrams of a dead sender do); a malformed ring is counted in
  /// stats().broken_rings, quarantined and its records discarded.
  /// `on_packet` may call send() (e.g. to answer with an ACK) but not poll() or close().
  /// An `on_packet` that also takes a third argument, `bool ecn_ce`, is told whether the
  /// record carries the Congestion Experienced mark (send()'s `ecn_ce`).
  template <class F>
  size_t poll(F&& on_packet, size_t budget) {
    using Fn = std::remove_reference_t<F>;
    return poll_impl(
        [](void* ctx, uint32_t src, std::span<const uint8_t> bytes, bool ce) {
          if constexpr (std::is_invocable_v<Fn&, uint32_t, std::span<const uint8_t>, bool>)
            (*static_cast<Fn*>(ctx))(src, bytes, ce);
          else
            (*static_cast<Fn*>(ctx))(src, bytes);
        },
        const_cast<void*>(static_cast<const void*>(&on_packet)), budget);
  }

 private:
  using PacketFn = void (*)(void* ctx, uint32_t src_ip, std::span<const uint8_t> bytes,
                            bool ecn_ce);
  struct Peer;
  using MailboxHeader = detail::ShmMailboxHeader;
  using RingCtl = detail::ShmRingCtl;

  size_t poll_impl(PacketFn fn, void* ctx, size_t budget);
  bool backlogged_slow(uint32_t dst_ip) const;
  /// Appends one record to p's ring if it fits; false (nothing published) when it does not,
  /// or when reading the payload faulted (then *faulted is set; net/fault_guard.h).
  bool write_record(Peer& p, const iovec* iov, size_t iovcnt, uint64_t len, bool ecn_ce,
                    bool* faulted = nullptr);
  /// Writes p's backlog into its ring while it fits; true when the backlog is empty.
  bool drain_peer(Peer& p);
  /// Discards p's backlog (its receiver went away).
  void drop_backlog(Peer& p);
  void housekeeping();
  void quarantine_ring(uint32_t index, uint64_t tail);
  void free_ring(uint32_t index);
  Peer& peer_for(uint32_t dst_ip);
  bool lookup_peer(Peer& p, uint64_t now);
  /// Whether p's doorbell can be rung from this port's network namespace (someone there has
  /// it bound). Sends nothing.
  bool doorbell_reachable(const Peer& p) const;
  bool claim_ring(Peer& p, uint64_t now);
  void drop_peer(Peer& p, bool release_ring);
  RingCtl* ring_ctl(uint32_t index) const;
  uint8_t* ring_data(uint32_t index) const;

  ShmConfig cfg_;
  uint32_t ip_ = 0;
  uint32_t pid_ = 0;
  uint64_t epoch_ = 0;
  std::string path_;
  // Receiver side: our mailbox.
  MailboxHeader* hdr_ = nullptr;
  size_t map_bytes_ = 0;
  int bell_fd_ = -1;
  uint32_t rr_ = 0;                       // round-robin start ring
  uint64_t next_housekeeping_ = 0;        // coarse-clock ns
  uint64_t local_poll_ns_ = 0;            // last value note_polling() published (0: sleeping)
  uint64_t local_after_ns_ = UINT64_MAX;  // last set_doorbell_threshold() (resolved)
  // Sender side.
  int bell_tx_fd_ = -1;
  std::unordered_map<uint32_t, std::unique_ptr<Peer>> peers_;
  Peer* last_peer_ = nullptr;
  PlacementTable placement_;                         // owner side
  uint32_t holds_ = 0;                               // hold_mappings() depth
  std::vector<std::pair<void*, size_t>> graveyard_;  // peers' mappings dropped while held
  std::vector<Peer*> dirty_;       // peers written to since the last ring_doorbells()
  std::vector<Peer*> backlogged_;  // peers whose backlog holds packets
  ShmStats stats_;
};

}  // namespace softrdma::net
