// kv::Engine's inside, shared by the files that each do one job: engine.cpp (the API:
// options, segments, the metadata record, peer probes), connection.cpp (devices, QPs, the
// handshake), submit.cpp (batches: checking, slicing with slicing.h, queueing),
// notifications.cpp (messages to peers and the inbox) and progress.cpp (the progress thread:
// posting slices, completions, failures).
//
// Locking: one mutex `mu` guards every table below. The progress thread takes it per batch
// of completions; the API takes it per call; neither holds it across network I/O (the
// handshake and the metadata store are talked to with `mu` released). Callbacks run with
// `mu` released.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kv/engine.h"
#include "kv/socket.h"

namespace softrdma::kv {

using Clock = clock::Steady;  // virtual under time dilation (base/clock.h)

namespace detail {

/// Notification buffers per peer: slots of kSlotBytes (a u32 length, then the message).
constexpr uint32_t kNotifySlots = 64;
constexpr uint32_t kSlotBytes = 1024;
static_assert(Engine::kMaxNotifyBytes + 4 <= kSlotBytes);

/// What a work request is, in the low 3 bits of its wr_id; the rest is a Slice pointer
/// (kData) or a slot index (kNotifySend, kRecv) or a probe sequence number (kProbe); a
/// kPathProbe (a zero-length WRITE timed to learn the path's RTT) carries nothing.
enum class WrKind : uint64_t { kData = 0, kNotifySend = 1, kRecv = 2, kProbe = 3, kPathProbe = 4 };
constexpr uint64_t kKindMask = 7;

/// Path probes per connection: zero-length RDMA WRITEs on QP 0, one after another, each timed
/// from post to completion; the smallest is the path's RTT (EngineOptions::max_wr_from_path).
constexpr uint32_t kPathProbes = 5;
/// The most data slices a QP may have outstanding when the path raises its window, and so
/// the send queue's depth for data when max_wr_from_path (less what notifications and probes
/// need where the device's max_qp_wr is smaller: softrdma's and mlx5's is 32,768, rxe's
/// 16,384). At 8,192, 32 KiB blocks kept 256 MiB per QP outstanding, 512 MiB over the
/// default 2 QPs, under 100 Gbit/s × 50 ms's 625 MB; at 16,384, 1 GiB filled that path
/// without loss but not with 0.1 % (the WRITEs behind each hole keep their slots while it is
/// repaired): 2 GiB now (docs/kv.md, Llama-3-70B 32 K).
constexpr uint32_t kMaxPathWindow = 32768;
/// Send-queue entries of a QP kept beside its data slices: notifications, path probes.
constexpr uint32_t kSqReserved = kNotifySlots + 8;
/// Bandwidth-delay products (of the RTT measured at connect, on an idle path) of data a QP
/// keeps outstanding (Qp::byte_target): twice what one round trip holds — the path's BDP and
/// as much again standing in its bottleneck queue (a one-BDP FIFO doubles the loaded round
/// trip) — and that again posted behind a lost packet while its repair takes a round trip:
/// RC completes in order, so nothing after the hole completes (and frees its slot) until
/// then. Llama-3-8B 2 K tokens over 10 Gbit/s × 50 ms, whole cache, 0 / 0.1 % loss: 269–298 /
/// 324–334 ms at 4; 347–358 / 370–522 ms at 2 (docs/kv.md, "Slices in flight count bytes").
/// The growth holds CQ entries for the connection's life: peers added later are refused
/// once the CQ is reserved (connection.cpp, "too many connections").
constexpr uint64_t kRepairRounds = 4;

struct Batch;
struct Qp;
struct Peer;

/// A local registration (a Segment plus one MR per device, in device order). `refs` counts
/// register_memory calls; `inflight` the slices that use it.
struct Region {
  Segment seg;
  std::vector<ibv_mr*> mrs;
  int refs = 1;
  uint64_t inflight = 0;
};

/// One work request's worth of a transfer.
struct Slice {
  Batch* batch = nullptr;
  Region* region = nullptr;
  Qp* qp = nullptr;
  uint64_t local = 0;
  uint64_t remote = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  Opcode opcode = Opcode::kWrite;
};

struct Batch {
  BatchId id = 0;
  size_t capacity = 0;
  size_t transfers = 0;
  uint64_t bytes_total = 0;
  uint64_t bytes_done = 0;
  size_t slices_left = 0;    ///< slices submitted and not yet finished
  std::deque<Slice> slices;  ///< stable addresses: wr_ids point at them
  std::string notify;        ///< sent to notify_peer when the batch completes
  std::string notify_peer;
  bool failed = false;
  std::string error;
  std::string error_peer;
  BatchCallback callback;
};

/// One RC QP to a peer. Owned by Impl::qps (not by the peer): a QP replaced after a failure
/// lives on, in the error state, until its flushed work requests are all polled.
struct Qp {
  ibv_qp* qp = nullptr;
  Peer* peer = nullptr;
  uint32_t index = 0;             ///< position in the peer's set (0 carries notifications)
  uint32_t dev = 0;               ///< local device (index % local devices)
  uint32_t remote_dev = 0;        ///< the peer's device at the other end (its rkey index)
  uint32_t outstanding = 0;       ///< send work requests posted and not yet completed
  uint32_t data_outstanding = 0;  ///< of which data slices (bounded by window)
  uint64_t data_bytes = 0;        ///< bytes of those data slices
  /// Data slices it may have outstanding: EngineOptions::max_wr, raised towards byte_target
  /// once the path's RTT is measured (apply_path_window, pump), at most sq_slices.
  uint32_t window = 0;
  /// Bytes of data the path wants outstanding on this QP (apply_path_window: kRepairRounds ×
  /// its share of the bandwidth-delay product); while fewer are, a full window grows (pump) —
  /// slices smaller than slice_bytes need more of them. 0: not measured.
  uint64_t byte_target = 0;
  uint32_t sq_slices = 0;  ///< the send queue's room for data slices
  int cq_share = 0;        ///< entries of its device's CQ reserved for it
  uint32_t recvs_posted = 0;
  std::deque<Slice*> queue;  ///< slices waiting for a free send slot
  bool retired = false;
};

enum class PeerState : uint8_t { kIdle, kConnecting, kConnected, kBroken };

/// What this engine knows about another engine.
struct Peer {
  std::string name;
  std::string desc;  ///< "'decode' (127.0.0.3)" for messages
  PeerState state = PeerState::kIdle;
  std::string broken_reason;
  /// The last established connection failed (fail_peer) and no handshake replaced it: the
  /// peer died, restarted or stopped answering (Engine::watch_peer).
  bool lost = false;
  std::vector<Qp*> qps;  ///< the current set (empty unless connected)
  uint32_t stripe = 0;   ///< next QP for a slice
  // Notification buffers (registered once, reused across reconnections).
  std::vector<char> recv_buf, send_buf;
  ibv_mr* recv_mr = nullptr;
  ibv_mr* send_mr = nullptr;
  std::vector<uint32_t> free_send_slots;
  std::deque<std::string> pending_notify;  ///< waiting for a free send slot
  uint64_t probes_sent = 0, probes_done = 0;
  /// The path (EngineOptions::max_wr_from_path): path probes completed on the current
  /// connection, when the one in flight was posted, and the smallest RTT seen (0: none yet).
  uint32_t path_probes = 0;
  Clock::time_point path_probe_sent{};
  std::chrono::nanoseconds path_rtt{0};
};

/// Connection details of one QP of one side of a handshake: its device's address (GID,
/// LID, link layer, active MTU), the device's index on that side, the QPN and first PSN.
struct QpInfo {
  uint8_t gid[16] = {};
  uint32_t lid = 0;
  uint32_t link_layer = 0;
  uint32_t mtu = 0;
  uint32_t dev = 0;
  uint32_t qpn = 0;
  uint32_t psn = 0;
  /// Responder resources this side's QP offers (its max_dest_rd_atomic): the most RDMA
  /// READs/atomics the other side may have outstanding on it (IBTA vol 1, 9.5).
  uint32_t rd_atomic = 1;
};

/// Connection details of one side of a handshake: QP i of the set, in order.
struct QpSetInfo {
  std::vector<QpInfo> qps;
};

/// One opened verbs device of the engine: its context, PD, CQ and completion channel, and
/// the port facts the QPs on it need.
struct Device {
  std::string name;  ///< "srdma1"
  std::string addr;  ///< "127.0.0.3" (gid_text)
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  int cq_capacity = 0;
  int cq_reserved = 0;  ///< CQ entries the QPs may need (a connection is refused beyond)
  ibv_gid gid{};
  uint16_t lid = 0;
  uint8_t link_layer = 0;
  uint8_t active_mtu = 0;
  uint8_t max_rd_atomic = 1, max_dest_rd_atomic = 1;
  uint64_t port_bits = 0;  ///< the port's data rate, bits/s (0: unknown; base/link_rate.h)
  uint32_t max_qp_wr = 0;  ///< ibv_device_attr::max_qp_wr
};

/// The devices an engine opened (Mooncake's RdmaContext): opened and closed by
/// connection.cpp, read by every part.
struct Context {
  std::vector<Device> devs;     ///< at least one once open_devices() returned
  uint64_t max_msg = 1u << 30;  ///< the smallest of the devices' largest messages, bytes
  std::string device_addr;      ///< devs[0]'s address
  std::vector<std::string> device_names;
};

/// The TCP listener peers connect to for the QP handshake (connection.cpp): its address, as
/// published in the record, and the thread that serves it.
struct HandshakeListener {
  std::string host;
  uint16_t port = 0;
  tcp::Fd listener;
  std::thread thread;
};

/// The progress thread (progress.cpp; Mooncake's worker pool, of one thread).
struct ProgressWorker {
  int wake_fd = -1;  ///< eventfd: wakes the thread (Impl::stop)
  std::thread thread;
  /// Data slices posted and not yet completed, over every QP (written under `mu`, read
  /// without it by the progress loop to decide whether to keep polling).
  std::atomic<uint64_t> data_busy{0};
};

/// A peer's published record (parse_record / Impl::record_text).
struct PeerRecord {
  uint32_t pid = 0;
  std::string host;  ///< handshake listener
  uint16_t port = 0;
  std::vector<std::string> devices;  ///< device addresses, in device order
  std::vector<Segment> segments;
  std::vector<std::vector<uint32_t>> rkeys;  ///< parallel to segments: one per device
};

/// Callbacks due (run by the progress thread once mu is released), with their arguments.
using DueCallbacks = std::vector<std::pair<BatchCallback, std::pair<BatchId, BatchStatus>>>;

/// Parses a record published by record_text(); throws std::runtime_error when malformed.
PeerRecord parse_record(const std::string& text);

}  // namespace detail

struct Engine::Impl {
  using Peer = detail::Peer;
  using Qp = detail::Qp;
  using Batch = detail::Batch;
  using Region = detail::Region;

  std::string name;
  EngineOptions opt;
  std::shared_ptr<MetadataStore> store;

  detail::Context context;              ///< the devices (connection.cpp)
  detail::HandshakeListener handshake;  ///< where peers connect (connection.cpp)
  detail::ProgressWorker worker;        ///< the progress thread (progress.cpp)
  std::atomic<bool> stop{false};        ///< the engine is closing: the threads return

  // ---- tables (guarded by mu) ----
  mutable std::mutex mu;
  std::condition_variable cv;  ///< batch finished, notification arrived, peer state changed
  std::map<uint64_t, std::unique_ptr<Region>> regions;  ///< by start address
  std::map<std::string, Region*, std::less<>> regions_by_name;
  uint64_t next_segment = 1;
  std::map<std::string, std::unique_ptr<Peer>, std::less<>> peers;
  std::vector<std::unique_ptr<Qp>> qps;
  std::unordered_map<uint64_t, Qp*> qp_by_num;  ///< by qp_key(device, QPN)
  struct OpenSegment {
    std::string peer;
    Segment seg;
    std::vector<uint32_t> rkeys;  ///< one per device of the peer
  };
  std::map<SegmentHandle, OpenSegment> open_segments;
  /// One transfer of a submit_transfer, checked: its local region and target segment.
  struct CheckedTransfer {
    const TransferRequest* req;
    Region* region;
    OpenSegment seg;
  };
  SegmentHandle next_handle = 1;
  std::map<BatchId, std::unique_ptr<Batch>> batches;
  BatchId next_batch = 1;
  std::deque<Notification> inbox;
  std::mutex publish_mu;  ///< serialises record publications (store I/O outside mu)

  // ---- engine.cpp ----
  std::string record_text() const;  // with mu held
  void publish();                   // without mu
  [[noreturn]] void fail_local(const std::string& what) const;

  // ---- submit.cpp: submit_transfer's steps (mu held) ----
  /// The batch `batch`, checked to take `transfers` more and `notify`; throws
  /// std::invalid_argument prefixed with `who`.
  Batch& batch_for_submit(BatchId batch, size_t transfers, std::string_view notify,
                          const std::string& who);
  /// Checks every request (segment handle, range, opcode, local registration) before any is
  /// posted, and lists the target peers in `peer_names`; throws std::invalid_argument.
  std::vector<CheckedTransfer> check_transfers(std::span<const TransferRequest> requests,
                                               std::string_view notify, const std::string& who,
                                               std::vector<std::string>& peer_names) const;
  /// Connects every target peer (mu released during handshakes) and checks that their QPs'
  /// devices have keys in the segments and that `batch` still exists; throws KvError or
  /// std::invalid_argument.
  void connect_targets(std::unique_lock<std::mutex>& lk, BatchId batch,
                       const std::vector<CheckedTransfer>& checked,
                       const std::vector<std::string>& peer_names, const std::string& who);
  /// Cuts the transfers into slices (next_slice_length), striped over each peer's QPs, and
  /// queues them; returns the QPs that got slices (to pump).
  std::vector<Qp*> enqueue_slices(Batch& b, const std::vector<CheckedTransfer>& checked);

  // ---- connection.cpp ----
  /// Opens every device of opt (EngineOptions::device_list, empty: all active ones); throws
  /// KvError naming a device that is missing or fails, with nothing left open by it.
  void open_devices();
  void open_one(detail::Device& d, ibv_device* dev);
  void close_device();
  static uint64_t qp_key(uint32_t dev, uint32_t qpn) { return (uint64_t{dev} << 32) | qpn; }
  void start_listener();
  void serve_handshake(tcp::Fd fd);
  /// Connects to `peer` if not connected (the handshake, mu released meanwhile) and returns
  /// it; `lk` holds mu on entry and exit. Throws KvError naming the peer.
  Peer& ensure_connected(std::unique_lock<std::mutex>& lk, const std::string& peer,
                         const detail::PeerRecord* record);
  Peer& peer_entry(const std::string& peer);
  /// Creates `n` QPs in INIT; throws KvError.
  std::vector<Qp*> create_qps(Peer& p, uint32_t n);
  /// INIT → RTR → RTS against `remote`; posts the notification receives on QP 0 and makes
  /// `set` the peer's current set (an older set fails over to `due`). Throws KvError.
  void install_qps(Peer& p, const std::vector<Qp*>& set, const detail::QpSetInfo& remote,
                   const std::vector<uint32_t>& my_psns, detail::DueCallbacks& due);
  detail::QpSetInfo local_info(const std::vector<Qp*>& set) const;
  void destroy_qp(Qp* q);
  void register_notify_buffers(Peer& p);
  std::vector<uint32_t> psns;  ///< scratch for create_qps

  // ---- progress.cpp ----
  void start_progress();
  void progress_loop();
  /// Handles `n` completions; appends batches whose callback is due to `done`.
  void handle_completions(uint32_t dev, const ibv_wc* wc, int n, detail::DueCallbacks& due);
  /// Posts queued slices of `q` up to max_wr outstanding; a failed post fails the peer.
  void pump(Qp& q, detail::DueCallbacks& due);
  void post_notify(Peer& p, detail::DueCallbacks& due);
  void post_recv(Qp& q, uint32_t slot);
  /// Posts a signaled zero-length RDMA WRITE with `wr_id` on the peer's QP 0 (which must
  /// exist), counted in its outstanding; false when ibv_post_send refused it.
  bool post_zero_write(Peer& p, uint64_t wr_id);
  void post_probe(Peer& p);
  /// Posts the next path probe on the peer's QP 0 (kPathProbe) and notes when.
  void post_path_probe(Peer& p);
  /// After the last path probe: sets each of the peer's QPs' byte_target to kRepairRounds ×
  /// RTT × port rate ÷ QPs and raises its window to ⌈that ÷ slice_bytes⌉ slices (within
  /// max_wr..sq_slices, as far as the CQ has entries left; reserving them), then pumps them.
  void apply_path_window(Peer& p, detail::DueCallbacks& due);
  /// "kv engine '<name>': peer <desc>: <broken_reason>", naming the peer: what check_peer
  /// and watch_peer throw for a connection that failed.
  KvError broken_error(const Peer& p) const {
    return KvError("kv engine '" + name + "': peer " + p.desc + ": " + p.broken_reason, p.name);
  }
  /// Raises q's window towards `target` slices (at most sq_slices), as far as its device's CQ
  /// has entries left, reserving them. Whether it grew.
  bool grow_window(detail::Qp& q, uint32_t target);
  void slice_done(detail::Slice& s, bool ok, const std::string& error, const std::string& peer,
                  detail::DueCallbacks& due);
  void batch_finished(Batch& b, detail::DueCallbacks& due);
  /// Marks the peer broken: its QPs go to the error state (flushing what they hold), queued
  /// slices fail, pending notifications are dropped.
  void fail_peer(Peer& p, const std::string& reason, detail::DueCallbacks& due);
  void reap_retired();
  BatchStatus status_of(const Batch& b) const;
  std::chrono::milliseconds retry_bound() const;
};

}  // namespace softrdma::kv
