// kv::Engine's connections: the verbs device, RC QPs per peer and the handshake that
// connects them. The engine that first needs a peer (open_segment, notify) opens a TCP
// connection to the peer's handshake listener (address in its metadata record), sends its
// QP numbers and PSNs, and gets the peer's; both sides then take their QPs INIT → RTR → RTS
// (IBTA vol. 1 ch. 10.3; the same steps as ccl/verbs_setup.cpp). Mooncake's
// handshake-over-RPC (transfer_metadata.cpp, sendHandshake) works the same way.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "base/link_rate.h"
#include "kv/engine_impl.h"

namespace softrdma::kv {

using detail::Peer;
using detail::PeerState;
using detail::Qp;
using detail::QpSetInfo;

namespace {

constexpr uint32_t kRequestMagic = 0x484b5653;  // "SVKH"
constexpr uint32_t kReplyMagic = 0x524b5653;    // "SVKR"
// 2: per-QP device and address (multi-device engines); 3: per-QP responder resources.
constexpr uint32_t kVersion = 3;
enum : uint32_t { kOk = 0, kBusy = 1, kRefused = 2 };

std::string errno_text(int e) {
  return std::strerror(e);
}

// "127.0.0.4" for a RoCE GID holding an IPv4 address, the IPv6 text of other GIDs,
// "lid N" on InfiniBand.
std::string gid_text(const uint8_t* g, uint8_t link_layer, uint16_t lid) {
  static const uint8_t kV4Prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char buf[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(g, kV4Prefix, 12) == 0) return inet_ntop(AF_INET, g + 12, buf, sizeof buf);
  const bool zero = std::all_of(g, g + 16, [](uint8_t b) { return b == 0; });
  if (zero || link_layer == IBV_LINK_LAYER_INFINIBAND) return "lid " + std::to_string(lid);
  return inet_ntop(AF_INET6, g, buf, sizeof buf);
}

// A QP set: a count, then per QP its device's GID (16 bytes), LID, link layer, MTU, the
// device index, QPN, PSN and responder resources (u32 each, network order).
void put_set(std::string& s, const QpSetInfo& set) {
  tcp::put_u32(s, static_cast<uint32_t>(set.qps.size()));
  for (const detail::QpInfo& q : set.qps) {
    s.append(reinterpret_cast<const char*>(q.gid), 16);
    for (uint32_t v : {q.lid, q.link_layer, q.mtu, q.dev, q.qpn, q.psn, q.rd_atomic})
      tcp::put_u32(s, v);
  }
}

// Reads a QP set at `at`; throws std::out_of_range when the message is short.
QpSetInfo get_set(std::string_view s, size_t& at) {
  constexpr size_t kPerQp = 16 + 7 * 4;
  if (s.size() < at + 4) throw std::out_of_range("short QP set");
  const uint32_t n = tcp::get_u32(s, at);
  at += 4;
  if (n == 0 || n > 16) throw std::out_of_range("QP count out of range");
  if (s.size() < at + n * kPerQp) throw std::out_of_range("short QP set");
  QpSetInfo set;
  for (uint32_t i = 0; i < n; ++i, at += kPerQp) {
    detail::QpInfo q;
    std::memcpy(q.gid, s.data() + at, 16);
    q.lid = tcp::get_u32(s, at + 16);
    q.link_layer = tcp::get_u32(s, at + 20);
    q.mtu = tcp::get_u32(s, at + 24);
    q.dev = tcp::get_u32(s, at + 28);
    q.qpn = tcp::get_u32(s, at + 32);
    q.psn = tcp::get_u32(s, at + 36);
    q.rd_atomic = tcp::get_u32(s, at + 40);
    if (q.dev >= 64) throw std::out_of_range("device index out of range");
    if (q.rd_atomic < 1 || q.rd_atomic > 255)
      throw std::out_of_range("responder resources out of range");
    set.qps.push_back(q);
  }
  return set;
}

std::string get_bytes(std::string_view s, size_t& at) {
  const uint32_t n = tcp::get_u32(s, at);
  if (s.size() < at + 4 + n) throw std::out_of_range("short string");
  std::string out(s.substr(at + 4, n));
  at += 4 + n;
  return out;
}

// One length-prefixed frame.
bool send_frame(int fd, const std::string& body, tcp::Clock::time_point deadline) {
  std::string f;
  tcp::put_bytes(f, body);
  return tcp::send_all(fd, f, deadline);
}

bool recv_frame(int fd, std::string& body, tcp::Clock::time_point deadline) {
  std::string len;
  if (!tcp::recv_exact(fd, 4, len, deadline)) return false;
  const uint32_t n = tcp::get_u32(len, 0);
  if (n > 65536) return false;
  return tcp::recv_exact(fd, n, body, deadline);
}

// Closes what `d` holds (any part of it may be missing).
void release(detail::Device& d) {
  if (d.cq) ibv_destroy_cq(d.cq);
  if (d.channel) ibv_destroy_comp_channel(d.channel);
  if (d.pd) ibv_dealloc_pd(d.pd);
  if (d.ctx) ibv_close_device(d.ctx);
  d = detail::Device{};
}

}  // namespace

// ---- device -------------------------------------------------------------------------------

std::vector<std::string> EngineOptions::device_list() const {
  if (!devices.empty()) return devices;
  if (!device.empty()) return {device};
  return {};
}

void Engine::Impl::open_devices() {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (!list) fail_local("no verbs device (ibv_get_device_list: " + errno_text(errno) + ")");
  const std::vector<std::string> wanted = opt.device_list();
  std::vector<ibv_device*> chosen;
  for (const std::string& w : wanted) {
    ibv_device* found = nullptr;
    for (int i = 0; i < num && !found; ++i)
      if (w == ibv_get_device_name(list[i])) found = list[i];
    if (!found || std::count(wanted.begin(), wanted.end(), w) > 1) {
      std::string names;
      for (int i = 0; i < num; ++i)
        names += std::string(i ? ", " : "") + ibv_get_device_name(list[i]);
      ibv_free_device_list(list);
      fail_local(found ? "verbs device '" + w + "' is named twice"
                       : "no verbs device named '" + w +
                             "' (devices: " + (names.empty() ? "none" : names) + ")");
    }
    chosen.push_back(found);
  }
  try {
    if (wanted.empty()) {
      // Every device whose port is active (one that cannot be opened is skipped; the first
      // such failure is reported when none is left).
      std::string first_error;
      for (int i = 0; i < num; ++i) {
        detail::Device d;
        try {
          open_one(d, list[i]);
        } catch (const KvError& e) {
          release(d);
          if (first_error.empty()) first_error = e.what();
          continue;
        }
        context.devs.push_back(d);
      }
      if (context.devs.empty() && !first_error.empty()) throw KvError(first_error, "");
      if (context.devs.empty()) fail_local("no verbs device");
    } else {
      for (ibv_device* c : chosen) {
        context.devs.emplace_back();
        open_one(context.devs.back(), c);
      }
    }
  } catch (...) {
    ibv_free_device_list(list);
    throw;  // close_device() releases what devs holds
  }
  ibv_free_device_list(list);
  context.device_addr = context.devs[0].addr;
  for (const detail::Device& d : context.devs) context.device_names.push_back(d.name);
  worker.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (worker.wake_fd < 0) fail_local("eventfd: " + errno_text(errno));
}

void Engine::Impl::open_one(detail::Device& d, ibv_device* dev) {
  d.name = ibv_get_device_name(dev);
  auto fail = [&](const std::string& what) { fail_local("device " + d.name + ": " + what); };
  d.ctx = ibv_open_device(dev);
  if (!d.ctx) fail("ibv_open_device: " + errno_text(errno));
  ibv_port_attr pa{};
  if (int e = ibv_query_port(d.ctx, opt.port, &pa)) fail("ibv_query_port: " + errno_text(e));
  if (pa.state != IBV_PORT_ACTIVE) fail("port " + std::to_string(opt.port) + " is not active");
  d.link_layer = pa.link_layer;
  d.active_mtu = pa.active_mtu;
  d.lid = pa.lid;
  d.port_bits = link_rate::port_rate_bits(pa.active_speed, pa.active_width);
  if (pa.max_msg_sz) context.max_msg = std::min<uint64_t>(context.max_msg, pa.max_msg_sz);
  if (int e = ibv_query_gid(d.ctx, opt.port, opt.gid_index, &d.gid))
    fail("ibv_query_gid(index " + std::to_string(opt.gid_index) + "): " + errno_text(e));
  d.addr = gid_text(d.gid.raw, d.link_layer, d.lid);
  ibv_device_attr da{};
  if (int e = ibv_query_device(d.ctx, &da)) fail("ibv_query_device: " + errno_text(e));
  d.max_qp_wr = static_cast<uint32_t>(std::max(da.max_qp_wr, 0));
  const int cap = static_cast<int>(opt.max_rd_atomic);
  d.max_rd_atomic = static_cast<uint8_t>(std::clamp(std::min(da.max_qp_init_rd_atom, cap), 1, 255));
  d.max_dest_rd_atomic = static_cast<uint8_t>(std::clamp(std::min(da.max_qp_rd_atom, cap), 1, 255));
  d.pd = ibv_alloc_pd(d.ctx);
  if (!d.pd) fail("ibv_alloc_pd: " + errno_text(errno));
  d.channel = ibv_create_comp_channel(d.ctx);
  if (!d.channel) fail("ibv_create_comp_channel: " + errno_text(errno));
  fcntl(d.channel->fd, F_SETFL, fcntl(d.channel->fd, F_GETFL) | O_NONBLOCK);
  // Each QP reserves max_wr + 2 × kNotifySlots + 8 entries (create_qps): 131,072 holds 56
  // peers of 2 QPs at the default max_wr of 1,024 (16,384 held 20 at 256), or one peer's 2
  // QPs with windows the path raised to kMaxPathWindow.
  d.cq_capacity = 131072;
  if (da.max_cqe > 0) d.cq_capacity = std::min(d.cq_capacity, da.max_cqe);
  d.cq = ibv_create_cq(d.ctx, d.cq_capacity, nullptr, d.channel, 0);
  if (!d.cq) fail("ibv_create_cq(" + std::to_string(d.cq_capacity) + "): " + errno_text(errno));
}

void Engine::Impl::close_device() {
  stop = true;
  if (worker.wake_fd >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(worker.wake_fd, &one, sizeof one);
  }
  if (worker.thread.joinable()) worker.thread.join();
  // Shutting the listening socket down wakes the listener's poll at once.
  if (handshake.listener) ::shutdown(handshake.listener.get(), SHUT_RDWR);
  if (handshake.thread.joinable()) handshake.thread.join();
  handshake.listener = tcp::Fd();
  for (auto& q : qps)
    if (q->qp) ibv_destroy_qp(q->qp);
  qps.clear();
  qp_by_num.clear();
  for (auto& [n, p] : peers) {
    if (p->recv_mr) ibv_dereg_mr(p->recv_mr);
    if (p->send_mr) ibv_dereg_mr(p->send_mr);
  }
  peers.clear();
  for (auto& [a, r] : regions)
    for (ibv_mr* mr : r->mrs) ibv_dereg_mr(mr);
  regions.clear();
  regions_by_name.clear();
  for (detail::Device& d : context.devs) release(d);
  context.devs.clear();
  if (worker.wake_fd >= 0) close(worker.wake_fd);
  worker.wake_fd = -1;
}

// ---- QPs ----------------------------------------------------------------------------------

Peer& Engine::Impl::peer_entry(const std::string& peer) {
  auto it = peers.find(peer);
  if (it != peers.end()) return *it->second;
  auto p = std::make_unique<Peer>();
  p->name = peer;
  p->desc = "'" + peer + "'";
  register_notify_buffers(*p);
  Peer& ref = *p;
  peers[peer] = std::move(p);
  return ref;
}

void Engine::Impl::register_notify_buffers(Peer& p) {
  const int local_write = IBV_ACCESS_LOCAL_WRITE;
  p.recv_buf.assign(size_t{detail::kNotifySlots} * detail::kSlotBytes, 0);
  p.send_buf.assign(size_t{detail::kNotifySlots} * detail::kSlotBytes, 0);
  // Notifications travel on QP 0, which is always on device 0.
  p.recv_mr = ibv_reg_mr(context.devs[0].pd, p.recv_buf.data(), p.recv_buf.size(), local_write);
  p.send_mr = ibv_reg_mr(context.devs[0].pd, p.send_buf.data(), p.send_buf.size(), local_write);
  if (!p.recv_mr || !p.send_mr)
    fail_local("ibv_reg_mr(notification buffers): " + errno_text(errno));
  for (uint32_t s = 0; s < detail::kNotifySlots; ++s)
    p.free_send_slots.push_back(detail::kNotifySlots - 1 - s);
}

std::vector<Qp*> Engine::Impl::create_qps(Peer& p, uint32_t n) {
  // Room in the send queue for data slices: max_wr, or — when the path may raise the window
  // (apply_path_window) — up to kMaxPathWindow as the devices allow. The CQ reserves what
  // max_wr needs (+ notifications, probes); a raised window reserves its extra then.
  const auto nd = static_cast<uint32_t>(context.devs.size());
  uint32_t sq_slices = opt.max_wr;
  if (opt.max_wr_from_path) {
    uint32_t dev_room = detail::kMaxPathWindow;
    for (uint32_t k = 0; k < nd && k < n; ++k)
      if (context.devs[k].max_qp_wr > detail::kSqReserved)
        dev_room = std::min(dev_room, context.devs[k].max_qp_wr - detail::kSqReserved);
    sq_slices = std::max(sq_slices, dev_room);
  }
  const uint32_t send_wr = sq_slices + detail::kSqReserved;
  const int per_qp = static_cast<int>(opt.max_wr + detail::kSqReserved + detail::kNotifySlots);
  for (uint32_t k = 0; k < nd && k < n; ++k) {
    const detail::Device& d = context.devs[k];
    const int on_dev = static_cast<int>((n - k + nd - 1) / nd);  // QPs k, k + nd, …
    if (d.cq_reserved + per_qp * on_dev > d.cq_capacity)
      throw KvError("kv engine '" + name + "': too many connections for the CQ of " + d.name +
                        " (" + std::to_string(d.cq_capacity) + " entries) to add peer " + p.desc,
                    p.name);
  }
  std::random_device rd;
  std::vector<Qp*> set;
  for (uint32_t i = 0; i < n; ++i) {
    detail::Device& d = context.devs[i % nd];
    ibv_qp_init_attr ia{};
    ia.send_cq = d.cq;
    ia.recv_cq = d.cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = send_wr;
    ia.cap.max_recv_wr = detail::kNotifySlots;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ibv_qp* raw = ibv_create_qp(d.pd, &ia);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = opt.port;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    const int e =
        raw ? ibv_modify_qp(raw, &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
            : errno;
    if (!raw || e) {
      if (raw) ibv_destroy_qp(raw);
      for (Qp* q : set) destroy_qp(q);
      throw KvError("kv engine '" + name + "': creating a QP on " + d.name + " for peer " + p.desc +
                        ": " + errno_text(e),
                    p.name);
    }
    auto q = std::make_unique<Qp>();
    q->qp = raw;
    q->peer = &p;
    q->index = i;
    q->dev = i % nd;
    q->window = opt.max_wr;
    q->sq_slices = sq_slices;
    q->cq_share = per_qp;
    qp_by_num[qp_key(q->dev, raw->qp_num)] = q.get();
    set.push_back(q.get());
    qps.push_back(std::move(q));
    d.cq_reserved += per_qp;
  }
  psns.clear();
  for (uint32_t i = 0; i < n; ++i) psns.push_back(rd() & 0xffffff);
  return set;
}

QpSetInfo Engine::Impl::local_info(const std::vector<Qp*>& set) const {
  QpSetInfo info;
  for (size_t k = 0; k < set.size(); ++k) {
    const detail::Device& d = context.devs[set[k]->dev];
    detail::QpInfo q;
    std::memcpy(q.gid, d.gid.raw, 16);
    q.lid = d.lid;
    q.link_layer = d.link_layer;
    q.mtu = d.active_mtu;
    q.dev = set[k]->dev;
    q.qpn = set[k]->qp->qp_num;
    q.psn = psns.size() > k ? psns[k] : 0;
    q.rd_atomic = d.max_dest_rd_atomic;
    info.qps.push_back(q);
  }
  return info;
}

void Engine::Impl::destroy_qp(Qp* q) {
  qp_by_num.erase(qp_key(q->dev, q->qp->qp_num));
  worker.data_busy.fetch_sub(q->data_outstanding, std::memory_order_relaxed);  // none once reaped
  ibv_destroy_qp(q->qp);
  context.devs[q->dev].cq_reserved -= q->cq_share;
  auto it = std::find_if(qps.begin(), qps.end(), [q](const auto& u) { return u.get() == q; });
  if (it != qps.end()) qps.erase(it);
}

void Engine::Impl::install_qps(Peer& p, const std::vector<Qp*>& set, const QpSetInfo& remote,
                               const std::vector<uint32_t>& my_psns, detail::DueCallbacks& due) {
  if (remote.qps.size() != set.size())
    throw KvError("kv engine '" + name + "': peer " + p.desc + " answered with " +
                      std::to_string(remote.qps.size()) + " QPs for " + std::to_string(set.size()),
                  p.name);
  for (size_t i = 0; i < set.size(); ++i) {
    const detail::Device& d = context.devs[set[i]->dev];
    const detail::QpInfo& r = remote.qps[i];
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(std::min<uint32_t>(d.active_mtu, r.mtu));
    a.dest_qp_num = r.qpn;
    a.rq_psn = r.psn;
    a.max_dest_rd_atomic = d.max_dest_rd_atomic;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = opt.port;
    a.ah_attr.dlid = static_cast<uint16_t>(r.lid);
    if (d.link_layer == IBV_LINK_LAYER_ETHERNET || r.link_layer == IBV_LINK_LAYER_ETHERNET) {
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, r.gid, 16);
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(opt.gid_index);
      a.ah_attr.grh.hop_limit = 64;
    }
    if (int e = ibv_modify_qp(set[i]->qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      throw KvError("kv engine '" + name + "': QP to RTR on " + d.name + " for peer " + p.desc +
                        ": " + errno_text(e),
                    p.name);
    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = opt.ib_timeout;
    s.retry_cnt = opt.retry_cnt;
    s.rnr_retry = 7;
    s.sq_psn = my_psns[i];
    // Never more READs in flight than the peer's QP has responder resources for.
    s.max_rd_atomic = static_cast<uint8_t>(std::min<uint32_t>(d.max_rd_atomic, r.rd_atomic));
    if (int e = ibv_modify_qp(set[i]->qp, &s,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
      throw KvError("kv engine '" + name + "': QP to RTS on " + d.name + " for peer " + p.desc +
                        ": " + errno_text(e),
                    p.name);
    set[i]->remote_dev = r.dev;
  }
  // The old set (a peer that restarted or reconnects after a failure) goes.
  if (!p.qps.empty()) fail_peer(p, "the connection was replaced by a new handshake", due);
  const detail::QpInfo& r0 = remote.qps[0];
  p.desc = "'" + p.name + "' (" +
           gid_text(r0.gid, static_cast<uint8_t>(r0.link_layer), static_cast<uint16_t>(r0.lid)) +
           ")";
  p.qps = set;
  p.state = PeerState::kConnected;
  p.broken_reason.clear();
  p.lost = false;
  for (uint32_t s = 0; s < detail::kNotifySlots; ++s) post_recv(*set[0], s);
  // The new connection's path: its RTT sizes the windows (EngineOptions::max_wr_from_path).
  p.path_probes = 0;
  p.path_rtt = std::chrono::nanoseconds{0};
  if (opt.max_wr_from_path) post_path_probe(p);
  cv.notify_all();
}

// ---- handshake ----------------------------------------------------------------------------

void Engine::Impl::start_listener() {
  handshake.host = opt.host;
  if (handshake.host.empty()) {
    in_addr a{};
    handshake.host = inet_pton(AF_INET, context.device_addr.c_str(), &a) == 1 ? context.device_addr
                                                                              : "127.0.0.1";
  }
  handshake.listener = tcp::listen_tcp(handshake.host, 0, handshake.port);
  handshake.thread = std::thread([this] {
    while (!stop) {
      tcp::Fd fd = tcp::accept_tcp(handshake.listener.get(), 100);
      if (fd) serve_handshake(std::move(fd));
    }
  });
}

void Engine::Impl::serve_handshake(tcp::Fd fd) {
  const auto deadline = tcp::Clock::now() + opt.connect_timeout;
  std::string req;
  if (!recv_frame(fd.get(), req, deadline)) return;
  std::string reply;
  tcp::put_u32(reply, kReplyMagic);
  detail::DueCallbacks due;
  try {
    size_t at = 8;
    if (req.size() < 8 || tcp::get_u32(req, 0) != kRequestMagic || tcp::get_u32(req, 4) != kVersion)
      throw std::out_of_range("not a kv handshake of version " + std::to_string(kVersion));
    const std::string from = get_bytes(req, at);
    const QpSetInfo remote = get_set(req, at);
    std::unique_lock lk(mu);
    Peer& p = peer_entry(from);
    if (p.state == PeerState::kConnecting && name < from) {
      // Both sides are connecting: the engine with the smaller name initiates.
      tcp::put_u32(reply, kBusy);
      tcp::put_bytes(reply, {});
    } else {
      std::vector<Qp*> set = create_qps(p, static_cast<uint32_t>(remote.qps.size()));
      const std::vector<uint32_t> mine = psns;
      try {
        install_qps(p, set, remote, mine, due);
      } catch (...) {
        for (Qp* q : set) destroy_qp(q);
        throw;
      }
      tcp::put_u32(reply, kOk);
      tcp::put_bytes(reply, {});
      put_set(reply, local_info(set));
    }
  } catch (const std::exception& e) {
    reply.resize(4);
    tcp::put_u32(reply, kRefused);
    tcp::put_bytes(reply, e.what());
  }
  send_frame(fd.get(), reply, deadline);
  for (auto& [cb, args] : due) cb(args.first, args.second);
}

Peer& Engine::Impl::ensure_connected(std::unique_lock<std::mutex>& lk, const std::string& peer,
                                     const detail::PeerRecord* record) {
  Peer& p = peer_entry(peer);
  const auto until = Clock::now() + opt.connect_timeout;
  const std::string who = "kv engine '" + name + "': peer '" + peer + "'";
  while (p.state == PeerState::kConnecting)
    if (clock::wait_until(cv, lk, until) == std::cv_status::timeout)
      throw KvError(who + ": handshake still running after " +
                        std::to_string(opt.connect_timeout.count()) + " ms",
                    peer);
  if (p.state == PeerState::kConnected) return p;

  p.state = PeerState::kConnecting;
  std::vector<Qp*> set;
  try {
    set = create_qps(p, opt.qps_per_peer);
  } catch (...) {
    p.state = PeerState::kBroken;
    cv.notify_all();
    throw;
  }
  const std::vector<uint32_t> mine = psns;
  std::string req;
  tcp::put_u32(req, kRequestMagic);
  tcp::put_u32(req, kVersion);
  tcp::put_bytes(req, name);
  put_set(req, local_info(set));
  lk.unlock();

  std::string error, reply;
  uint32_t status = kRefused;
  QpSetInfo remote;
  try {
    std::optional<detail::PeerRecord> fetched;
    if (!record) {
      std::optional<std::string> text = store->get("softrdma-kv/" + peer);
      if (!text) throw std::runtime_error("no engine '" + peer + "' in " + store->describe());
      fetched = detail::parse_record(*text);
      record = &*fetched;
    }
    const auto deadline = tcp::Clock::now() + opt.connect_timeout;
    tcp::Fd fd = tcp::connect_tcp(record->host, record->port, deadline, false);
    if (!send_frame(fd.get(), req, deadline) || !recv_frame(fd.get(), reply, deadline))
      throw std::runtime_error("the handshake with " + record->host + ":" +
                               std::to_string(record->port) + " (pid " +
                               std::to_string(record->pid) + ") got no answer");
    size_t at = 8;
    if (reply.size() < 8 || tcp::get_u32(reply, 0) != kReplyMagic)
      throw std::runtime_error("malformed handshake reply");
    status = tcp::get_u32(reply, 4);
    const std::string text = get_bytes(reply, at);
    if (status == kRefused) throw std::runtime_error("refused the handshake: " + text);
    if (status == kOk) remote = get_set(reply, at);
  } catch (const std::exception& e) {
    error = e.what();
  }

  lk.lock();
  detail::DueCallbacks due;
  auto drop = [&](const std::string& why) {
    for (Qp* q : set) destroy_qp(q);
    if (p.state == PeerState::kConnecting) p.state = PeerState::kBroken;
    p.broken_reason = why;
    cv.notify_all();
    throw KvError(who + ": " + why, peer);
  };
  if (!error.empty()) drop(error);
  if (status == kBusy) {
    // The peer is connecting to this engine at the same time and wins: its handshake
    // arrives at this engine's listener.
    for (Qp* q : set) destroy_qp(q);
    set.clear();
    if (!clock::wait_until(cv, lk, until, [&] { return p.state == PeerState::kConnected; }))
      drop("the peer's own handshake did not arrive");
    return p;
  }
  try {
    install_qps(p, set, remote, mine, due);
  } catch (const std::exception& e) {
    drop(e.what());
  }
  if (!due.empty()) {
    lk.unlock();
    for (auto& [cb, args] : due) cb(args.first, args.second);
    lk.lock();
  }
  return p;
}

}  // namespace softrdma::kv
