// VerbsTransport: see verbs_transport.h for the protocol (control ring with credits, adverts,
// RDMA WRITE WITH IMMEDIATE into the advertised buffer, probes, aborts, goodbyes).
#include "ccl/verbs_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace softrdma::ccl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

// Control ring per QP: kCredits credited slots plus reserved ones for uncredited messages.
constexpr int kCredits = 128;
// Owed credits that trigger a credit-only message (when nothing else carries them back).
constexpr int kCreditThreshold = kCredits / 4;
// Unprocessed credit messages from one peer are at most kCredits / kCreditThreshold (each
// returns at least kCreditThreshold of the peer's kCredits); plus one abort and one goodbye
// per peer lifetime, plus one spare.
constexpr int kReserved = kCredits / kCreditThreshold + 3;
constexpr int kRing = kCredits + kReserved;
// Send WRs per QP (every WR is signalled; a control send holds one send slot).
constexpr int kSqDepth = 128;
constexpr size_t kCtlBytes = 128;
// Completions taken per ibv_poll_cq call.
constexpr int kPollBatch = 32;

enum class Ctl : uint32_t { kAdvert = 1, kCredit = 2, kBarrier = 3, kAbort = 4, kBye = 5 };

// One control descriptor (SEND payload). Same-architecture peers: host byte order.
struct CtlMsg {
  uint32_t type;
  uint32_t credits;  // credited slots the sender reposted since its last report
  uint64_t tag;      // advert: tag
  uint64_t addr;     // advert: target address
  uint64_t length;   // advert: bytes
  uint32_t rkey;     // advert: target rkey
  uint32_t id;       // advert: transfer id (the immediate); barrier: round; abort: dead rank
  uint64_t seq;      // barrier: sequence number
  char text[80];     // abort: reason (NUL-terminated)
};
static_assert(sizeof(CtlMsg) == kCtlBytes);

// wr_id layout: kind (4 bits) | peer (20 bits) | index (40 bits).
enum class Kind : uint64_t { kRecv = 0, kCtl = 1, kWrite = 2, kProbe = 3 };
constexpr uint64_t make_wr_id(Kind k, int peer, uint64_t index) {
  return (static_cast<uint64_t>(k) << 60) | (static_cast<uint64_t>(peer) << 40) |
         (index & ((uint64_t{1} << 40) - 1));
}
constexpr Kind wr_kind(uint64_t wr_id) {
  return static_cast<Kind>(wr_id >> 60);
}
constexpr int wr_peer(uint64_t wr_id) {
  return static_cast<int>((wr_id >> 40) & 0xfffff);
}
constexpr uint64_t wr_index(uint64_t wr_id) {
  return wr_id & ((uint64_t{1} << 40) - 1);
}

// Connection details one rank publishes through the bootstrap (binary, same architecture).
struct WireHeader {
  uint32_t magic;  // 'SRCV'
  uint32_t version;
  uint8_t gid[16];
  uint16_t lid;
  uint8_t link_layer;  // IBV_LINK_LAYER_*
  uint8_t mtu;         // ibv_mtu
  uint32_t pid;
  char host[64];
};
struct WireQp {
  uint32_t qpn;
  uint32_t psn;
};
constexpr uint32_t kWireMagic = 0x53524356;
constexpr uint32_t kWireVersion = 1;
constexpr const char* kSetupFailed = "SETUP-FAILED:";

std::string errno_text(int e) {
  return std::string(std::strerror(e));
}

[[noreturn]] void verbs_fail(const std::string& what, int e) {
  throw std::runtime_error("VerbsTransport: " + what + ": " + errno_text(e));
}

long env_long(const char* name, long def, long lo, long hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi)
    throw std::invalid_argument(std::string(name) + ": expected an integer in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v +
                                "'");
  return x;
}

std::string gid_to_text(const uint8_t* g, uint8_t link_layer, uint16_t lid) {
  static const uint8_t kV4Prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char buf[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(g, kV4Prefix, 12) == 0) {
    inet_ntop(AF_INET, g + 12, buf, sizeof buf);
    return buf;
  }
  bool zero = std::all_of(g, g + 16, [](uint8_t b) { return b == 0; });
  if (zero || link_layer == IBV_LINK_LAYER_INFINIBAND) return "lid " + std::to_string(lid);
  inet_ntop(AF_INET6, g, buf, sizeof buf);
  return buf;
}

// The device, its PD and everything that must outlive both the transport and any Buffer
// registered with it.
struct DeviceRes {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ~DeviceRes() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
};

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

struct Advert {
  uint64_t addr;
  uint64_t length;
  uint32_t rkey;
  uint32_t id;
};

// Something waiting for a send WR (and usually a credit): a control message or the data
// write of a send request.
struct Outbound {
  bool is_write = false;
  CtlMsg msg{};
  RequestId req = 0;
  Advert adv{};
  uint64_t offset = 0;  // write: bytes already posted (pieces before the last)
};

struct Request {
  bool is_send = false;
  int peer = 0;
  uint64_t tag = 0;
  char* addr = nullptr;
  size_t bytes = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  bool done = false;
  bool all_posted = false;  // send: the last write piece is posted
  int pieces_left = 0;      // send: posted write pieces not yet completed
  Clock::time_point posted;
};

struct Peer {
  int rank = 0;
  std::string desc;
  ibv_qp* qp = nullptr;
  int credits = kCredits;
  int owed = 0;
  int sq_free = kSqDepth;
  std::vector<uint32_t> free_slots;
  std::deque<Outbound> outq;
  std::unordered_map<uint64_t, std::deque<Advert>> adverts;
  std::unordered_map<uint64_t, std::deque<RequestId>> sends_waiting;
  uint32_t next_id = 0;
  std::unordered_map<uint32_t, RequestId> recvs;
  std::set<std::pair<uint64_t, uint32_t>> barrier_in;
  Clock::time_point last_heard;
  Clock::time_point last_probe;
  bool probe_outstanding = false;
  bool closed = false;  // it said goodbye
  bool dead = false;    // an error completion was seen on its QP
  int pending = 0;      // its send/recv requests not yet complete
};

}  // namespace

struct VerbsTransport::Impl {
  VerbsOptions opt;
  int rank = 0;
  int size = 1;
  std::shared_ptr<DeviceRes> dev;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  uint8_t link_layer = IBV_LINK_LAYER_ETHERNET;
  uint8_t active_mtu = IBV_MTU_1024;
  uint16_t lid = 0;
  ibv_gid gid{};
  uint64_t max_piece = uint64_t{1} << 30;
  std::string my_addr;

  // Control memory: kRing receive slots and kSqDepth send slots per peer.
  std::vector<CtlMsg> ring;
  std::vector<CtlMsg> send_slots;
  ibv_mr* ring_mr = nullptr;
  ibv_mr* slots_mr = nullptr;

  std::vector<Peer> peers;
  std::vector<uint32_t> my_psn;
  std::unordered_map<RequestId, Request> reqs;
  RequestId next_req = 1;
  uint64_t barrier_seq = 0;

  // Transfers to self: matched in this process with memcpy.
  std::unordered_map<uint64_t, std::deque<RequestId>> self_sends, self_recvs;

  // First failure seen; every later call rethrows it.
  bool failed = false;
  bool drain_pending = false;  // aborts posted, not yet waited for
  int fail_peer = -1;
  std::string fail_reason;
  milliseconds probe_interval{1000};

  ~Impl() { teardown(); }

  // ---- setup -------------------------------------------------------------------------

  void open(const VerbsOptions& o, int r, int n) {
    opt = o;
    rank = r;
    size = n;
    probe_interval =
        std::clamp(milliseconds(opt.timeout.count() / 8), milliseconds(50), milliseconds(1000));
    dev = std::make_shared<DeviceRes>();
    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    if (!list) verbs_fail("ibv_get_device_list", errno);
    ibv_device* chosen = nullptr;
    for (int i = 0; i < num && !chosen; ++i)
      if (opt.device.empty() || opt.device == ibv_get_device_name(list[i])) chosen = list[i];
    if (!chosen) {
      ibv_free_device_list(list);
      throw std::runtime_error(opt.device.empty()
                                   ? std::string("VerbsTransport: no verbs device found")
                                   : "VerbsTransport: no verbs device named '" + opt.device + "'");
    }
    dev->ctx = ibv_open_device(chosen);
    int open_errno = errno;
    ibv_free_device_list(list);
    if (!dev->ctx) verbs_fail("ibv_open_device", open_errno);

    ibv_port_attr pa{};
    if (int e = ibv_query_port(dev->ctx, opt.port, &pa)) verbs_fail("ibv_query_port", e);
    if (pa.state != IBV_PORT_ACTIVE)
      throw std::runtime_error("VerbsTransport: port " + std::to_string(opt.port) +
                               " is not active");
    link_layer = pa.link_layer;
    active_mtu = pa.active_mtu;
    lid = pa.lid;
    if (pa.max_msg_sz) max_piece = std::min<uint64_t>(max_piece, pa.max_msg_sz);
    if (opt.max_write) max_piece = std::min<uint64_t>(max_piece, opt.max_write);
    if (int e = ibv_query_gid(dev->ctx, opt.port, opt.gid_index, &gid))
      verbs_fail("ibv_query_gid(index " + std::to_string(opt.gid_index) + ")", e);
    my_addr = gid_to_text(gid.raw, link_layer, lid);

    ibv_device_attr da{};
    if (int e = ibv_query_device(dev->ctx, &da)) verbs_fail("ibv_query_device", e);

    dev->pd = ibv_alloc_pd(dev->ctx);
    if (!dev->pd) verbs_fail("ibv_alloc_pd", errno);
    channel = ibv_create_comp_channel(dev->ctx);
    if (!channel) verbs_fail("ibv_create_comp_channel", errno);
    int fl = fcntl(channel->fd, F_GETFL);
    fcntl(channel->fd, F_SETFL, fl | O_NONBLOCK);
    int cqe = std::max(64, (size - 1) * (kSqDepth + kRing) + 64);
    if (da.max_cqe > 0) cqe = std::min(cqe, da.max_cqe);
    cq = ibv_create_cq(dev->ctx, cqe, nullptr, channel, 0);
    if (!cq) verbs_fail("ibv_create_cq(" + std::to_string(cqe) + ")", errno);

    const size_t npeers = static_cast<size_t>(size);
    ring.assign(npeers * kRing, CtlMsg{});
    send_slots.assign(npeers * kSqDepth, CtlMsg{});
    // An int, not the enum: rdma-core's ibv_reg_mr macro masks the access flags with an
    // enumerator of another enum type (a deprecated enum-enum operation in C++20).
    const int local_write = IBV_ACCESS_LOCAL_WRITE;
    ring_mr = ibv_reg_mr(dev->pd, ring.data(), ring.size() * kCtlBytes, local_write);
    if (!ring_mr) verbs_fail("ibv_reg_mr(control ring)", errno);
    slots_mr = ibv_reg_mr(dev->pd, send_slots.data(), send_slots.size() * kCtlBytes, local_write);
    if (!slots_mr) verbs_fail("ibv_reg_mr(control send slots)", errno);

    std::random_device rd;
    peers.resize(npeers);
    my_psn.assign(npeers, 0);
    for (int p = 0; p < size; ++p) {
      Peer& P = peers[p];
      P.rank = p;
      if (p == rank) continue;
      for (uint32_t s = 0; s < kSqDepth; ++s) P.free_slots.push_back(kSqDepth - 1 - s);
      ibv_qp_init_attr ia{};
      ia.send_cq = cq;
      ia.recv_cq = cq;
      ia.qp_type = IBV_QPT_RC;
      ia.cap.max_send_wr = kSqDepth;
      ia.cap.max_recv_wr = kRing;
      ia.cap.max_send_sge = 1;
      ia.cap.max_recv_sge = 1;
      P.qp = ibv_create_qp(dev->pd, &ia);
      if (!P.qp) verbs_fail("ibv_create_qp(for rank " + std::to_string(p) + ")", errno);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.pkey_index = 0;
      a.port_num = opt.port;
      a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
      if (int e = ibv_modify_qp(
              P.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        verbs_fail("ibv_modify_qp(INIT)", e);
      for (uint32_t s = 0; s < kRing; ++s) post_recv(p, s);
      my_psn[p] = rd() & 0xffffff;
    }
  }

  std::string local_info() const {
    WireHeader h{};
    h.magic = kWireMagic;
    h.version = kWireVersion;
    std::memcpy(h.gid, gid.raw, 16);
    h.lid = lid;
    h.link_layer = link_layer;
    h.mtu = active_mtu;
    h.pid = static_cast<uint32_t>(getpid());
    gethostname(h.host, sizeof h.host - 1);
    std::string out(reinterpret_cast<const char*>(&h), sizeof h);
    for (int p = 0; p < size; ++p) {
      WireQp q{peers[p].qp ? peers[p].qp->qp_num : 0, my_psn[p]};
      out.append(reinterpret_cast<const char*>(&q), sizeof q);
    }
    return out;
  }

  void connect_peers(const std::vector<std::string>& all) {
    // Validate everything first: a rank that failed its setup says so in its blob.
    for (int p = 0; p < size; ++p) {
      const std::string& b = all[p];
      if (b.rfind(kSetupFailed, 0) == 0)
        throw BootstrapError("VerbsTransport: rank " + std::to_string(p) +
                             " failed to set up: " + b.substr(std::strlen(kSetupFailed)));
      WireHeader h{};
      if (b.size() != sizeof(WireHeader) + size * sizeof(WireQp))
        throw BootstrapError("VerbsTransport: malformed connection info from rank " +
                             std::to_string(p));
      std::memcpy(&h, b.data(), sizeof h);
      if (h.magic != kWireMagic || h.version != kWireVersion)
        throw BootstrapError("VerbsTransport: rank " + std::to_string(p) +
                             " speaks another protocol version");
    }
    for (int p = 0; p < size; ++p) {
      const std::string& b = all[p];
      WireHeader h{};
      std::memcpy(&h, b.data(), sizeof h);
      Peer& P = peers[p];
      P.desc = "rank " + std::to_string(p) + " (" + gid_to_text(h.gid, h.link_layer, h.lid) + ")";
      if (p == rank) continue;
      WireQp q{};
      std::memcpy(&q, b.data() + sizeof h + rank * sizeof(WireQp), sizeof q);

      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RTR;
      a.path_mtu = static_cast<ibv_mtu>(std::min(active_mtu, h.mtu));
      a.dest_qp_num = q.qpn;
      a.rq_psn = q.psn;
      a.max_dest_rd_atomic = 1;
      a.min_rnr_timer = 12;
      a.ah_attr.port_num = opt.port;
      a.ah_attr.dlid = h.lid;
      bool roce = link_layer == IBV_LINK_LAYER_ETHERNET;
      if (roce || h.link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        std::memcpy(a.ah_attr.grh.dgid.raw, h.gid, 16);
        a.ah_attr.grh.sgid_index = static_cast<uint8_t>(opt.gid_index);
        a.ah_attr.grh.hop_limit = 64;
      }
      if (int e =
              ibv_modify_qp(P.qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        verbs_fail("ibv_modify_qp(RTR, " + P.desc + ")", e);
      ibv_qp_attr s{};
      s.qp_state = IBV_QPS_RTS;
      s.timeout = opt.ib_timeout;
      s.retry_cnt = opt.retry_cnt;
      s.rnr_retry = 7;
      s.sq_psn = my_psn[p];
      s.max_rd_atomic = 1;
      if (int e = ibv_modify_qp(P.qp, &s,
                                IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        verbs_fail("ibv_modify_qp(RTS, " + P.desc + ")", e);
      P.last_heard = P.last_probe = Clock::now();
    }
  }

  // Completion events are acknowledged as they are read, so the CQ can go at once.
  void teardown() {
    for (Peer& P : peers)
      if (P.qp) {
        ibv_destroy_qp(P.qp);
        P.qp = nullptr;
      }
    if (cq) ibv_destroy_cq(cq);
    cq = nullptr;
    if (channel) ibv_destroy_comp_channel(channel);
    channel = nullptr;
    if (ring_mr) ibv_dereg_mr(ring_mr);
    ring_mr = nullptr;
    if (slots_mr) ibv_dereg_mr(slots_mr);
    slots_mr = nullptr;
    dev.reset();
  }

  // ---- posting -----------------------------------------------------------------------

  void post_recv(int p, uint32_t slot) {
    ibv_sge sge{reinterpret_cast<uint64_t>(&ring[static_cast<size_t>(p) * kRing + slot]),
                static_cast<uint32_t>(kCtlBytes), ring_mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = make_wr_id(Kind::kRecv, p, slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int e = ibv_post_recv(peers[p].qp, &wr, &bad)) {
      if (!failed && !peers[p].dead && !peers[p].closed)
        peer_failed(p, "ibv_post_recv failed: " + errno_text(e));
    }
  }

  // Posts a control message now; the caller checked sq_free (and credits if credited).
  void post_ctl(Peer& P, CtlMsg m, bool credited) {
    uint32_t slot = P.free_slots.back();
    P.free_slots.pop_back();
    m.credits = static_cast<uint32_t>(P.owed);
    P.owed = 0;
    CtlMsg& buf = send_slots[static_cast<size_t>(P.rank) * kSqDepth + slot];
    buf = m;
    ibv_sge sge{reinterpret_cast<uint64_t>(&buf), static_cast<uint32_t>(kCtlBytes), slots_mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = make_wr_id(Kind::kCtl, P.rank, slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int e = ibv_post_send(P.qp, &wr, &bad)) {
      P.free_slots.push_back(slot);
      P.owed += static_cast<int>(m.credits);
      peer_failed(P.rank, "ibv_post_send failed: " + errno_text(e));
      return;
    }
    --P.sq_free;
    if (credited) --P.credits;
  }

  bool post_write_piece(Peer& P, Outbound& o, Request& r) {
    const uint64_t remaining = r.bytes - o.offset;
    const bool last = remaining <= max_piece;
    const uint64_t len = last ? remaining : max_piece;
    ibv_sge sge{reinterpret_cast<uint64_t>(r.addr + o.offset), static_cast<uint32_t>(len), r.lkey};
    ibv_send_wr wr{};
    wr.wr_id = make_wr_id(Kind::kWrite, P.rank, o.req);
    wr.sg_list = len ? &sge : nullptr;
    wr.num_sge = len ? 1 : 0;
    wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (last) wr.imm_data = htonl(o.adv.id);
    wr.wr.rdma.remote_addr = o.adv.addr + o.offset;
    wr.wr.rdma.rkey = o.adv.rkey;
    ibv_send_wr* bad = nullptr;
    if (int e = ibv_post_send(P.qp, &wr, &bad)) {
      peer_failed(P.rank, "ibv_post_send(RDMA WRITE) failed: " + errno_text(e));
      return false;
    }
    --P.sq_free;
    ++r.pieces_left;
    if (last) {
      --P.credits;
      r.all_posted = true;
    } else {
      o.offset += len;
    }
    return last;
  }

  // Posts what the send queue and the credits allow, in order; then returns credits if
  // many are owed.
  void flush(Peer& P) {
    if (!P.qp || P.dead || failed) return;
    while (!P.outq.empty()) {
      Outbound& o = P.outq.front();
      if (o.is_write) {
        auto it = reqs.find(o.req);
        if (it == reqs.end()) {  // cannot happen: sends are not erased before completion
          P.outq.pop_front();
          continue;
        }
        bool finished = false;
        while (P.sq_free > 0 && !P.dead) {
          const bool last = it->second.bytes - o.offset <= max_piece;
          if (last && P.credits < 1) break;
          if (post_write_piece(P, o, it->second)) {
            finished = true;
            break;
          }
        }
        if (!finished) break;
        P.outq.pop_front();
      } else {
        if (P.sq_free < 1 || P.credits < 1) break;
        post_ctl(P, o.msg, true);
        P.outq.pop_front();
      }
    }
    if (P.owed >= kCreditThreshold && P.sq_free > 0 && !P.dead) {
      CtlMsg m{};
      m.type = static_cast<uint32_t>(Ctl::kCredit);
      post_ctl(P, m, false);
    }
  }

  void enqueue_ctl(Peer& P, const CtlMsg& m) {
    Outbound o;
    o.msg = m;
    P.outq.push_back(o);
    flush(P);
  }

  void start_write(Peer& P, RequestId id, const Advert& adv) {
    Request& r = reqs.at(id);
    if (adv.length != r.bytes) {
      local_failure(P.rank,
                    "send of " + std::to_string(r.bytes) + " bytes (tag " + std::to_string(r.tag) +
                        ") matched a recv of " + std::to_string(adv.length) + " bytes",
                    true);
      return;
    }
    Outbound o;
    o.is_write = true;
    o.req = id;
    o.adv = adv;
    P.outq.push_back(o);
    flush(P);
  }

  void post_probe(Peer& P, Clock::time_point now) {
    ibv_send_wr wr{};
    wr.wr_id = make_wr_id(Kind::kProbe, P.rank, 0);
    wr.num_sge = 0;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int e = ibv_post_send(P.qp, &wr, &bad)) {
      peer_failed(P.rank, "ibv_post_send(probe) failed: " + errno_text(e));
      return;
    }
    --P.sq_free;
    P.probe_outstanding = true;
    P.last_probe = now;
  }

  // ---- failures ----------------------------------------------------------------------

  // A failure this rank observed itself: remember it and tell every other peer (and the
  // peer at fault too when it is alive: `tell_peer`, e.g. a size mismatch or a stall).
  void local_failure(int peer, const std::string& reason, bool tell_peer = false) {
    if (failed) return;
    failed = true;
    fail_peer = peer;
    fail_reason = reason;
    CtlMsg m{};
    m.type = static_cast<uint32_t>(Ctl::kAbort);
    m.id = static_cast<uint32_t>(peer);
    std::snprintf(m.text, sizeof m.text, "%s", reason.c_str());
    for (Peer& P : peers) {
      if (!P.qp || (P.rank == peer && !tell_peer) || P.dead || P.closed || P.sq_free < 1) continue;
      post_ctl(P, m, false);
      drain_pending = true;
    }
  }

  void peer_failed(int p, const std::string& reason) {
    Peer& P = peers[p];
    P.dead = true;
    local_failure(p, reason);
  }

  std::string describe_failure(const char* op) const {
    std::string s = std::string(op ? op : "ccl") + ": rank " + std::to_string(rank) + ": ";
    if (fail_peer >= 0 && fail_peer < size) s += "peer " + peers[fail_peer].desc + ": ";
    return s + fail_reason;
  }

  // Throws the recorded failure. The first time, lets the aborts leave before the caller
  // (likely) exits: a bounded drain (never from inside the completion handlers, which may
  // run in the middle of flush()).
  void check_failure(const char* op) {
    if (!failed) return;
    if (drain_pending) {
      drain_pending = false;
      const auto until = Clock::now() + milliseconds(100);
      while (!all_sends_done() && Clock::now() < until)
        if (poll_once() == 0) usleep(200);
    }
    throw PeerError(describe_failure(op), fail_peer);
  }

  bool all_sends_done() const {
    for (const Peer& P : peers)
      if (P.qp && !P.dead && !P.closed && P.sq_free < kSqDepth) return false;
    return true;
  }

  // ---- completions -------------------------------------------------------------------

  int poll_once() {
    if (!cq) return 0;
    ibv_wc wc[kPollBatch];
    int n = ibv_poll_cq(cq, kPollBatch, wc);
    if (n < 0) {
      local_failure(-1, "ibv_poll_cq failed");
      return 0;
    }
    for (int i = 0; i < n; ++i) handle(wc[i]);
    if (n > 0 && !failed)
      for (Peer& P : peers)
        if (P.qp && (!P.outq.empty() || P.owed >= kCreditThreshold)) flush(P);
    return n;
  }

  void handle(const ibv_wc& wc) {
    const Kind k = wr_kind(wc.wr_id);
    const int p = wr_peer(wc.wr_id);
    const uint64_t idx = wr_index(wc.wr_id);
    if (p < 0 || p >= size || p == rank) return;
    Peer& P = peers[p];
    const auto now = Clock::now();
    if (k != Kind::kRecv) ++P.sq_free;
    if (k == Kind::kCtl) P.free_slots.push_back(static_cast<uint32_t>(idx));
    if (k == Kind::kProbe) P.probe_outstanding = false;
    if (wc.status != IBV_WC_SUCCESS) {
      const bool was_dead = P.dead;
      P.dead = true;
      if (was_dead || failed) return;          // flushes after the first error
      if (P.closed && P.pending == 0) return;  // it left; nothing of ours was in flight
      std::string what;
      if (wc.status == IBV_WC_RETRY_EXC_ERR)
        what = "unreachable (IBV_WC_RETRY_EXC_ERR: no ACK after " + std::to_string(opt.retry_cnt) +
               " retransmissions)";
      else
        what = std::string("transfer failed: ") + ibv_wc_status_str(wc.status) + " (status " +
               std::to_string(wc.status) + ")";
      peer_failed(p, what);
      return;
    }
    switch (k) {
      case Kind::kRecv:
        P.last_heard = now;
        handle_recv(P, static_cast<uint32_t>(idx), wc);
        break;
      case Kind::kCtl:
        P.last_heard = now;
        break;
      case Kind::kWrite: {
        P.last_heard = now;
        auto it = reqs.find(idx);
        if (it != reqs.end() && --it->second.pieces_left == 0 && it->second.all_posted) {
          it->second.done = true;
          --P.pending;
        }
        break;
      }
      case Kind::kProbe:
        break;
    }
  }

  void handle_recv(Peer& P, uint32_t slot, const ibv_wc& wc) {
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      const uint32_t id = ntohl(wc.imm_data);
      post_recv(P.rank, slot);
      ++P.owed;
      auto it = P.recvs.find(id);
      if (it == P.recvs.end()) {
        peer_failed(P.rank, "protocol error: data for unknown transfer " + std::to_string(id));
        return;
      }
      auto r = reqs.find(it->second);
      if (r != reqs.end()) {
        r->second.done = true;
        --P.pending;
      }
      P.recvs.erase(it);
      return;
    }
    CtlMsg m;
    std::memcpy(&m, &ring[static_cast<size_t>(P.rank) * kRing + slot], sizeof m);
    post_recv(P.rank, slot);
    P.credits += static_cast<int>(m.credits);
    switch (static_cast<Ctl>(m.type)) {
      case Ctl::kAdvert: {
        ++P.owed;
        Advert a{m.addr, m.length, m.rkey, m.id};
        auto w = P.sends_waiting.find(m.tag);
        if (w != P.sends_waiting.end() && !w->second.empty()) {
          RequestId id = w->second.front();
          w->second.pop_front();
          if (w->second.empty()) P.sends_waiting.erase(w);
          start_write(P, id, a);
        } else {
          P.adverts[m.tag].push_back(a);
        }
        break;
      }
      case Ctl::kCredit:
        break;
      case Ctl::kBarrier:
        ++P.owed;
        P.barrier_in.insert({m.seq, m.id});
        break;
      case Ctl::kAbort: {
        if (failed) break;
        m.text[sizeof m.text - 1] = 0;
        int dead = static_cast<int>(m.id);
        failed = true;
        if (dead >= 0 && dead < size && dead != rank) {
          fail_peer = dead;
          fail_reason = std::string("reported by rank ") + std::to_string(P.rank) + ": " + m.text;
        } else {
          fail_peer = P.rank;
          fail_reason = std::string("aborted by it: ") + m.text;
        }
        break;
      }
      case Ctl::kBye:
        P.closed = true;
        if (P.pending > 0 && !failed)
          local_failure(P.rank, "closed its communicator with " + std::to_string(P.pending) +
                                    " transfer(s) to or from this rank pending");
        break;
      default:
        peer_failed(P.rank, "protocol error: unknown control message " + std::to_string(m.type));
    }
  }

  // ---- blocking ----------------------------------------------------------------------

  void maybe_probe(Clock::time_point now) {
    if (failed) return;
    for (Peer& P : peers) {
      if (!P.qp || P.dead || P.closed || P.probe_outstanding || P.sq_free < 1) continue;
      if (now - std::max(P.last_heard, P.last_probe) >= probe_interval) post_probe(P, now);
    }
  }

  void check_stall(int peer, Clock::time_point since, Clock::time_point now) {
    if (peer < 0) return;  // self transfers too: a recv from self never sent times out
    const Peer& P = peers[peer];
    if (now - std::max(since, P.last_heard) > opt.timeout)
      local_failure(peer, "no progress within " + std::to_string(opt.timeout.count()) + " ms",
                    true);
  }

  // Sleeps until a completion event or `max_wait`.
  void sleep_on_channel(microseconds max_wait) {
    if (ibv_req_notify_cq(cq, 0)) {
      usleep(static_cast<useconds_t>(std::min<int64_t>(max_wait.count(), 1000)));
      return;
    }
    if (poll_once() > 0) return;  // completions that raced with arming
    pollfd pfd{channel->fd, POLLIN, 0};
    const timespec ts{static_cast<time_t>(max_wait.count() / 1000000),
                      static_cast<long>(max_wait.count() % 1000000) * 1000};
    ::ppoll(&pfd, 1, &ts, nullptr);
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    unsigned events = 0;
    while (ibv_get_cq_event(channel, &ev_cq, &ev_ctx) == 0) ++events;
    if (events) ibv_ack_cq_events(cq, events);
  }

  // Progresses until done() holds, raising PeerError on failure or on a stall of `peer`
  // (no completion from it since max(since, its last message) for the timeout).
  //
  // Waiting has three phases, restarted by every completion: busy-polling for opt.spin;
  // then naps of opt.nap (ppoll on the completion channel with that timeout, then polling
  // the CQ, which also drives progress inline on providers that do so, like softrdma);
  // after kDeepAfter without completions, sleeps on the channel in slices of up to 10 ms.
  // Naps rather than long sleeps keep latency low where a provider's own progress thread
  // reacts slowly to a sleeping consumer, and leave the CPU to other ranks sharing it.
  template <class Done>
  void block(const char* op, Done done, int peer, Clock::time_point since) {
    constexpr milliseconds kDeepAfter{20};
    auto busy_since = Clock::now();
    for (;;) {
      const int n = poll_once();
      check_failure(op);
      if (done()) return;
      const auto now = Clock::now();
      if (n > 0) busy_since = now;
      check_stall(peer, since, now);
      maybe_probe(now);
      check_failure(op);
      const auto idle = now - busy_since;
      if (idle < opt.spin) continue;
      if (idle < kDeepAfter)
        sleep_on_channel(opt.nap);
      else
        sleep_on_channel(std::min<microseconds>(milliseconds(10), probe_interval));
    }
  }

  // ---- requests ----------------------------------------------------------------------

  const VerbsBuffer& check_buffer(const Buffer& buf, size_t offset, size_t bytes,
                                  const char* what) const {
    auto* vb = dynamic_cast<const VerbsBuffer*>(&buf);
    if (!vb || vb->owner() != this)
      throw std::invalid_argument(std::string(what) +
                                  ": buffer was not registered with this transport");
    if (offset > vb->size() || bytes > vb->size() - offset)
      throw std::invalid_argument(std::string(what) + ": range [" + std::to_string(offset) + ", +" +
                                  std::to_string(bytes) + ") outside the buffer of " +
                                  std::to_string(vb->size()) + " bytes");
    return *vb;
  }

  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size)
      throw std::invalid_argument(std::string(what) + ": peer " + std::to_string(peer) +
                                  " out of range [0, " + std::to_string(size) + ")");
  }

  RequestId new_request(bool is_send, int peer, const VerbsBuffer& vb, size_t offset, size_t bytes,
                        uint64_t tag) {
    RequestId id = next_req++;
    Request r;
    r.is_send = is_send;
    r.peer = peer;
    r.tag = tag;
    r.addr = static_cast<char*>(vb.data()) + (vb.data() ? offset : 0);
    r.bytes = bytes;
    r.lkey = vb.lkey();
    r.rkey = vb.rkey();
    r.posted = Clock::now();
    reqs.emplace(id, r);
    return id;
  }

  // Self transfers: complete a matched pair with memcpy.
  void match_self(uint64_t tag) {
    auto s = self_sends.find(tag);
    auto r = self_recvs.find(tag);
    while (s != self_sends.end() && r != self_recvs.end() && !s->second.empty() &&
           !r->second.empty()) {
      Request& rs = reqs.at(s->second.front());
      Request& rr = reqs.at(r->second.front());
      if (rs.bytes != rr.bytes)
        throw std::invalid_argument("send to self of " + std::to_string(rs.bytes) +
                                    " bytes matched a recv of " + std::to_string(rr.bytes) +
                                    " bytes (tag " + std::to_string(tag) + ")");
      if (rs.bytes) std::memmove(rr.addr, rs.addr, rs.bytes);
      rs.done = rr.done = true;
      s->second.pop_front();
      r->second.pop_front();
    }
    if (s != self_sends.end() && s->second.empty()) self_sends.erase(s);
    if (r != self_recvs.end() && r->second.empty()) self_recvs.erase(r);
  }

  RequestId send(int peer, const Buffer& buf, size_t offset, size_t bytes, uint64_t tag) {
    check_peer(peer, "send");
    const VerbsBuffer& vb = check_buffer(buf, offset, bytes, "send");
    RequestId id = new_request(true, peer, vb, offset, bytes, tag);
    if (peer == rank) {
      self_sends[tag].push_back(id);
      match_self(tag);
      return id;
    }
    Peer& P = peers[peer];
    ++P.pending;
    if (failed) return id;  // wait()/test() report the failure
    auto a = P.adverts.find(tag);
    if (a != P.adverts.end() && !a->second.empty()) {
      Advert adv = a->second.front();
      a->second.pop_front();
      if (a->second.empty()) P.adverts.erase(a);
      start_write(P, id, adv);
    } else {
      P.sends_waiting[tag].push_back(id);
    }
    return id;
  }

  RequestId recv(int peer, Buffer& buf, size_t offset, size_t bytes, uint64_t tag) {
    check_peer(peer, "recv");
    const VerbsBuffer& vb = check_buffer(buf, offset, bytes, "recv");
    RequestId id = new_request(false, peer, vb, offset, bytes, tag);
    if (peer == rank) {
      self_recvs[tag].push_back(id);
      match_self(tag);
      return id;
    }
    Peer& P = peers[peer];
    ++P.pending;
    if (failed) return id;
    const uint32_t tid = P.next_id++;
    P.recvs[tid] = id;
    CtlMsg m{};
    m.type = static_cast<uint32_t>(Ctl::kAdvert);
    m.tag = tag;
    m.addr = reinterpret_cast<uint64_t>(reqs.at(id).addr);
    m.length = bytes;
    m.rkey = vb.rkey();
    m.id = tid;
    enqueue_ctl(P, m);
    return id;
  }

  Request& find(RequestId id, const char* what) {
    auto it = reqs.find(id);
    if (it == reqs.end())
      throw std::invalid_argument(std::string(what) + ": unknown or completed request " +
                                  std::to_string(id));
    return it->second;
  }

  void wait(RequestId id, const char* op) {
    Request& r = find(id, "wait");
    if (!r.done) {
      const int peer = r.peer;
      const auto since = r.posted;
      block(
          op, [&] { return r.done; }, peer, since);
    }
    reqs.erase(id);
  }

  bool test(RequestId id, const char* op) {
    Request& r = find(id, "test");
    if (!r.done) {
      poll_once();
      check_failure(op);
      if (!r.done) {
        const auto now = Clock::now();
        check_stall(r.peer, r.posted, now);
        maybe_probe(now);
        check_failure(op);
        return false;
      }
    }
    reqs.erase(id);
    return true;
  }

  void barrier(const char* op) {
    check_failure(op);
    if (size == 1) return;
    const uint64_t seq = barrier_seq++;
    uint32_t round = 0;
    for (int k = 1; k < size; k <<= 1, ++round) {
      const int to = (rank + k) % size;
      const int from = (rank - k % size + size) % size;
      CtlMsg m{};
      m.type = static_cast<uint32_t>(Ctl::kBarrier);
      m.seq = seq;
      m.id = round;
      enqueue_ctl(peers[to], m);
      const auto key = std::make_pair(seq, round);
      Peer& F = peers[from];
      block(
          op, [&] { return F.barrier_in.count(key) > 0; }, from, Clock::now());
      F.barrier_in.erase(key);
    }
  }

  // Goodbye to every peer still there, then wait (bounded) for everything posted.
  void close() {
    if (!cq) return;
    if (!failed) {
      CtlMsg m{};
      m.type = static_cast<uint32_t>(Ctl::kBye);
      for (Peer& P : peers) {
        if (!P.qp || P.dead || P.closed) continue;
        if (P.sq_free < 1) {
          const auto until = Clock::now() + milliseconds(200);
          while (P.sq_free < 1 && !P.dead && Clock::now() < until)
            if (poll_once() == 0) usleep(100);
        }
        if (P.sq_free >= 1 && !P.dead) post_ctl(P, m, false);
      }
    }
    const auto until =
        Clock::now() + std::min<milliseconds>(opt.timeout, milliseconds(failed ? 100 : 2000));
    while (!all_sends_done() && Clock::now() < until)
      if (poll_once() == 0) usleep(100);
  }
};

// ---- VerbsOptions -------------------------------------------------------------------------

VerbsOptions VerbsOptions::from_environment() {
  VerbsOptions o;
  if (const char* d = std::getenv("SOFTRDMA_CCL_IB_DEVICE"); d && *d) o.device = d;
  o.port = static_cast<uint8_t>(env_long("SOFTRDMA_CCL_IB_PORT", o.port, 1, 255));
  o.gid_index = static_cast<int>(env_long("SOFTRDMA_CCL_IB_GID_INDEX", o.gid_index, 0, 255));
  o.timeout = milliseconds(env_long("SOFTRDMA_CCL_TIMEOUT_MS", o.timeout.count(), 1, 86400000));
  o.ib_timeout = static_cast<uint8_t>(env_long("SOFTRDMA_CCL_IB_TIMEOUT", o.ib_timeout, 1, 31));
  o.retry_cnt = static_cast<uint8_t>(env_long("SOFTRDMA_CCL_IB_RETRY_CNT", o.retry_cnt, 0, 7));
  o.spin = microseconds(env_long("SOFTRDMA_CCL_SPIN_US", o.spin.count(), 0, 10000000));
  o.nap = microseconds(env_long("SOFTRDMA_CCL_NAP_US", o.nap.count(), 1, 10000));
  o.max_write = static_cast<uint64_t>(
      env_long("SOFTRDMA_CCL_IB_MAX_WRITE", static_cast<long>(o.max_write), 0, 1l << 40));
  return o;
}

// ---- VerbsTransport -----------------------------------------------------------------------

VerbsTransport::VerbsTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

VerbsTransport::~VerbsTransport() {
  if (impl_) impl_->close();
}

std::unique_ptr<VerbsTransport> VerbsTransport::connect(Bootstrap& bootstrap,
                                                        const VerbsOptions& options) {
  auto impl = std::make_unique<Impl>();
  std::string mine;
  std::string setup_error;
  try {
    impl->open(options, bootstrap.rank(), bootstrap.size());
    mine = impl->local_info();
  } catch (const std::exception& e) {
    // Tell the other ranks why this one will not connect, then fail here too.
    setup_error = e.what();
    mine = kSetupFailed + setup_error;
  }
  std::vector<std::string> all = bootstrap.all_gather(mine);
  if (!setup_error.empty()) throw std::runtime_error(setup_error);
  if (static_cast<int>(all.size()) != bootstrap.size())
    throw BootstrapError("VerbsTransport: bootstrap returned " + std::to_string(all.size()) +
                         " entries for " + std::to_string(bootstrap.size()) + " ranks");
  impl->connect_peers(all);
  bootstrap.barrier();
  return std::unique_ptr<VerbsTransport>(new VerbsTransport(std::move(impl)));
}

int VerbsTransport::rank() const {
  return impl_->rank;
}
int VerbsTransport::size() const {
  return impl_->size;
}

std::string VerbsTransport::peer_description(int peer) const {
  if (peer < 0 || peer >= impl_->size) return "rank " + std::to_string(peer);
  const std::string& d = impl_->peers[peer].desc;
  return d.empty() ? "rank " + std::to_string(peer) : d;
}

std::chrono::milliseconds VerbsTransport::timeout() const {
  return impl_->opt.timeout;
}

std::string VerbsTransport::local_address() const {
  return impl_->my_addr;
}

std::string VerbsTransport::device_name() const {
  return impl_->dev && impl_->dev->ctx ? ibv_get_device_name(impl_->dev->ctx->device) : "";
}

std::unique_ptr<Buffer> VerbsTransport::register_buffer(void* data, size_t bytes) {
  ibv_mr* mr = nullptr;
  if (bytes > 0) {
    if (!data) throw std::invalid_argument("register_buffer: null data with bytes > 0");
    mr = ibv_reg_mr(impl_->dev->pd, data, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr) verbs_fail("ibv_reg_mr(" + std::to_string(bytes) + " bytes)", errno);
  }
  return std::make_unique<VerbsBuffer>(impl_->dev, impl_.get(), data, bytes, mr);
}

RequestId VerbsTransport::send(int peer, const Buffer& buf, size_t offset, size_t bytes,
                               uint64_t tag) {
  return impl_->send(peer, buf, offset, bytes, tag);
}

RequestId VerbsTransport::recv(int peer, Buffer& buf, size_t offset, size_t bytes, uint64_t tag) {
  return impl_->recv(peer, buf, offset, bytes, tag);
}

void VerbsTransport::wait(RequestId id, const char* op) {
  impl_->wait(id, op);
}
bool VerbsTransport::test(RequestId id, const char* op) {
  return impl_->test(id, op);
}
void VerbsTransport::barrier(const char* op) {
  impl_->barrier(op);
}

}  // namespace softrdma::ccl
