// VerbsTransport: the Transport of ccl/transport.h over RC queue pairs, written against
// plain libibverbs (<infiniband/verbs.h>) only — it runs over softrdma's drop-in
// libibverbs.so.1 and over RDMA NICs with the system library alike.
//
// Shape
//  - Full mesh: `channels` RC QPs per peer (VerbsOptions::channels, SOFTRDMA_CCL_CHANNELS,
//    default 1; each pair uses the smaller of its two ranks' values), all on one CQ (with a
//    completion channel for blocking). Channel 0 carries everything below; channels 1.. only
//    stripes of rendezvous writes.
//  - Control channel per peer: SEND/RECV of 128-byte descriptors (plus, in each slot, room
//    for an eager payload) into a ring of R receives posted per QP. Credit-based flow
//    control keeps the ring from ever running dry, so no RNR NAK is ever needed: of the R
//    slots, C are "credited" (adverts, eager transfers, barrier messages and the data writes
//    below each use one credit; the receiver returns credits as it reposts,
//    piggybacked on its own control messages or in a credit message once C/4 are owed) and
//    the rest are reserved for the uncredited credit / abort / goodbye messages (at most
//    C/(C/4) credit messages can be unprocessed at a time, plus one abort and one goodbye).
//  - Eager path (transfers of at most eager_bytes, default 8 KiB, SOFTRDMA_CCL_EAGER_BYTES;
//    each pair uses the smaller of its two ranks' values): send() copies the payload behind
//    a descriptor {tag, length} into a send slot and SENDs it — one one-way trip, and the
//    send is complete once posted. The receiver copies it into the matching recv (same tag,
//    FIFO) or, when none is posted yet, keeps a copy and returns that slot's credit only
//    when a recv takes it, so at most C transfers run ahead of the receiver (MPI's eager
//    protocol with credit-based flow control). A size mismatch is found by the receiver
//    (or by a sender that already holds the receiver's advert) and fails both ranks.
//  - Data path above the eager limit (rendezvous, receiver-driven): recv() sends an advert
//    {addr, rkey, length, tag, id, stripes} to the sender; send() waits for the matching advert
//    (same tag, FIFO per tag) and RDMA WRITEs WITH IMMEDIATE straight into the receiver's buffer,
//    the immediate carrying the advert's id; the receiver's recv completes on the
//    IBV_WC_RECV_RDMA_WITH_IMM completion (which also uses one ring slot — hence one
//    credit). Messages longer than the port's max_msg_sz go as several writes, the last
//    one with the immediate. Zero-byte transfers are zero-length writes with immediate.
//  - Channels (NCCL's channels, so one busy QP does not serialise a large transfer): the
//    advert also says into how many stripes k to split the transfer, k = min(channels,
//    bytes / channel_min_bytes) (SOFTRDMA_CCL_CHANNEL_MIN_BYTES, default 64 KiB), decided
//    by the receiver. The sender writes stripe i (contiguous, 4 KiB-aligned boundaries,
//    verbs::stripe_range) on QP i, each stripe ending in its own WRITE WITH IMMEDIATE
//    carrying the advert's id; RC orders nothing across QPs, so the receiver counts the
//    immediates and completes the recv at the k-th. Each immediate uses a receive WQE of
//    its own QP (data channels keep kCredits zero-length receives posted, reposted as they
//    complete), and the transfer still spends one control credit, returned once all k
//    stripes arrived — so no channel's receive queue can run dry (verbs_control.h).
//  - Progress: the caller's thread only (no threads of our own): wait()/test()/barrier()
//    poll the CQ: busy-polling for SOFTRDMA_CCL_SPIN_US (default 50 µs), then napping
//    SOFTRDMA_CCL_NAP_US (20 µs) at a time on the completion channel between polls, and
//    after 20 ms without completions sleeping on the channel in slices of at most 10 ms.
//    Over softrdma, a rank that busy-polls receives its packets inline on its own thread;
//    the provider's progress thread sleeps in epoll and takes the socket back (then writes
//    the channel on each completion) once nobody has polled for 50 µs. So while a rank
//    naps, a message that arrives waits at most about that window plus a nap rather than a
//    full sleep, and the CPU stays free for other ranks sharing it; on a NIC the channel
//    event comes from the device itself.
//  - Back-pressure: at most kMaxRequestsPerPeer (512) sends and recvs in flight per peer
//    and an outbound queue bounded accordingly; a send()/recv()/barrier() that finds them
//    full progresses until there is room (verbs_control.h). Collectives never reach it.
//  - Path: at connect each peer's RTT is timed with kPathProbes zero-length RDMA WRITEs (the
//    smallest counts); × the port's rate it is path_bytes(), from which the collectives size
//    their window of chunks in flight (Config::depth_from_path; verbs_path.h).
//  - Failure detection: an error completion on any of a peer's QPs (e.g. IBV_WC_RETRY_EXC_ERR after
//  retry_cnt
//    retransmissions of timeout 4.096 µs·2^SOFTRDMA_CCL_IB_TIMEOUT each, ~0.5 s with the
//    defaults 14 / 7) marks the peer dead. While blocked, every probe interval
//    (timeout/8, clamped to 50..1000 ms) of silence, a zero-length RDMA WRITE goes to each
//    peer: a dead peer fails it with an error completion, so a rank that only waits for a
//    dead peer learns it too. A request whose peer made no progress for timeout() raises
//    PeerError ("no progress within N ms"). The first failure a rank sees is reported to all
//    other peers in an abort message, so every rank names the same dead peer. A rank that
//    closes its transport says goodbye first, so its peers do not mistake the exit for a
//    death.
//
// Threading: not thread-safe; one thread per transport (the Transport contract).
// Implementation: one concept per file, listed in verbs_transport_impl.h.
// Environment: SOFTRDMA_CCL_TIMEOUT_MS (default 30000), SOFTRDMA_CCL_IB_DEVICE (default: the
// first device), SOFTRDMA_CCL_IB_PORT (1), SOFTRDMA_CCL_IB_GID_INDEX (0),
// SOFTRDMA_CCL_IB_TIMEOUT (14), SOFTRDMA_CCL_IB_RETRY_CNT (7), SOFTRDMA_CCL_SPIN_US (50),
// SOFTRDMA_CCL_NAP_US (20),
// SOFTRDMA_CCL_IB_MAX_WRITE (bytes per RDMA WRITE; default the port's max_msg_sz ≤ 1 GiB),
// SOFTRDMA_CCL_EAGER_BYTES (8192; 0 turns the eager path off, at most 65536),
// SOFTRDMA_CCL_CHANNELS (1, at most 16), SOFTRDMA_CCL_CHANNEL_MIN_BYTES (65536, at least
// 4096).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ccl/bootstrap.h"
#include "ccl/transport.h"

namespace softrdma::ccl {

/// Settings of a VerbsTransport.
struct VerbsOptions {
  std::string device;                        ///< verbs device name; empty: the first one
  uint8_t port = 1;                          ///< port number
  int gid_index = 0;                         ///< GID table index (RoCE); softrdma has only 0
  std::chrono::milliseconds timeout{30000};  ///< stall timeout (Transport::timeout())
  uint8_t ib_timeout = 14;  ///< QP local ACK timeout exponent: 4.096 µs · 2^x per retry
  uint8_t retry_cnt = 7;    ///< QP retransmissions before IBV_WC_RETRY_EXC_ERR (0..7)
  std::chrono::microseconds spin{50};  ///< busy-poll before napping
  std::chrono::microseconds nap{20};   ///< nap length while waiting (see the file comment)
  /// Bytes per RDMA WRITE; longer transfers go as several writes. 0: the port's max_msg_sz,
  /// at most 1 GiB.
  uint64_t max_write = 0;
  /// Transfers of at most this many bytes go eagerly: the payload travels in the control
  /// SEND into a receive slot posted in advance — one one-way trip instead of the
  /// rendezvous round (advert, then RDMA WRITE). Each pair of ranks uses the smaller of
  /// their two values; 0 turns eager off. At most verbs::kMaxEagerBytes (64 KiB).
  size_t eager_bytes = 8192;
  /// RC QPs per peer (NCCL's channels), 1..verbs::kMaxChannels (16). A rendezvous transfer
  /// of `bytes` is written as k = min(channels, bytes / channel_min_bytes) contiguous
  /// stripes, stripe i on QP i with its own WRITE WITH IMMEDIATE, so one busy QP does not
  /// serialise a large transfer. Each pair of ranks uses the smaller of their two values.
  int channels = 1;
  /// Smallest stripe, bytes (≥ 4096): transfers below 2 × this go on one QP.
  size_t channel_min_bytes = 64 * 1024;
  /// The defaults overridden by SOFTRDMA_CCL_IB_DEVICE, SOFTRDMA_CCL_IB_PORT,
  /// SOFTRDMA_CCL_IB_GID_INDEX, SOFTRDMA_CCL_TIMEOUT_MS, SOFTRDMA_CCL_IB_TIMEOUT,
  /// SOFTRDMA_CCL_IB_RETRY_CNT, SOFTRDMA_CCL_SPIN_US, SOFTRDMA_CCL_NAP_US,
  /// SOFTRDMA_CCL_IB_MAX_WRITE, SOFTRDMA_CCL_EAGER_BYTES, SOFTRDMA_CCL_CHANNELS,
  /// SOFTRDMA_CCL_CHANNEL_MIN_BYTES. Throws std::invalid_argument on a
  /// malformed or out-of-range value.
  static VerbsOptions from_environment();
};

/// Transport over RC QPs (see the file comment). Created connected by connect(); rank(),
/// size(), send/recv/wait/test follow the Transport contract (ccl/transport.h).
class VerbsTransport : public Transport {
 public:
  /// Opens the device, creates options.channels RC QPs per peer, exchanges {GID, LID, MTU,
  /// eager limit, channel count, QPNs, PSNs} through `bootstrap` (collective: every rank of the
  /// bootstrap calls connect), connects the QPs and ends with a bootstrap barrier, so every QP is
  /// ready when it returns; then times each peer's round trip (path_bytes; kPathProbes zero-
  /// length RDMA WRITEs per peer, so connect takes about 3 RTTs more) and ends with a second
  /// barrier, so no rank leaves (and may close) before every rank has timed its paths.
  /// Throws std::runtime_error naming the verbs call that failed (no device, port down, …)
  /// (also for options out of range: eager_bytes, channels, channel_min_bytes; the other ranks
  /// then get BootstrapError naming this rank) and BootstrapError from the exchange.
  static std::unique_ptr<VerbsTransport> connect(Bootstrap& bootstrap, const VerbsOptions& options);
  /// Says goodbye to every peer and waits (bounded) until everything posted has completed,
  /// then destroys the QPs. Buffers from register_buffer() may outlive the transport.
  ~VerbsTransport() override;
  VerbsTransport(const VerbsTransport&) = delete;
  VerbsTransport& operator=(const VerbsTransport&) = delete;

  int rank() const override;
  int size() const override;
  /// "rank 3 (127.0.0.4)": the peer's IPv4 address (from its RoCE GID), IPv6 GID, or LID.
  std::string peer_description(int peer) const override;
  std::chrono::milliseconds timeout() const override;
  /// An MR with local write and remote write access. `data` may be null when bytes == 0.
  /// Throws std::runtime_error when ibv_reg_mr fails.
  std::unique_ptr<Buffer> register_buffer(void* data, size_t bytes) override;
  /// `buf` must come from this transport's register_buffer() (std::invalid_argument
  /// otherwise). Sends and recvs with equal (peer, tag) match in posting order. With 512
  /// requests (kMaxRequestsPerPeer) to and from `peer` in flight, posting first progresses
  /// until one completes; a failure met meanwhile is reported by the next wait()/test().
  RequestId send(int peer, const Buffer& buf, size_t offset, size_t bytes, uint64_t tag) override;
  RequestId recv(int peer, Buffer& buf, size_t offset, size_t bytes, uint64_t tag) override;
  void wait(RequestId id, const char* op) override;
  bool test(RequestId id, const char* op) override;
  /// Dissemination barrier over the control channel (ceil(log2 n) rounds).
  void barrier(const char* op) override;
  /// The peer's round-trip time, the smallest of kPathProbes zero-length RDMA WRITEs timed at
  /// connect (post to completion, which on RC means the ACK came back), × the local port's
  /// rate (ibv_query_port's active_speed × active_width) ÷ 8. 0 for self, when the port's
  /// rate is unknown, or when no probe completed (the peer then fails the first collective).
  uint64_t path_bytes(int peer) const override;

  /// This rank's device address ("127.0.0.2"), as peers see it.
  std::string local_address() const;
  /// The verbs device in use ("srdma0").
  std::string device_name() const;

  /// The QPs, CQ, control rings and request state (verbs_transport_impl.h).
  struct Impl;

 private:
  explicit VerbsTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace softrdma::ccl
