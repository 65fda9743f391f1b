// A softrdma device: one IPv4 address, one UDP port 4791 socket, the QPN and key tables,
// and the progress engine that runs the transport.
//
// Threading model (docs/architecture.md): each open device has one progress thread that
// sleeps in epoll_pwait2 on the UDP socket and an eventfd, with a timeout equal to the
// earliest QP timer — an idle process uses no CPU. Every state change happens under the
// device lock: the progress thread takes it to process received packets and timers;
// application threads take it in post_send/post_recv (the requester transmits inline, so a
// post goes to the wire without a thread hop) and, when a CQ poll finds nothing, in a
// non-blocking try_progress() that receives and processes packets on the caller's thread,
// so busy-polling callers see completions without waiting for a wakeup.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/counters.h"
#include "engine/device_memory.h"
#include "engine/object_registry.h"
#include "engine/transport.h"
#include "engine/types.h"
#include "net/address_share.h"
#include "net/netem.h"
#include "net/pcap_tap.h"
#include "net/peer_liveness.h"
#include "net/shm_port.h"
#include "net/udp_port.h"
#include "net/wan_shaper.h"
#include "net/wan_topology.h"
#include "wire/icrc.h"

namespace softrdma::engine {

/// Largest RoCEv2 UDP payload accepted (4096 B MTU + 40 B of headers + pad + ICRC, with
/// room to spare); anything larger is dropped as malformed.
inline constexpr size_t kMaxRocePacketBytes = 4096 + 256;
/// Packets processed per progress round before timers and other work get a turn.
inline constexpr size_t kRxBudget = 1024;
/// QPNs of one slot of a shared address (net/address_share.h): slot k allocates QPNs
/// k·2^20 + 0x100 … k·2^20 + 0xfffff (its top 4 of 24 bits are k; QPN 0 and 1 stay special).
inline constexpr uint32_t kQpnsPerSlot = 1u << 20;
static_assert(kQpnsPerSlot * net::kShareSlots == (1u << 24));
/// Payloads up to this many bytes are copied into their TX slot at transmit() (the largest
/// inline data a WQE carries, DeviceLimits::kMaxInlineData).
inline constexpr size_t kTxCopyBytes = kTransmitCopyBytes;
/// Packets between two notes of the poll clock (net::ShmPort::note_polling) within one
/// same-host receive round: 16 packets of 4 KiB ≈ 3 µs of copying, near the doorbell
/// threshold (ShmConfig::doorbell_threshold_ns, 2 µs).
inline constexpr size_t kRxPollNoteEvery = 16;

class QueuePair;
class MemoryRegion;
class SharedReceiveQueue;
class CounterPublisher;

/// Which path packets to a peer take (SOFTRDMA_TRANSPORT).
enum class PacketPath : uint8_t {
  kAuto,  ///< shared memory to peers that are softrdma devices on this host, else UDP
  kUdp,   ///< UDP port 4791 only (the wire; `tcpdump -i lo` sees every packet)
  kShm,   ///< shared memory only: packets to a peer without a mailbox are dropped
};

/// SOFTRDMA_CC: how requesters pace themselves (docs/wide-area.md, "Congestion control").
enum class CongestionControl : uint8_t {
  kAuto,   ///< DCQCN when an emulated WAN link marks ECN (`ecn=` in SOFTRDMA_WAN), else none
  kNone,   ///< only the congestion window
  kDcqcn,  ///< DCQCN reaction point per QP (engine/dcqcn.h), driven by CNPs
};

/// How to open a device.
struct DeviceConfig {
  /// IPv4 address to bind (host order); 0 picks the first free 127.0.0.x, x = 2…254
  /// (127.0.0.1 is left to programs that name it).
  uint32_t ip = 0;
  /// Transmit-side link emulation.
  net::NetemConfig netem;
  /// Wide-area links (SOFTRDMA_WAN): the parsed topology and its source text (which names
  /// the clock file shared by a site's processes); no links: off.
  net::WanTopology wan;
  std::string wan_text;
  /// Socket buffer size requested each way, bytes.
  int socket_buffer_bytes = 4 << 20;
  /// Publish counters in /dev/shm for `softrdma stat`.
  bool publish_counters = true;
  /// Write every RoCEv2 packet sent and received to this pcap file ("%p" → pid, "%a" →
  /// address); empty: no capture.
  std::string pcap_path;
  /// UDP GSO on send and GRO on receive where the kernel has them (SOFTRDMA_GSO=0 turns
  /// both off: one datagram per packet, e.g. so `tcpdump -i lo` shows every packet).
  bool udp_offload = true;
  /// Packet path (SOFTRDMA_TRANSPORT=auto|udp|shm).
  PacketPath path = PacketPath::kAuto;
  /// Same-host path settings (mailbox in /dev/shm, ring sizes, doorbell threshold).
  net::ShmConfig shm;
  /// How long the progress thread keeps polling the shared-memory rings after their last
  /// packet before it sleeps, ns (SOFTRDMA_SPIN_US, µs; 0: sleep at once).
  uint64_t spin_ns = 20'000;
  /// Selective retransmission with softrdma peers that ask for it (SOFTRDMA_SELECTIVE_RETX).
  bool selective_retx = true;
  /// SOFTRDMA_FAULT_GUARD: install the fault guard (net/fault_guard.h) when the device opens.
  bool fault_guard = true;
  /// SOFTRDMA_SHM_PLACE: same-host RDMA WRITEs place their payload in the responder's memory
  /// (net/shm_placement.h) and publish this device's writable regions and QPs for peers.
  bool shm_place = true;
  /// Congestion control of this device's requesters (SOFTRDMA_CC).
  CongestionControl cc = CongestionControl::kAuto;
  /// Device memory the device offers in all, bytes (SOFTRDMA_DM_SIZE; max_dm_size).
  uint64_t dm_size = 256 * 1024;
  /// An address another process's device owns is shared with it (net/address_share.h)
  /// instead of refused with EADDRINUSE.
  bool share = true;

  /// Reads SOFTRDMA_ADDR, SOFTRDMA_NETEM, SOFTRDMA_WAN, SOFTRDMA_PCAP, SOFTRDMA_GSO,
  /// SOFTRDMA_SPIN_US, SOFTRDMA_SELECTIVE_RETX, SOFTRDMA_FAULT_GUARD, SOFTRDMA_SHM_PLACE,
  /// SOFTRDMA_CC, SOFTRDMA_DM_SIZE and SOFTRDMA_TRANSPORT. Returns false with `error` set when a
  /// variable is malformed.
  static bool from_environment(DeviceConfig& out, std::string& error);
};

/// What the receive path's checks decided about one packet before it reaches a QP, in the
/// order they run (rxe's hdr_check: check_type_state, check_addr, check_keys). Every
/// outcome but kAccept drops the packet and bumps the counter named beside it.
enum class RxCheck : uint8_t {
  kAccept,
  kMalformed,     ///< truncated, too long or unparsable (rcvd_malformed)
  kIcrcMismatch,  ///< ICRC wrong for every IPv4 id (rcvd_icrc_err)
  kBadPkey,       ///< P_Key outside the default partition (rcvd_malformed)
  kUnknownQpn,    ///< no QP with the BTH destination QPN (rcvd_unknown_qpn)
  kWrongService,  ///< opcode of another service, or a request/response the QP's type
                  ///< never takes (rcvd_wrong_service)
  kBadState,      ///< the QP's state takes no request/response now (rcvd_bad_state)
  kWrongSource,   ///< source address is not the QP's peer (rcvd_addr_err)
  kBadQkey,       ///< UD: the DETH Q_Key is not the QP's (rcvd_qkey_err)
};
/// The outcome's name, e.g. "unknown QPN".
const char* to_string(RxCheck c);

/// Kinds of object counted against the limits query_device reports (DeviceLimits).
enum class ObjectKind : uint8_t { kPd, kCq, kQp, kMr, kSrq, kAh, kMw, kCount };

/// One device. Created by open(); objects (PD, MR, CQ, QP) reference it and must be
/// destroyed before it.
class Device final : public Transport, public ObjectRegistry {
 public:
  /// Binds the address and starts the progress thread. On failure returns nullptr and sets
  /// `err`: EADDRINUSE (the address is taken / no free loopback address), EADDRNOTAVAIL
  /// (the address is not configured on this host), EINVAL (the capture file cannot be
  /// written; logged), or the socket error.
  static std::unique_ptr<Device> open(const DeviceConfig& cfg, int& err);
  ~Device() override;

  uint32_t ip() const { return port_.ip(); }
  /// The emulated wide-area links this device was opened with (SOFTRDMA_WAN; no links: off).
  const net::WanTopology& wan_topology() const { return wan_topo_; }
  /// This process's slot among the processes sharing the address (net/address_share.h):
  /// the top 4 bits of every QPN it allocates. 0 when the share could not be joined.
  uint32_t share_slot() const { return share_.joined() ? share_.slot() : 0; }
  /// Whether this device is a member of its address's share: another process owns UDP port
  /// 4791 (and the mailbox) there and forwards this process's packets to it.
  bool share_member() const { return member_; }
  /// The RoCEv2 GID (IPv4-mapped) of GID index 0.
  Gid gid() const { return Gid::from_ipv4(ip()); }
  /// Active MTU enum (IB MTU that fits the interface MTU minus RoCEv2 headers).
  uint8_t active_mtu() const override { return active_mtu_; }
  /// Interface MTU, bytes.
  uint32_t netdev_mtu() const { return netdev_mtu_; }
  Counters& counters() override { return *counters_; }
  /// The device memory ibv_alloc_dm allocates from (capacity: DeviceConfig::dm_size).
  DeviceMemoryPool& device_memory() { return *dm_pool_; }

  std::mutex& mutex() override { return mu_; }

  /// Reserves one object of `kind` against its DeviceLimits maximum (max_pd, max_cq,
  /// max_qp, max_mr, max_srq, max_ah). Returns false at the limit — the verbs call then fails with
  /// ENOMEM, as real verbs do. Thread-safe; pair every success with release().
  bool reserve(ObjectKind kind);
  /// Returns a reservation made by reserve().
  void release(ObjectKind kind);

  // ---- multicast (engine/multicast.cpp) -------------------------------------------------
  /// Attaches QP `qpn` to the multicast group of IPv4 address `group` (host order,
  /// 224.0.0.0/4; the GID ::ffff:group, as rdma_cm maps a RoCEv2 group): each datagram to
  /// the group's address with destination QPN 0xFFFFFF reaches it, besides every other QP on
  /// this host attached to the group (IBTA vol 1, 10.5.2.3 and annex A17.4.6; rxe_mcast.c).
  /// The device receives the group on a socket of its own (net::UdpPort::join_group).
  /// `added`: false when the QP was attached already (not an error, as in rxe).
  /// Returns kOk, not_enough_memory (DeviceLimits::kMaxMcastGrp groups, or
  /// kMaxMcastQpAttach QPs in the group), invalid_argument (no such QP, not a multicast
  /// address), or the socket's error.
  Status attach_mcast(uint32_t qpn, uint32_t group, bool& added);
  /// Detaches QP `qpn` from `group`; the device leaves the group with its last QP. Returns
  /// kOk or invalid_argument (the QP is not attached to the group).
  Status detach_mcast(uint32_t qpn, uint32_t group);

  /// Processes pending packets and timers on the calling thread if the device lock is
  /// free; returns without waiting otherwise.
  void try_progress() override;

  // ---- ObjectRegistry: tables (device lock held) ---------------------------------------
  uint32_t register_qp(QueuePair* qp) override;  ///< returns the new QPN
  bool register_qp_at(QueuePair* qp, uint32_t qpn) override;
  void unregister_qp(uint32_t qpn) override;
  uint32_t register_mr(MemoryRegion* mr) override;  ///< returns the new key
  void unregister_mr(uint32_t key) override;
  void publish_mr(const MemoryRegion& mr, bool gone) override;
  void publish_qp(const QueuePair& qp, bool gone) override;
  void drain_inbound() override;
  uint32_t register_mw(MemoryWindow* mw) override;  ///< returns the first R_Key
  void unregister_mw(uint32_t rkey) override;
  uint32_t register_srq(SharedReceiveQueue* srq) override;  ///< returns the new SRQ number
  void unregister_srq(uint32_t srqn) override;
  Transport& transport() override { return *this; }

  // ---- Transport ----------------------------------------------------------------------
  void transmit(const wire::Headers& h, uint32_t dst_ip, std::span<const iovec> payload,
                uint32_t payload_len) override;
  bool place_write(uint32_t dst_ip, uint32_t dest_qpn, uint32_t rkey, uint64_t remote_va,
                   std::span<const iovec> local, uint64_t len,
                   const std::function<void()>& commit) override;
  bool can_place(uint32_t dst_ip) override;
  MemoryRegion* find_mr(uint32_t key) override;
  MemoryWindow* find_mw(uint32_t rkey) override;
  SharedReceiveQueue* find_srq(uint32_t srqn) override;
  uint64_t now_ns() override;
  void timer_armed(QueuePair& qp, uint64_t deadline_ns) override;
  /// While a received packet is processed, holds receive completions until the next
  /// flush() has sent the coalesced ACKs (see Transport).
  void deliver_recv_completion(CompletionQueue& cq, const Cqe& cqe, bool solicited) override;
  bool selective_retransmit() const override { return selective_retx_; }
  bool congestion_control(uint32_t dst_ip, DcqcnParams& out) const override;
  bool host_local_path(uint32_t dst_ip, uint32_t peer_pid) const override;
  /// One PathShare per peer address a reliable QP of this device sent to (device lock; kept
  /// for the device's life: one entry, 32 bytes, per peer ever connected).
  PathShare* path_share(uint32_t dst_ip) override { return &path_shares_[dst_ip]; }
  /// Same-host peers: the process holding the destination QPN's slot at the peer's address
  /// (net::share_slot_pid), read from /proc (net::sample_process). Others: kUnknown.
  PeerLiveness peer_liveness(const QueuePair& qp, std::string* who = nullptr) override;
  /// The pid in slot qpn / kQpnsPerSlot of `ip`'s share registry (net::share_slot_pid).
  uint32_t peer_pid(uint32_t ip, uint32_t qpn) override;
  /// Packets to `dst_ip` wait in the same-host backlog (net::ShmPort::backlogged).
  bool path_busy(uint32_t dst_ip) override;
  void wait_for_path(QueuePair& qp) override;

  /// Sends everything queued by transmit(), then the coalesced ACKs (device lock held).
  void flush() override;
  /// Sends tx_ (shared memory or GSO runs per peer), coalesced ACKs excluded (device lock
  /// held).
  void send_queued() override;

 private:
  Device() = default;
  void progress_thread();
  /// Receives (the rings, and the UDP socket unless !check_udp), runs due timers, flushes.
  void progress_locked(uint64_t now, bool check_udp = true);
  size_t receive_locked(bool check_udp = true);
  void handle_datagram(const net::RxDatagram& d);
  /// One received packet through the checks below, in order, then to its QP's responder
  /// (requests) or completer (responses).
  /// `forwarded`: it came from the owner of the address (never forwarded again).
  void handle_packet(const net::RxDatagram& d, const uint8_t* data, size_t length,
                     uint16_t ip_id_hint, bool from_shm, bool forwarded = false);
  /// Owner of a shared address: hands a packet whose destination QPN belongs to another
  /// process's slot to that process (true: it is not for this one), and a copy of each QP1
  /// packet to every other process at the address (false: this one's QP1 takes it too).
  bool forward_to_share(const net::RxDatagram& d, const uint8_t* data, size_t length,
                        uint16_t ip_id_hint, bool from_shm);
  /// Packets the owner forwarded to this process (member, or shared), through the checks.
  size_t receive_share_locked();
  /// Sends the share's batches and backlog (net::AddressShare::send_batches) and adds the
  /// outcome to the counters (share_forwarded, share_forward_drops, share_backlogged).
  void send_share_locked();
  /// Datagrams on the multicast groups' sockets, through the checks (engine/multicast.cpp).
  size_t receive_mcast_locked();
  /// A parsed packet that arrived for multicast group d.dst_ip: a copy to each attached QP
  /// whose type, state and Q_Key take it; counted and dropped otherwise.
  void deliver_mcast(const net::RxDatagram& d, const wire::Packet& pkt, uint16_t ip_id,
                     size_t length);
  /// Bumps the drop counter of `check` (see RxCheck).
  void count_drop(RxCheck check);
  /// Removes `qpn` from every group (a QP destroyed while attached).
  void detach_all_mcast_locked(uint32_t qpn);
  RxCheck check_parse(const net::RxDatagram& d, std::span<const uint8_t> bytes, wire::Packet& pkt);
  /// A packet with the placed mark (wire::Bth::placed): only an RC RDMA WRITE packet from the
  /// same-host rings, carrying a 4-byte length of 1…4096 bytes, may have it; its payload is
  /// then taken as that many bytes already in place (placement and the responder skip the
  /// copy). Anything else: kMalformed.
  RxCheck check_placed(wire::Packet& pkt, bool from_shm);
  RxCheck check_icrc(const net::RxDatagram& d, std::span<const uint8_t> bytes, uint16_t ip_id_hint,
                     bool from_shm, const wire::Packet& pkt, wire::IcrcVerdict& v);
  RxCheck check_header(const wire::Packet& pkt) const;  // CNP, P_Key
  /// QPN, then the QP type's service and direction (rxe check_type_state), then its state.
  RxCheck check_qp_state(const wire::Packet& pkt, QueuePair*& qp) const;
  /// check_qp_state's second half: the packet's service and direction, then the QP's state.
  RxCheck check_type_state(const wire::Packet& pkt, const QueuePair& qp) const;
  /// Connected types only: the packet comes from the QP's peer (rxe check_addr).
  RxCheck check_addr(const QueuePair& qp, const net::RxDatagram& d) const;
  /// UD: the DETH Q_Key is the QP's — QP1's is the GSI's 0x80010000 (rxe check_keys).
  RxCheck check_keys(const QueuePair& qp, const wire::Packet& pkt) const;
  /// Records a received packet in the capture file (pcap_ set).
  void capture_received(const net::RxDatagram& d, const uint8_t* data, size_t length,
                        uint16_t ip_id_hint, bool from_shm, const wire::IcrcVerdict& v);
  wire::Ipv4UdpTuple rx_tuple(const net::RxDatagram& d, uint16_t ip_id_hint) const;
  /// Requests that found a peer's same-host ring full were dropped here, so this device
  /// knows the loss at once (a NIC would have back-pressured): each QP concerned goes back
  /// to its first dropped PSN with its window at half of what was in flight, and sends again
  /// now — instead of waiting for the responder's NAK, or for the retransmit
  /// timeout when the drops were the tail of a burst.
  void recover_ring_full();
  /// Writes the same-host backlogs into their rings as room appears, and runs again the
  /// requesters that held back for them (wait_for_path) once their peer's backlog is empty.
  /// While a backlog remains, the next progress round is at most kBacklogPollNs away.
  void drain_backlog(uint64_t now);
  /// Rings the doorbells of the same-host peers written to (net::ShmPort::ring_doorbells);
  /// a peer whose doorbell is refused — gone, or in another network namespace — is counted
  /// (shm_doorbell_refused), logged, and reached by UDP from then on.
  void ring_shm_doorbells(uint64_t now);
  size_t receive_shm_locked();
  void run_timers_locked(uint64_t now);
  void wake();
  void watch_socket(bool on);
  /// Whether more threads are runnable than there are CPUs (cached for 1 ms).
  bool crowded(uint64_t now);

  struct TxSlot {
    uint8_t hdr[wire::kMaxTransportHeaderBytes];
    uint8_t trailer[8];  // pad + ICRC
    /// A payload of at most kTxCopyBytes, copied at transmit(): a WQE's inline data (or an
    /// ATOMIC WRITE's 8 bytes) is freed when an ACK in the same round retires the WQE,
    /// before send_queued() reads it (a resend queued just before the original's late ACK).
    uint8_t copy[kTxCopyBytes];
    std::vector<iovec> iov;
    uint32_t dst_ip;
    uint32_t udp_len;  // BTH … ICRC, bytes
    uint32_t icrc;     // for IPv4 id 0, once icrc_done
    bool icrc_done;
    bool taken;  // by the WAN emulator (dropped, or held as a copy): not sent from here
    bool ce;     // the WAN emulator marked it Congestion Experienced
    uint8_t pad;
    uint8_t opcode;  // BTH fields of the packet, for recover_ring_full()
    uint32_t dest_qpn;
    uint32_t psn;
  };
  /// The slot's ICRC for IPv4 id 0, once; false when its payload faulted (memory unmapped
  /// since registration): the packet must not be sent.
  bool compute_icrc(TxSlot& s);
  void crc_slot(TxSlot& s);  // compute_icrc's work, under the fault guard
  enum class ShmOutcome : uint8_t { kSent, kQueued, kUseUdp, kDropped, kRingFull };
  /// One packet to `dst_ip` through the same-host rings (counted, captured when sent):
  /// kUseUdp when the peer has no mailbox and UDP is allowed; kQueued when it waits in the
  /// peer's backlog (the ring was full); kRingFull (dropped) when the backlog is full too; kDropped
  /// with no mailbox under SOFTRDMA_TRANSPORT=shm. `ce`: it carries the CE mark.
  ShmOutcome send_shm(uint32_t dst_ip, std::span<const iovec> iov, bool ce);
  /// A packet to this process's own shared address: handed to the slot socket of the process
  /// whose QPN it names (true: sent, or lost there and counted), or copied to every other
  /// process for QP1 and then sent as usual (false). The owner sends every such packet this
  /// way; a member only those for the owner's QPNs (the other members take only the owner's
  /// datagrams).
  bool forward_local(TxSlot& s);
  std::vector<uint8_t> shm_capture_;  // a same-host packet as recorded, with its ICRC

  std::mutex mu_;
  net::UdpPort port_;
  net::ShmPort shm_;               // open unless PacketPath::kUdp
  net::AddressShare share_;        // this process's slot at the address (joined unless it failed)
  bool member_ = false;            // another process owns UDP 4791 at ip(): port_ is ip():ephemeral
  std::vector<uint8_t> share_rx_;  // receive_share_locked()'s buffer
  std::vector<uint8_t> share_tx_;  // forward_local()'s gathered packet
  net::ShareStats share_seen_;     // share_.stats() already added to the counters
  int socket_buffer_bytes_ = 0;    // DeviceConfig::socket_buffer_bytes, for try_take_over()
  uint64_t next_take_over_ns_ = 0;  // a member's next try_take_over()
  /// A member checks this often whether port 4791 is free (its owner exited), ns.
  static constexpr uint64_t kTakeOverCheckNs = 20'000'000;
  /// The progress thread retries the share's backlog this often while it holds packets, ns.
  static constexpr uint64_t kShareBacklogRetryNs = 50'000;
  /// Member, progress thread, device lock held: binds UDP 4791 at the address when the owner
  /// has given it up (exited) and becomes the owner — it forwards the other members' packets
  /// from now on. The same-host mailbox stays off (UDP only).
  void try_take_over(uint64_t now);
  PacketPath path_ = PacketPath::kAuto;
  std::vector<size_t> udp_slots_;   // send_queued(): slots that go by UDP
  uint64_t last_udp_check_ns_ = 0;  // try_progress(): last recvmmsg on the UDP socket
  // Last UDP packet sent or received (written under mu_, read by the progress thread
  // without it).
  std::atomic<uint64_t> last_udp_traffic_ns_{0};
  /// UDP counts as idle after this long without a packet; while it is, pollers check the
  /// socket at most every kUdpCheckNs.
  static constexpr uint64_t kUdpIdleNs = 1'000'000, kUdpCheckNs = 20'000;
  /// How often a same-host backlog is retried while it lasts, ns: a 4 MiB ring drains in
  /// ~1 ms at 4 GB/s, so 50 µs refills it long before the receiver runs dry.
  static constexpr uint64_t kBacklogPollNs = 50'000;
  /// All recent traffic was on the same-host path (no UDP packet for kUdpIdleNs).
  bool udp_quiet(uint64_t now) const {
    return shm_.is_open() &&
           now - last_udp_traffic_ns_.load(std::memory_order_relaxed) > kUdpIdleNs;
  }
  /// peer_liveness(): each peer process's CPU time at the last look, to tell a runnable
  /// process that gets no CPU (starved: stalled) from one that runs.
  struct PeerCpu {
    uint64_t ticks = 0;
    uint64_t at_ns = 0;
    bool starved = false;
  };
  std::unordered_map<uint32_t, PeerCpu> peer_cpu_;  // by pid; device lock
  std::string shm_dir_, shm_prefix_;                // DeviceConfig::shm: where registries live
  /// Addresses an ICMP "destination unreachable" came back from, and when (now_ns()): what
  /// UdpPort::read_unreachable() reported (the progress thread reads it on EPOLLERR).
  std::unordered_map<uint32_t, uint64_t> unreachable_;  // device lock
  std::unordered_map<uint32_t, PathShare> path_shares_;  // by peer address; device lock
  std::vector<uint32_t> unreachable_rx_;                // read_unreachable()'s buffer
  /// An ICMP error older than this no longer says the peer is gone (it may have restarted).
  static constexpr uint64_t kUnreachableFreshNs = 5'000'000'000;
  /// Reads the UDP socket's ICMP errors into unreachable_ (device lock held).
  void read_icmp_errors_locked(uint64_t now);
  /// Two looks at a runnable peer's CPU time this far apart with no tick between them
  /// (sysconf(_SC_CLK_TCK) = 100: one tick is 10 ms of CPU) mean it got no CPU.
  static constexpr uint64_t kStarvedLookNs = 30'000'000;
  std::atomic<uint64_t> crowded_checked_ns_{0};
  std::atomic<bool> crowded_{false};
  std::atomic<uint64_t> last_rx_ns_{0};  // last packet received (any path)
  uint64_t spin_ns_ = 20'000;            // progress thread's ring polling after traffic
  bool selective_retx_ = true;           // DeviceConfig::selective_retx
  bool dcqcn_ = false;                   // DeviceConfig::cc resolved
  // Sends ECT(0) and lets the WAN emulator's CE marks reach the peer: on when a link of the
  // topology marks ECN (a RoCEv2 NIC with ECN enabled).
  bool ecn_capable_ = false;
  net::WanTopology wan_topo_;  // links towards peers (congestion_control(), host_local_path())
  std::unique_ptr<net::Netem> netem_;
  // Wide-area link emulation (SOFTRDMA_WAN): shapes queued packets in send_queued(), and
  // its timed queue is released by release_wan() from every progress round.
  net::WanShaper wan_;
  /// Applies the WAN links to the queued TX slots: drops and holds are marked taken (held
  /// ones copied, with the ICRC of a lone datagram). Returns whether any slot is left to send.
  bool shape_queued(uint64_t now);
  /// Sends every held packet that is due at `now`, one by one on its path.
  void release_wan(uint64_t now);
  /// Folds the WAN queue's next departure into the timer deadline the progress thread
  /// sleeps towards (waking it when that is earlier than its current sleep).
  void note_wan_deadline();
  /// At close: sends what the emulated links still hold once it is due (the progress thread
  /// keeps running meanwhile), for at most kWanDrainMaxNs. Those packets are on the wire
  /// already; a real link delivers them after their sender has gone.
  void drain_wan();
  static constexpr uint64_t kWanDrainMaxNs = 1'000'000'000;
  std::unique_ptr<net::PcapTap> pcap_;
  bool pcap_dirty_ = false;
  /// DeviceConfig::shm_place with the same-host path open: WRITE payloads placed directly, and
  /// this device's writable regions and QPs published (publish_mr / publish_qp).
  bool place_enabled_ = false;
  uint64_t placement_refusals_logged_ = 0;  // ShmStats::placement_refused_peers last logged
  /// The placement table of same-host peer `dst_ip` when WRITEs to it may be placed (placement
  /// on, no capture or link emulation, not this process's own address, the table mapped and
  /// verified; a refusal is logged once), else nullptr.
  const net::PlacementTable* placement_path(uint32_t dst_ip);
  struct HeldCompletion {
    CompletionQueue* cq;
    Cqe cqe;
    bool solicited;
  };
  bool holding_completions_ = false;              // inside handle_packet
  std::vector<HeldCompletion> held_completions_;  // released by flush(), after the ACKs
  uint8_t tx_ttl_ = 64, tx_tos_ = 0;
  std::unique_ptr<CounterPublisher> publisher_;
  Counters* counters_ = nullptr;
  std::unique_ptr<DeviceMemoryPool> dm_pool_ = std::make_unique<DeviceMemoryPool>(0);
  uint8_t active_mtu_ = 5;
  uint32_t netdev_mtu_ = 0;

  std::atomic<uint32_t> objects_[static_cast<size_t>(ObjectKind::kCount)] = {};
  std::unordered_map<uint32_t, QueuePair*> qps_;
  /// Multicast groups some QP is attached to, by IPv4 address (host order): the socket
  /// that receives the group and the attached QPNs (engine/multicast.cpp). Device lock.
  struct McastGroup {
    net::UdpPort port;
    std::vector<uint32_t> qpns;
  };
  using McastGroups = std::unordered_map<uint32_t, std::unique_ptr<McastGroup>>;
  McastGroups mcast_;
  /// Leaves the group at `it` (its socket closed, out of the epoll) once no QP is attached;
  /// returns the next group.
  McastGroups::iterator leave_if_unused_locked(McastGroups::iterator it);
  /// The key table: key index (key >> 8) → the MR or MW that holds it. MRs and MWs share the
  /// index space, so an R_Key names one object; the low 8 bits must match the object's
  /// current key (a type 2 window changes them at each bind).
  struct KeyEntry {
    MemoryRegion* mr = nullptr;
    MemoryWindow* mw = nullptr;
  };
  std::unordered_map<uint32_t, KeyEntry> keys_;
  uint32_t next_qpn_ = 0;
  uint32_t next_mr_index_ = 1;
  std::unordered_map<uint32_t, SharedReceiveQueue*> srqs_;
  uint32_t next_srqn_ = 1;
  /// A free key index (device lock held).
  uint32_t allocate_key_index();

  std::vector<uint32_t> ack_dirty_;  // QPNs with a coalesced ACK to send after this batch
  uint64_t next_deadline_ns_ = 0;    // earliest queued QP timer (0: none)
  /// QPs with an armed timer, earliest first. An entry is live only while it equals the
  /// QP's timer_queued_ns; stale entries (timer moved later, QP gone) are skipped when
  /// popped. A timer round costs O(log n) per due QP and nothing for the others, so the
  /// cost of progress does not grow with the number of QPs (bench/qp_scale: 16,000 QP pairs).
  struct TimerEntry {
    uint64_t deadline_ns;
    uint32_t qpn;
    bool operator>(const TimerEntry& o) const { return deadline_ns > o.deadline_ns; }
  };
  std::priority_queue<TimerEntry, std::vector<TimerEntry>, std::greater<>> timers_;

  std::vector<TxSlot> tx_;
  size_t tx_count_ = 0;
  /// (dest QPN, dst ip, PSN) of requests dropped on a full same-host ring, oldest first.
  struct RingFullDrop {
    uint32_t dest_qpn, dst_ip, psn;
  };
  std::vector<RingFullDrop> ring_full_;
  std::vector<uint32_t> path_waiters_;  // QPNs that held back for a same-host backlog
  wire::Packet rx_packet_;              // the packet handle_packet() is working on (under mu_)
  std::vector<iovec> tx_iov_;           // send_queued(): every run's gather list
  std::vector<net::TxDatagram> tx_batch_;
  std::vector<std::pair<size_t, size_t>> tx_ranges_;
  std::vector<std::vector<uint8_t>> rx_buffers_;
  std::vector<net::RxDatagram> rx_slots_;

  int epoll_fd_ = -1;
  int event_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> last_inline_poll_ns_{0};  // last try_progress by an app thread
  /// An application thread's try_progress is running a round (mu_ held): a long round is
  /// still polling, for the progress thread's poller window as for senders' doorbells.
  bool inline_round_ = false;
  bool socket_watched_ = true;  // progress thread's epoll has the socket
  std::atomic<uint64_t> sleep_until_ns_{0};
  /// The progress thread told same-host senders it sleeps (note_sleeping) and sleeps until
  /// its next timer, not just through a poller's window. The first application poll after
  /// that wakes it (see try_progress).
  std::atomic<bool> thread_asleep_{false};
  std::thread thread_;
};

}  // namespace softrdma::engine
