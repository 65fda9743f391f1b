// VerbsTransport setup: the device, its CQ and completion channel, the control memory and
// the RC QPs (channels) of each peer; the connection details ranks exchange through the bootstrap;
// the INIT → RTR → RTS transitions; teardown; and the settings read from the environment.
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>

#include "base/params.h"
#include "ccl/verbs_transport_impl.h"

namespace softrdma::ccl {

using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace verbs {

std::string errno_text(int e) {
  return std::string(std::strerror(e));
}

[[noreturn]] void verbs_fail(const std::string& what, int e) {
  throw std::runtime_error("VerbsTransport: " + what + ": " + errno_text(e));
}

}  // namespace verbs

using namespace verbs;  // NOLINT(google-build-using-namespace): the transport's own types

namespace {

// "127.0.0.4" for a RoCE GID of an IPv4 address, the IPv6 text of other GIDs, "lid N" on
// InfiniBand.
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

// Connection details one rank publishes through the bootstrap (binary, same architecture).
struct WireHeader {
  uint32_t magic;  // 'SRCV'
  uint32_t version;
  uint8_t gid[16];
  uint16_t lid;
  uint8_t link_layer;  // IBV_LINK_LAYER_*
  uint8_t mtu;         // ibv_mtu
  uint32_t pid;
  uint32_t eager_bytes;  // VerbsOptions::eager_bytes: the most this rank takes eagerly
  uint32_t channels;     // VerbsOptions::channels: QPs per peer, each listed below
  char host[64];
};
// After the header: for every rank p, `channels` WireQp (this rank's QPs to p, channel 0
// first; zeros for p = this rank).
struct WireQp {
  uint32_t qpn;
  uint32_t psn;
};
constexpr uint32_t kWireMagic = 0x53524356;
constexpr uint32_t kWireVersion = 3;  // 2: eager_bytes; 3: channels (and advert stripes)
constexpr const char* kSetupFailed = "SETUP-FAILED:";

}  // namespace

void VerbsTransport::Impl::open(const VerbsOptions& o, int r, int n) {
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
    throw std::runtime_error("VerbsTransport: port " + std::to_string(opt.port) + " is not active");
  link_layer = pa.link_layer;
  active_mtu = pa.active_mtu;
  port_bits = link_rate::port_rate_bits(pa.active_speed, pa.active_width);
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
  if (opt.channels < 1 || opt.channels > kMaxChannels)
    throw std::invalid_argument("VerbsTransport: channels " + std::to_string(opt.channels) +
                                " outside 1.." + std::to_string(kMaxChannels));
  if (opt.channel_min_bytes < kStripeAlign)
    throw std::invalid_argument("VerbsTransport: channel_min_bytes " +
                                std::to_string(opt.channel_min_bytes) + " below " +
                                std::to_string(kStripeAlign));
  if (size > kMaxRanks)
    throw std::invalid_argument("VerbsTransport: " + std::to_string(size) + " ranks, at most " +
                                std::to_string(kMaxRanks));
  // Every WR of every QP is signalled: channel 0 has kSqDepth sends and kRing receives, each
  // data channel kSqDepth sends and kCredits receives.
  int cqe = std::max(
      64, (size - 1) * (kSqDepth + kRing + (opt.channels - 1) * (kSqDepth + kCredits)) + 64);
  if (da.max_cqe > 0) cqe = std::min(cqe, da.max_cqe);
  cq = ibv_create_cq(dev->ctx, cqe, nullptr, channel, 0);
  if (!cq) verbs_fail("ibv_create_cq(" + std::to_string(cqe) + ")", errno);

  const size_t npeers = static_cast<size_t>(size);
  if (opt.eager_bytes > kMaxEagerBytes)
    throw std::invalid_argument("VerbsTransport: eager_bytes " + std::to_string(opt.eager_bytes) +
                                " above " + std::to_string(kMaxEagerBytes));
  slot_bytes = (kCtlBytes + opt.eager_bytes + 63) / 64 * 64;
  ring.assign(npeers * kRing * slot_bytes / sizeof(uint64_t), 0);
  send_slots.assign(npeers * kSqDepth * slot_bytes / sizeof(uint64_t), 0);
  // An int, not the enum: rdma-core's ibv_reg_mr macro masks the access flags with an
  // enumerator of another enum type (a deprecated enum-enum operation in C++20).
  const int local_write = IBV_ACCESS_LOCAL_WRITE;
  ring_mr = ibv_reg_mr(dev->pd, ring.data(), ring.size() * sizeof(uint64_t), local_write);
  if (!ring_mr) verbs_fail("ibv_reg_mr(control ring)", errno);
  slots_mr =
      ibv_reg_mr(dev->pd, send_slots.data(), send_slots.size() * sizeof(uint64_t), local_write);
  if (!slots_mr) verbs_fail("ibv_reg_mr(control send slots)", errno);

  std::random_device rd;
  peers.resize(npeers);
  for (int p = 0; p < size; ++p) {
    Peer& P = peers[p];
    P.rank = p;
    if (p == rank) continue;
    for (uint32_t s = 0; s < kSqDepth; ++s) P.free_slots.push_back(kSqDepth - 1 - s);
    P.ch.resize(static_cast<size_t>(opt.channels));
    for (int c = 0; c < opt.channels; ++c) {
      ibv_qp_init_attr ia{};
      ia.send_cq = cq;
      ia.recv_cq = cq;
      ia.qp_type = IBV_QPT_RC;
      ia.cap.max_send_wr = kSqDepth;
      ia.cap.max_recv_wr = c == 0 ? kRing : kCredits;
      ia.cap.max_send_sge = 1;
      ia.cap.max_recv_sge = 1;
      ibv_qp* qp = ibv_create_qp(dev->pd, &ia);
      if (!qp)
        verbs_fail(
            "ibv_create_qp(for rank " + std::to_string(p) + ", channel " + std::to_string(c) + ")",
            errno);
      P.ch[c].qp = qp;
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.pkey_index = 0;
      a.port_num = opt.port;
      a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
      if (int e = ibv_modify_qp(
              qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        verbs_fail("ibv_modify_qp(INIT)", e);
      if (c == 0)
        for (uint32_t s = 0; s < kRing; ++s) post_recv(p, s);
      else
        for (int s = 0; s < kCredits; ++s) post_data_recv(p, c);
      P.ch[c].psn = rd() & 0xffffff;
    }
  }
}

std::string VerbsTransport::Impl::local_info() const {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  std::memcpy(h.gid, gid.raw, 16);
  h.lid = lid;
  h.link_layer = link_layer;
  h.mtu = active_mtu;
  h.pid = static_cast<uint32_t>(getpid());
  h.eager_bytes = static_cast<uint32_t>(opt.eager_bytes);
  h.channels = static_cast<uint32_t>(opt.channels);
  gethostname(h.host, sizeof h.host - 1);
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  for (int p = 0; p < size; ++p)
    for (int c = 0; c < opt.channels; ++c) {
      const bool remote = p != rank && peers[p].ch[c].qp;
      WireQp q{remote ? peers[p].ch[c].qp->qp_num : 0, remote ? peers[p].ch[c].psn : 0};
      out.append(reinterpret_cast<const char*>(&q), sizeof q);
    }
  return out;
}

namespace {

// Moves channel C of peer P (INIT) to RTR, then RTS, towards the remote QP q of the rank
// that published h. Throws std::runtime_error naming the transition that failed.
void connect_qp(const VerbsTransport::Impl& t, const Peer& P, const Channel& C, const WireHeader& h,
                const WireQp& q) {
  const VerbsOptions& opt = t.opt;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min(t.active_mtu, h.mtu));
  a.dest_qp_num = q.qpn;
  a.rq_psn = q.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = opt.port;
  a.ah_attr.dlid = h.lid;
  const bool roce = t.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (roce || h.link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, h.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(opt.gid_index);
    a.ah_attr.grh.hop_limit = 64;
  }
  if (int e = ibv_modify_qp(C.qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    verbs_fail("ibv_modify_qp(RTR, " + P.desc + ")", e);
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_RTS;
  s.timeout = opt.ib_timeout;
  s.retry_cnt = opt.retry_cnt;
  s.rnr_retry = 7;
  s.sq_psn = C.psn;
  s.max_rd_atomic = 1;
  if (int e = ibv_modify_qp(C.qp, &s,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    verbs_fail("ibv_modify_qp(RTS, " + P.desc + ")", e);
}

}  // namespace

void VerbsTransport::Impl::connect_peers(const std::vector<std::string>& all) {
  // Validate everything first: a rank that failed its setup says so in its blob.
  for (int p = 0; p < size; ++p) {
    const std::string& b = all[p];
    if (b.rfind(kSetupFailed, 0) == 0)
      throw BootstrapError("VerbsTransport: rank " + std::to_string(p) +
                           " failed to set up: " + b.substr(std::strlen(kSetupFailed)));
    WireHeader h{};
    if (b.size() < sizeof h)
      throw BootstrapError("VerbsTransport: malformed connection info from rank " +
                           std::to_string(p));
    std::memcpy(&h, b.data(), sizeof h);
    if (h.magic != kWireMagic || h.version != kWireVersion)
      throw BootstrapError("VerbsTransport: rank " + std::to_string(p) +
                           " speaks another protocol version");
    if (h.channels < 1 || h.channels > static_cast<uint32_t>(kMaxChannels) ||
        b.size() != sizeof h + static_cast<size_t>(size) * h.channels * sizeof(WireQp))
      throw BootstrapError("VerbsTransport: malformed connection info from rank " +
                           std::to_string(p));
  }
  for (int p = 0; p < size; ++p) {
    const std::string& b = all[p];
    WireHeader h{};
    std::memcpy(&h, b.data(), sizeof h);
    Peer& P = peers[p];
    P.desc = "rank " + std::to_string(p) + " (" + gid_to_text(h.gid, h.link_layer, h.lid) + ")";
    if (p == rank) continue;
    P.eager_max = std::min<size_t>(opt.eager_bytes, h.eager_bytes);
    // The pair uses the smaller channel count; this side's extra QPs go now.
    const size_t pair_channels = std::min<size_t>(P.ch.size(), h.channels);
    for (size_t c = pair_channels; c < P.ch.size(); ++c) ibv_destroy_qp(P.ch[c].qp);
    P.ch.resize(pair_channels);
    for (size_t c = 0; c < pair_channels; ++c) {
      WireQp q{};
      std::memcpy(&q, b.data() + sizeof h + (rank * h.channels + c) * sizeof(WireQp), sizeof q);
      connect_qp(*this, P, P.ch[c], h, q);
    }
    P.last_heard = P.last_probe = Clock::now();
  }
}

// Completion events are acknowledged as they are read, so the CQ can go at once.
void VerbsTransport::Impl::teardown() {
  for (Peer& P : peers)
    for (Channel& C : P.ch)
      if (C.qp) {
        ibv_destroy_qp(C.qp);
        C.qp = nullptr;
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

// ---- VerbsOptions -------------------------------------------------------------------------

VerbsOptions VerbsOptions::from_environment() {
  VerbsOptions o;
  // Through the parameter registry (base/params.h): ranges, defaults and docs in one place.
  using params::integer;
  if (std::string d = params::text(params::kCclIbDevice); !d.empty()) o.device = d;
  o.port = static_cast<uint8_t>(integer(params::kCclIbPort, o.port));
  o.gid_index = static_cast<int>(integer(params::kCclIbGidIndex, o.gid_index));
  o.timeout = milliseconds(integer(params::kCclTimeoutMs, o.timeout.count()));
  o.ib_timeout = static_cast<uint8_t>(integer(params::kCclIbTimeout, o.ib_timeout));
  o.retry_cnt = static_cast<uint8_t>(integer(params::kCclIbRetryCnt, o.retry_cnt));
  o.spin = microseconds(integer(params::kCclSpinUs, o.spin.count()));
  o.nap = microseconds(integer(params::kCclNapUs, o.nap.count()));
  o.max_write =
      static_cast<uint64_t>(integer(params::kCclIbMaxWrite, static_cast<int64_t>(o.max_write)));
  o.eager_bytes =
      static_cast<size_t>(integer(params::kCclEagerBytes, static_cast<int64_t>(o.eager_bytes)));
  o.channels = static_cast<int>(integer(params::kCclChannels, o.channels));
  o.channel_min_bytes = static_cast<size_t>(
      integer(params::kCclChannelMinBytes, static_cast<int64_t>(o.channel_min_bytes)));
  return o;
}

// ---- VerbsTransport::connect ---------------------------------------------------------------

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
  impl->measure_paths();
  // Every rank's probes must find their peers still there: a rank that measured first and
  // went on to finish (closing its transport) made a slower rank's probes end in its goodbye
  // with no round trip timed, so that rank's path_bytes() read 0 (CI, UDP pass, loaded).
  bootstrap.barrier();
  return std::unique_ptr<VerbsTransport>(new VerbsTransport(std::move(impl)));
}

}  // namespace softrdma::ccl
