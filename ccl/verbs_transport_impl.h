// VerbsTransport's state (internal to ccl/): the device, the per-peer QPs with their control
// rings and queues, and the requests in flight. Its member functions live one concept per
// file, as Gloo's ibverbs transport (device / pair / buffer) and NCCL's net_ib do:
//
//   verbs_setup.cpp        open the device, create CQ, control memory and QPs; exchange
//                          connection details; INIT → RTR → RTS; teardown; environment
//   verbs_credit_ring.cpp  posting on the control ring and send queue: receives, control
//                          sends, RDMA WRITE pieces, the outbound queue and its credits
//   verbs_matching.cpp     send/recv requests: adverts matched to sends by tag, transfer
//                          ids matched to recvs, transfers to self
//   verbs_completions.cpp  polling the CQ and dispatching each completion and control message
//   verbs_liveness.cpp     failures, aborts, goodbyes, probes and stall detection
//   verbs_waiting.cpp      blocking (spin, naps, channel sleeps), wait/test/barrier, close
//   verbs_transport.cpp    the public VerbsTransport methods, forwarding here
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "ccl/verbs_control.h"
#include "ccl/verbs_path.h"
#include "ccl/verbs_transport.h"

namespace softrdma::ccl {
namespace verbs {

using Clock = clock::Steady;  // virtual under time dilation (base/clock.h)

/// strerror(e) as a string.
std::string errno_text(int e);
/// Throws std::runtime_error("VerbsTransport: <what>: <strerror(e)>").
[[noreturn]] void verbs_fail(const std::string& what, int e);

/// The device, its PD and everything that must outlive both the transport and any Buffer
/// registered with it.
struct DeviceRes {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ~DeviceRes() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
};

/// A Buffer registered as one MR (local and remote write). Keeps the device open.
class VerbsBuffer : public Buffer {
 public:
  VerbsBuffer(std::shared_ptr<DeviceRes> dev, const void* owner, void* data, size_t size,
              ibv_mr* mr)
      : dev_(std::move(dev)), owner_(owner), data_(data), size_(size), mr_(mr) {}
  ~VerbsBuffer() override {
    if (mr_) ibv_dereg_mr(mr_);
  }
  void* data() const override { return data_; }
  size_t size() const override { return size_; }
  /// The transport state that registered it.
  const void* owner() const { return owner_; }
  uint32_t lkey() const { return mr_ ? mr_->lkey : 0; }
  uint32_t rkey() const { return mr_ ? mr_->rkey : 0; }

 private:
  std::shared_ptr<DeviceRes> dev_;
  const void* owner_;
  void* data_;
  size_t size_;
  ibv_mr* mr_;
};

/// Where a recv wants its bytes: the receiver's buffer and the transfer id the write's
/// immediate must carry.
struct Advert {
  uint64_t addr;
  uint64_t length;
  uint32_t rkey;
  uint32_t id;
  uint32_t stripes;  ///< write it as this many stripes, stripe i on channel i
};

/// Something waiting for a send WR (and usually a credit): a control message or the data
/// write of a send request.
struct Outbound {
  bool is_write = false;
  bool is_eager = false;  ///< the eager transfer of send `req` (payload copied when posted)
  CtlMsg msg{};
  RequestId req = 0;
  Advert adv{};
  uint64_t offset = 0;    ///< write: bytes of the transfer already posted
  uint32_t stripe = 0;    ///< write: the stripe being posted (on channel `stripe`)
  bool credited = false;  ///< write: its control credit is spent (before the first piece)
};

/// One posted send or recv.
struct Request {
  bool is_send = false;
  int peer = 0;
  uint64_t tag = 0;
  char* addr = nullptr;
  size_t bytes = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  bool done = false;
  bool all_posted = false;    ///< send: the last write piece is posted
  int pieces_left = 0;        ///< send: posted write pieces not yet completed
  uint32_t stripes_left = 0;  ///< rendezvous recv: stripe immediates still to arrive
  Clock::time_point posted;
};

/// One RC QP to a peer and its free send-queue slots.
struct Channel {
  ibv_qp* qp = nullptr;
  int sq_free = kSqDepth;
  uint32_t psn = 0;  ///< this side's initial send PSN (exchanged at connect)
};

/// One remote rank: its QPs (channels), the control channel's credits and send slots, the
/// outbound queue, the matching tables and what liveness knows about it.
struct Peer {
  int rank = 0;
  std::string desc;
  /// ch[0]: the control channel (control ring, eager transfers, probes, unstriped writes);
  /// ch[1..]: stripes of rendezvous writes only. After connect, as many as the smaller of
  /// both ranks' VerbsOptions::channels; empty for this rank itself.
  std::vector<Channel> ch;
  CreditRing credit;
  std::vector<uint32_t> free_slots;  ///< control send slots not in use
  std::deque<Outbound> outq;
  std::unordered_map<uint64_t, std::deque<Advert>> adverts;           ///< by tag, unmatched
  std::unordered_map<uint64_t, std::deque<RequestId>> sends_waiting;  ///< by tag, no advert yet
  uint32_t next_id = 0;
  std::unordered_map<uint32_t, RequestId> recvs;  ///< by transfer id (advertised)
  /// Largest transfer sent eagerly to / expected eagerly from this peer: the smaller of
  /// both ranks' VerbsOptions::eager_bytes (exchanged at connect), bytes.
  size_t eager_max = 0;
  std::unordered_map<uint64_t, std::deque<RequestId>> eager_recvs;  ///< by tag, posted
  /// Eager transfers that arrived before their recv, by tag (their credits not returned).
  std::unordered_map<uint64_t, std::deque<std::vector<char>>> unexpected;
  std::set<std::pair<uint64_t, uint32_t>> barrier_in;  ///< (seq, round) received
  Clock::time_point last_heard;
  Clock::time_point last_probe;
  bool probe_outstanding = false;
  /// The path to it (verbs_path.h): the smallest RTT of the connect-time probes (0 until
  /// one completed), and the probe in flight.
  std::chrono::nanoseconds path_rtt{0};
  Clock::time_point path_probe_sent;
  bool path_probe_pending = false;
  bool closed = false;  ///< it said goodbye
  bool dead = false;    ///< an error completion was seen on its QP
  int pending = 0;      ///< its send/recv requests not yet complete

  /// Whether this is a remote peer whose QPs exist (not self, not torn down).
  bool connected() const { return !ch.empty() && ch[0].qp; }
  /// Whether every channel's send queue is empty (all posted WRs completed).
  bool send_queues_idle() const {
    for (const Channel& c : ch)
      if (c.qp && c.sq_free < kSqDepth) return false;
    return true;
  }
};

}  // namespace verbs

struct VerbsTransport::Impl {
  using Clock = verbs::Clock;

  VerbsOptions opt;
  int rank = 0;
  int size = 1;
  std::shared_ptr<verbs::DeviceRes> dev;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  uint8_t link_layer = IBV_LINK_LAYER_ETHERNET;
  uint8_t active_mtu = IBV_MTU_1024;
  uint16_t lid = 0;
  ibv_gid gid{};
  uint64_t max_piece = uint64_t{1} << 30;
  uint64_t port_bits = 0;  ///< the port's data rate, bits/s (0: unknown)
  std::string my_addr;

  // Control memory: kRing receive slots and kSqDepth send slots per peer, each slot_bytes
  // (a descriptor plus the eager payload).
  size_t slot_bytes = verbs::kCtlBytes;
  std::vector<uint64_t> ring;  // uint64_t: slots stay 8-byte aligned for CtlMsg
  std::vector<uint64_t> send_slots;
  /// Ring slot `slot` of peer `p` / send slot `slot` of peer `p`.
  char* ring_slot(int p, uint32_t slot) {
    return reinterpret_cast<char*>(ring.data()) +
           (static_cast<size_t>(p) * verbs::kRing + slot) * slot_bytes;
  }
  char* send_slot(int p, uint32_t slot) {
    return reinterpret_cast<char*>(send_slots.data()) +
           (static_cast<size_t>(p) * verbs::kSqDepth + slot) * slot_bytes;
  }
  ibv_mr* ring_mr = nullptr;
  ibv_mr* slots_mr = nullptr;

  std::vector<verbs::Peer> peers;
  std::unordered_map<RequestId, verbs::Request> reqs;
  RequestId next_req = 1;
  uint64_t barrier_seq = 0;

  // Transfers to self: matched in this process with memcpy.
  std::unordered_map<uint64_t, std::deque<RequestId>> self_sends, self_recvs;

  // First failure seen; every later call rethrows it.
  bool failed = false;
  bool drain_pending = false;  // aborts posted, not yet waited for
  int fail_peer = -1;
  std::string fail_reason;
  std::chrono::milliseconds probe_interval{1000};

  ~Impl() { teardown(); }

  // ---- setup (verbs_setup.cpp) --------------------------------------------------------
  /// Opens the device and creates everything up to QPs in INIT with their rings posted.
  void open(const VerbsOptions& o, int r, int n);
  /// This rank's connection details for the bootstrap exchange (header + one QP per rank).
  std::string local_info() const;
  /// Validates every rank's details, then moves each QP to RTR and RTS.
  void connect_peers(const std::vector<std::string>& all);
  /// Destroys QPs, CQ, channel and control MRs (completion events are acknowledged as read).
  void teardown();

  // ---- the path to each peer (verbs_path.cpp) -----------------------------------------
  /// Times kPathProbes rounds of one zero-length RDMA WRITE per peer (after connect, all
  /// QPs ready); each peer's path_rtt is the smallest. Bounded by opt.timeout per round.
  void measure_paths();
  /// port_bits × the peer's path_rtt ÷ 8; 0 when either is unknown, and for self.
  uint64_t path_bytes(int peer) const;

  // ---- posting (verbs_credit_ring.cpp) ------------------------------------------------
  /// Posts ring slot `slot` of peer `p` as a receive.
  void post_recv(int p, uint32_t slot);
  /// Posts a zero-length receive on data channel `c` (≥ 1) of peer `p`, for one stripe's
  /// immediate.
  void post_data_recv(int p, int c);
  /// Posts a control message now, piggybacking the owed credits, with `bytes` of `payload`
  /// behind the descriptor (an eager transfer; bytes ≤ the slot's room); the caller checked
  /// sq_free (and the credits when `credited`). False when the post failed (peer failed).
  bool post_ctl(verbs::Peer& P, verbs::CtlMsg m, bool credited, const char* payload = nullptr,
                size_t bytes = 0);
  /// Posts the next piece of a send's data on the current stripe's channel (the stripe's last
  /// piece carries the immediate); true when it was the transfer's last piece.
  bool post_write_piece(verbs::Peer& P, verbs::Outbound& o, verbs::Request& r);
  /// Posts what the send queues allow of the write `o` (spending its credit first); true
  /// when all of it is posted.
  bool post_write(verbs::Peer& P, verbs::Outbound& o);
  /// Posts what the send queue and the credits allow, in order; then returns credits if
  /// many are owed.
  void flush(verbs::Peer& P);
  /// Queues a credited control message and flushes.
  void enqueue_ctl(verbs::Peer& P, const verbs::CtlMsg& m);
  /// Queues the data write of send `id` into `adv` and flushes (a size mismatch fails).
  void start_write(verbs::Peer& P, RequestId id, const verbs::Advert& adv);
  /// Posts the eager transfer of send `r` (descriptor + payload copied into a send slot;
  /// the send is complete once posted); the caller checked sq_free and the credits.
  void post_eager(verbs::Peer& P, verbs::Request& r);

  // ---- requests and matching (verbs_matching.cpp) -------------------------------------
  const verbs::VerbsBuffer& check_buffer(const Buffer& buf, size_t offset, size_t bytes,
                                         const char* what) const;
  void check_peer(int peer, const char* what) const;
  RequestId new_request(bool is_send, int peer, const verbs::VerbsBuffer& vb, size_t offset,
                        size_t bytes, uint64_t tag);
  /// Completes matched pairs of self transfers with `tag` (memmove).
  void match_self(uint64_t tag);
  /// What send() and recv() share: checks, back-pressure, the request record (counted in
  /// the peer's pending), and matching a transfer to self at once. Returns the peer to start
  /// the transfer with, or null when nothing more is to do (self, or after a failure, which
  /// wait()/test() report).
  verbs::Peer* begin_request(bool is_send, int peer, const Buffer& buf, size_t offset, size_t bytes,
                             uint64_t tag, RequestId& id);
  RequestId send(int peer, const Buffer& buf, size_t offset, size_t bytes, uint64_t tag);
  RequestId recv(int peer, Buffer& buf, size_t offset, size_t bytes, uint64_t tag);
  /// An advert arrived: start the oldest waiting send of its tag, or keep it.
  void on_advert(verbs::Peer& P, const verbs::Advert& a, uint64_t tag);
  /// A stripe's write with immediate of transfer `id` landed: complete its recv after the
  /// last stripe (returning the transfer's one credit then).
  void on_data(verbs::Peer& P, uint32_t id);
  /// An eager transfer of `bytes` at `data` arrived with `tag`: complete the oldest eager
  /// recv of that tag, or keep a copy until one is posted.
  void on_eager(verbs::Peer& P, uint64_t tag, const char* data, size_t bytes);
  /// Fails the transfer pair (send of `sent` bytes, recv of `wanted`, same tag).
  void size_mismatch(verbs::Peer& P, uint64_t tag, size_t sent, size_t wanted);
  verbs::Request& find(RequestId id, const char* what);

  // ---- completions (verbs_completions.cpp) --------------------------------------------
  /// One ibv_poll_cq of up to kPollBatch completions, each handled; then flushes peers
  /// whose queue or owed credits wait. Returns the number of completions.
  int poll_once();
  void handle(const ibv_wc& wc);
  void handle_recv(verbs::Peer& P, uint32_t slot, const ibv_wc& wc);
  /// A receive completed on data channel `c` (≥ 1): a stripe's immediate.
  void handle_data_recv(verbs::Peer& P, int c, const ibv_wc& wc);

  // ---- liveness (verbs_liveness.cpp) --------------------------------------------------
  /// A failure this rank observed itself: remember it and tell every other peer (and the
  /// peer at fault too when it is alive: `tell_peer`, e.g. a size mismatch or a stall).
  void local_failure(int peer, const std::string& reason, bool tell_peer = false);
  /// Marks `p` dead and records the failure.
  void peer_failed(int p, const std::string& reason);
  /// A peer's abort message: adopt the failure it reports.
  void on_abort(verbs::Peer& P, verbs::CtlMsg& m);
  /// A peer's goodbye: fine unless transfers with it are still pending.
  void on_bye(verbs::Peer& P);
  std::string describe_failure(const char* op) const;
  /// Throws the recorded failure (after a bounded drain of the aborts, the first time).
  void check_failure(const char* op);
  bool all_sends_done() const;
  /// Posts a signaled zero-length RDMA WRITE on P's channel 0 (Kind::kProbe, wr_id index
  /// `index`: 0 liveness, kPathProbeIndex path); false, with the peer failed, when the post
  /// failed (`what` names it in the error).
  bool post_zero_write(verbs::Peer& P, uint64_t index, const char* what);
  /// Posts a zero-length RDMA WRITE to learn whether the peer is still there.
  void post_probe(verbs::Peer& P, Clock::time_point now);
  /// Probes every live peer silent for probe_interval.
  void maybe_probe(Clock::time_point now);
  /// Fails `peer` when nothing was heard from it since max(since, last message) for the
  /// timeout.
  void check_stall(int peer, Clock::time_point since, Clock::time_point now);

  // ---- waiting (verbs_waiting.cpp) ----------------------------------------------------
  /// Sleeps until a completion event or `max_wait`.
  void sleep_on_channel(std::chrono::microseconds max_wait);
  /// Progresses until done() holds (true) or a failure is recorded (false); a stall of
  /// `peer` (see check_stall) is a failure.
  bool progress_until(const std::function<bool()>& done, int peer, Clock::time_point since);
  /// progress_until, raising PeerError on failure.
  void block(const char* op, const std::function<bool()>& done, int peer, Clock::time_point since);
  /// Whether P's queues take one more entry (and, for `new_request`, one more request): see
  /// kMaxRequestsPerPeer.
  bool has_room(const verbs::Peer& P, bool new_request) const;
  /// Back-pressure: progresses until has_room(P, new_request). A failure on the way is left
  /// recorded for the caller's next check (wait()/test() report it naming the collective).
  void wait_for_room(verbs::Peer& P, bool new_request);
  void wait(RequestId id, const char* op);
  bool test(RequestId id, const char* op);
  void barrier(const char* op);
  /// Goodbye to every peer still there, then wait (bounded) for everything posted.
  void close();
};

}  // namespace softrdma::ccl
