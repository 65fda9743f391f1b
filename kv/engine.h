// kv::Engine: the KV-cache transfer engine, one per process, over plain libibverbs.
//
// The shape is the one users of Mooncake's TransferEngine and NIXL's agent know:
//
//   register memory (named segments)  →  publish metadata (MetadataStore)
//   open a peer's segment             →  allocate a batch, submit (local, remote, offset, length)
//   poll the batch / completion callback / wait  →  notifications ("layer 17 of request 42")
//
// Mooncake: TransferEngine::registerLocalMemory / openSegment / allocateBatchID /
// submitTransfer / getTransferStatus / freeBatchID (mooncake-transfer-engine/include/
// transfer_engine.h). NIXL: nixlAgent registerMem / createXferReq / postXferReq /
// getXferStatus / genNotif / getNotifs. The bytes move over RC QPs: one set of QPs per peer,
// slices striped over them, the QPs spread over the engine's devices (docs/kv.md, "Design",
// "Devices").
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kv/metadata_store.h"

namespace softrdma::kv {

/// A failure that involves a peer (unreachable, died mid-transfer, refused the handshake,
/// unknown segment on it) or the local device. `peer()` is the peer engine's name, or empty
/// for a local failure. Bad arguments throw std::invalid_argument instead.
class KvError : public std::runtime_error {
 public:
  KvError(const std::string& what, std::string peer)
      : std::runtime_error(what), peer_(std::move(peer)) {}
  const std::string& peer() const { return peer_; }

 private:
  std::string peer_;
};

/// Direction of one transfer, seen from the engine that submits it.
enum class Opcode : uint8_t {
  kRead,   ///< remote segment → local memory (RDMA READ)
  kWrite,  ///< local memory → remote segment (RDMA WRITE)
};

/// Settings of one engine. from_environment() reads the SOFTRDMA_KV_* parameters
/// (base/params.h; `softrdma params kv`).
struct EngineOptions {
  /// Verbs devices to use, by name; several make a multi-NIC engine: QP i to a peer uses
  /// local device i % devices and the peer's device i % its devices, so slices striped over
  /// the QPs spread over every device (docs/kv.md, "Devices"). Empty: `device` if set, else
  /// every device ibv_get_device_list returns whose `port` is ACTIVE.
  std::vector<std::string> devices;
  std::string device;  ///< shorthand for a one-device `devices`
  /// The names asked for: `devices`, else {device}, else empty (every active device).
  std::vector<std::string> device_list() const;
  uint8_t port = 1;                   ///< verbs port
  int gid_index = 0;                  ///< GID index (RoCE)
  uint32_t qps_per_peer = 2;          ///< RC QPs per peer (slices are striped over them)
  uint64_t slice_bytes = 256 * 1024;  ///< bytes per work request (the tail ≤ ¼ slice merges)
  uint32_t max_wr = 1024;             ///< slices outstanding per QP (at least; see below)
  /// Raise each QP's slices outstanding to cover the path's bandwidth-delay product: the
  /// RTT, the smallest of 5 zero-length RDMA WRITEs timed on QP 0 once connected, × the
  /// local port's rate (ibv_query_port), shared over the peer's QPs, in slices of
  /// slice_bytes — at least max_wr, at most 16,384 (each QP's send queue is made that deep, or
  /// as deep as the device's max_qp_wr allows) and as far as the device's CQ has entries
  /// left. false: max_wr on every path
  /// (SOFTRDMA_KV_MAX_WR_FROM_PATH=0). docs/kv.md, "Slices in flight".
  bool max_wr_from_path = true;
  /// READs in flight per QP, at most (further bounded by both devices' limits; the
  /// handshake carries each side's responder resources).
  uint32_t max_rd_atomic = 16;
  uint8_t ib_timeout = 14;  ///< ACK timeout exponent: 4.096 µs·2^x
  uint8_t retry_cnt = 7;    ///< retransmissions before a peer counts as dead
  /// Address the handshake listener binds and advertises; empty: the device's IPv4 address
  /// (RoCE GID), else 127.0.0.1.
  std::string host;
  std::chrono::microseconds spin{50};  ///< busy-poll of the progress thread after activity
  /// Busy-poll for as long as READs/WRITEs are outstanding (else: `spin` after each
  /// completion, then sleep on the completion channels).
  bool poll_while_busy = true;
  std::chrono::milliseconds connect_timeout{10000};  ///< bound on one handshake

  /// The SOFTRDMA_KV_* variables over the defaults above; throws std::invalid_argument
  /// naming the variable on a malformed value.
  static EngineOptions from_environment();
};

/// One registered local memory region, as published to peers.
struct Segment {
  std::string name;      ///< unique within the engine
  uint64_t addr = 0;     ///< virtual address of its first byte (in the owner's process)
  uint64_t length = 0;   ///< bytes
  std::string location;  ///< a tag such as "cpu:0" or "cuda:1" (Mooncake's location)
};

/// A peer's segment opened for transfers (open_segment). 0 is never a valid handle.
using SegmentHandle = uint64_t;
/// A batch of transfers (allocate_batch). 0 is never a valid id.
using BatchId = uint64_t;

/// One transfer of a batch. `local` must lie in memory registered with this engine;
/// [offset, offset + length) must lie in the target segment; length ≥ 1.
struct TransferRequest {
  Opcode opcode = Opcode::kWrite;
  void* local = nullptr;     ///< source (kWrite) or destination (kRead) in this process
  SegmentHandle target = 0;  ///< the peer's segment
  uint64_t offset = 0;       ///< bytes from the start of the target segment
  uint64_t length = 0;       ///< bytes
};

/// Where a batch stands (Mooncake's WAITING / COMPLETED / FAILED).
enum class BatchState : uint8_t {
  kPending,    ///< work submitted and not all of it finished (or nothing submitted yet)
  kCompleted,  ///< every byte of every submitted transfer landed
  kFailed,     ///< at least one transfer failed; nothing is in flight any more
};

/// get_status()'s answer.
struct BatchStatus {
  BatchState state = BatchState::kPending;
  uint64_t bytes_done = 0;   ///< bytes of the submitted transfers that completed
  uint64_t bytes_total = 0;  ///< bytes submitted so far
  size_t transfers = 0;      ///< transfers submitted so far
  std::string error;         ///< kFailed: the first failure, naming the peer
  std::string peer;          ///< kFailed: the peer of the first failure
};

/// Called once when a batch reaches kCompleted or kFailed, on the engine's progress thread
/// (or at once by on_complete() if it already has). Keep it short; it may call the engine.
using BatchCallback = std::function<void(BatchId, const BatchStatus&)>;

/// A message a peer sent with notify() or submit_transfer(…, notify), in the order the peer
/// posted them (NIXL genNotif / getNotifs). A notification that follows a batch is sent only
/// after every transfer of the batch completed, so it means the data has landed.
struct Notification {
  std::string peer;     ///< the sending engine's name
  std::string message;  ///< its bytes, at most Engine::kMaxNotifyBytes
};

/// One RC QP of a connection to a peer, as `Engine::peer_qps` reports it (like a line of
/// `rdma resource show qp`).
struct PeerQp {
  std::string device;          ///< local verbs device ("srdma0")
  uint32_t qpn = 0;            ///< local QP number
  uint32_t remote_qpn = 0;     ///< the peer's QP number
  uint32_t path_mtu = 0;       ///< bytes (256 … 4096): the smaller of both ports' MTUs
  uint32_t max_rd_atomic = 0;  ///< READs/atomics this QP may have in flight (IBTA vol 1, 9.5)
  /// Data slices it may have outstanding now (EngineOptions::max_wr, raised by the path).
  uint32_t window = 0;
  /// The connection's RTT as the path probes measured it: 0 until all of them completed and
  /// the windows were set from it, and with max_wr_from_path off.
  std::chrono::nanoseconds path_rtt{0};
};

class Engine {
 public:
  /// Bytes a notification may carry.
  static constexpr size_t kMaxNotifyBytes = 1000;

  /// Opens the verbs device(s) (EngineOptions::device_list()), starts the progress thread
  /// and the handshake listener and
  /// publishes this engine under `name` in `store` (key "softrdma-kv/<name>"). `name`: 1–64
  /// characters of [A-Za-z0-9._:-], unique among the engines sharing the store.
  /// A record already under `name` (a crashed engine's) is replaced, as in Mooncake.
  /// Throws std::invalid_argument on a bad name or options, KvError when a device (named in
  /// the message: one that does not exist, or fails to open) or the listener cannot be opened,
  /// std::runtime_error when the store cannot be reached.
  Engine(std::string name, std::shared_ptr<MetadataStore> store,
         const EngineOptions& options = EngineOptions::from_environment());
  /// Lingers until the send work requests already posted to connected peers (notifications
  /// included) have completed — so a notify() right before destruction reaches its peer,
  /// as an RC SEND does once acknowledged — bounded by the time a dead peer takes to be
  /// declared dead ((retry_cnt + 1) × 4.096 µs·2^ib_timeout, at most connect_timeout);
  /// then removes the record, stops the threads, destroys QPs and deregisters everything.
  /// Transfers still in flight after that are abandoned (their batches are not reported).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const std::string& name() const;
  const EngineOptions& options() const;
  /// "127.0.0.3" (the first device's GID as an address) — for messages and docs.
  const std::string& device_address() const;
  /// The devices the engine opened, in order ("srdma0", "srdma1").
  const std::vector<std::string>& devices() const;

  // ---- memory -----------------------------------------------------------------------------

  /// Registers [addr, addr + length) for local and remote READ/WRITE and publishes it as
  /// segment `name` (empty: "seg<N>"). Registering the same range again returns the same
  /// segment and counts a reference (the registration cache); a different range under a
  /// taken name, a zero length or a null address throw std::invalid_argument. The range is
  /// registered on every device of the engine (one rkey each, all published); a failed
  /// ibv_reg_mr on any device throws KvError naming that device and leaves nothing
  /// registered on any.
  Segment register_memory(void* addr, size_t length, std::string_view location = "cpu:0",
                          std::string_view name = {});
  /// Drops one reference to segment `name`; the last one deregisters it and withdraws it
  /// from the metadata. Throws std::invalid_argument for an unknown name or while a
  /// submitted transfer still uses it.
  void deregister_memory(std::string_view name);
  /// This engine's segments.
  std::vector<Segment> segments() const;

  // ---- peers ------------------------------------------------------------------------------

  /// Looks `segment` up in `peer`'s published metadata and connects to the peer (the
  /// handshake) if not yet connected. Reads the metadata afresh each call, so a segment the
  /// peer registered again is seen with its new key. Throws KvError naming the peer when it
  /// is not in the store, has no such segment, or does not answer the handshake.
  SegmentHandle open_segment(std::string_view peer, std::string_view segment);
  /// The segment an open handle refers to (as published by the peer).
  Segment segment_info(SegmentHandle handle) const;
  /// Forgets a handle; transfers already submitted are not affected.
  void close_segment(SegmentHandle handle);

  // ---- batches ----------------------------------------------------------------------------

  /// A new batch that can take up to `capacity` transfers (≥ 1).
  BatchId allocate_batch(size_t capacity);
  /// Validates every request first (unknown handle or batch, out-of-bounds range, local
  /// memory not registered, capacity exceeded → std::invalid_argument; nothing is submitted
  /// then), then slices and posts them. A non-empty `notify` (≤ kMaxNotifyBytes) is sent to
  /// the batch's peer after all of the batch's transfers completed successfully; a batch
  /// with a notification must target one peer. Throws KvError if a peer cannot be reached.
  void submit_transfer(BatchId batch, std::span<const TransferRequest> requests,
                       std::string_view notify = {});
  /// Where the batch stands (non-blocking). Unknown id: std::invalid_argument.
  BatchStatus get_status(BatchId batch) const;
  /// Runs `callback` when the batch finishes (at once, on this thread, if it already has).
  void on_complete(BatchId batch, BatchCallback callback);
  /// Blocks until the batch finishes or `timeout` passes; returns its status (kPending on
  /// timeout).
  BatchStatus wait(BatchId batch, std::chrono::milliseconds timeout);
  /// Releases a finished batch; std::invalid_argument while it is kPending with work.
  void free_batch(BatchId batch);

  // ---- notifications ----------------------------------------------------------------------

  /// Sends `message` to `peer` (connecting first if needed), after the notifications posted
  /// before it. Throws std::invalid_argument when longer than kMaxNotifyBytes, KvError when
  /// the peer cannot be reached.
  void notify(std::string_view peer, std::string_view message);
  /// Every notification received since the last call, in arrival order (per peer: in the
  /// order the peer posted them).
  std::vector<Notification> get_notifications();
  /// The oldest notification not yet taken, waiting up to `timeout`; nullopt on timeout.
  std::optional<Notification> wait_notification(std::chrono::milliseconds timeout);
  /// Probes `peer` with a zero-length RDMA WRITE and waits for its ACK. Throws KvError naming
  /// the peer if it is not connected or does not answer within the RC retry bound.
  void check_peer(std::string_view peer);
  /// For a wait on a message from `peer`: probes it when connected (check_peer), and throws
  /// KvError naming it and why when its last established connection failed (it died,
  /// restarted or stopped answering within the RC retry bound) and no new one replaced it.
  /// A peer never connected, or connecting, passes: it may still be starting. Call it every
  /// ~200 ms while waiting; a dead peer then ends the wait within about the retry bound.
  void watch_peer(std::string_view peer);
  /// Whether this engine has a working connection to `peer`.
  bool connected(std::string_view peer) const;
  /// The QPs of this engine's working connection to `peer`, in stripe order, as the verbs
  /// report them (ibv_query_qp); empty when not connected.
  std::vector<PeerQp> peer_qps(std::string_view peer) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace softrdma::kv
