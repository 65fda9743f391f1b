#include "cm/verbs_mad_transport.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <time.h>

#include <cerrno>
#include <cstring>

#include "base/clock.h"
#include "cm/address.h"
#include "cm/log.h"

namespace softrdma::cm {
namespace {

constexpr size_t kGrhBytes = 40;
constexpr size_t kRecvSlotBytes = kGrhBytes + kMadBytes;
constexpr uint64_t kRecvTag = 1ull << 63;  ///< wr_id bit: a receive slot (else a send slot)

/// The drop-in libibverbs' QP1 hook (verbs/softrdma_private.h, SOFTRDMA_PRIVATE_1.0).
using CreateQp1 = ibv_qp* (*)(ibv_pd*, ibv_qp_init_attr*);

/// The IPv4 source of a received UD packet from its 40-byte GRH area. On RoCEv2 over IPv4
/// the area holds the IPv4 header in its last 20 bytes (rdma-core's convention, what rxe and
/// NICs write); a GRH with an IPv4-mapped source GID is read too. 0 when neither.
uint32_t source_ip(const uint8_t* grh) {
  const uint8_t* ip4 = grh + 20;
  if ((ip4[0] >> 4) == 4)
    return uint32_t(ip4[12]) << 24 | uint32_t(ip4[13]) << 16 | uint32_t(ip4[14]) << 8 | ip4[15];
  uint8_t sgid[16];
  std::memcpy(sgid, grh + 8, sizeof sgid);
  return gid_ipv4(sgid);
}

}  // namespace

std::unique_ptr<VerbsMadTransport> VerbsMadTransport::create(ibv_context* ctx, std::string& error,
                                                             int& err) {
  auto create_qp1 = reinterpret_cast<CreateQp1>(::dlsym(RTLD_DEFAULT, "softrdma_create_qp1"));
  if (!create_qp1) {
    error =
        "softrdma's librdmacm needs softrdma's libibverbs.so.1 (its QP1 hook "
        "softrdma_create_qp1 is missing: run the program with `softrdma run`, or put softrdma's "
        "build/lib first in LD_LIBRARY_PATH)";
    err = ENOSYS;
    return nullptr;
  }
  std::unique_ptr<VerbsMadTransport> t(new VerbsMadTransport);
  t->ctx_ = ctx;
  auto fail = [&](const char* what) -> std::unique_ptr<VerbsMadTransport> {
    err = errno ? errno : EINVAL;
    error = std::string("cannot set up QP1: ") + what + ": " + std::strerror(err);
    return nullptr;
  };
  errno = 0;
  if (!(t->pd_ = ibv_alloc_pd(ctx))) return fail("ibv_alloc_pd");
  if (!(t->channel_ = ibv_create_comp_channel(ctx))) return fail("ibv_create_comp_channel");
  if (!(t->cq_ = ibv_create_cq(ctx, int(kRecvSlots + kSendSlots), nullptr, t->channel_, 0)))
    return fail("ibv_create_cq");
  t->buffers_.assign(kRecvSlots * kRecvSlotBytes + kSendSlots * kMadBytes, 0);
  if (!(t->mr_ =
            ibv_reg_mr(t->pd_, t->buffers_.data(), t->buffers_.size(), IBV_ACCESS_LOCAL_WRITE)))
    return fail("ibv_reg_mr");
  t->send_busy_.assign(kSendSlots, false);
  ibv_qp_init_attr attr{};
  attr.send_cq = t->cq_;
  attr.recv_cq = t->cq_;
  attr.qp_type = IBV_QPT_UD;
  attr.cap.max_send_wr = kSendSlots;
  attr.cap.max_recv_wr = kRecvSlots;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.sq_sig_all = 1;
  if (!(t->qp_ = create_qp1(t->pd_, &attr))) return fail("softrdma_create_qp1");
  // The GSI is ready at once on a kernel device; move a QP1 handed back in RESET along.
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  if (ibv_query_qp(t->qp_, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_RESET) {
    ibv_qp_attr m{};
    m.qp_state = IBV_QPS_INIT;
    m.pkey_index = 0;
    m.port_num = 1;
    m.qkey = kGsiQkey;
    if ((errno = ibv_modify_qp(t->qp_, &m,
                               IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)))
      return fail("QP1 to INIT");
    m = {};
    m.qp_state = IBV_QPS_RTR;
    if ((errno = ibv_modify_qp(t->qp_, &m, IBV_QP_STATE))) return fail("QP1 to RTR");
    m.qp_state = IBV_QPS_RTS;
    m.sq_psn = 0;
    if ((errno = ibv_modify_qp(t->qp_, &m, IBV_QP_STATE | IBV_QP_SQ_PSN)))
      return fail("QP1 to RTS");
  }
  for (size_t i = 0; i < kRecvSlots; ++i)
    if (!t->post_recv(i)) return fail("posting QP1 receives");
  t->arm();
  return t;
}

VerbsMadTransport::~VerbsMadTransport() {
  if (qp_) ibv_destroy_qp(qp_);
  for (auto& [ip, ah] : ahs_) ibv_destroy_ah(ah);
  if (mr_) ibv_dereg_mr(mr_);
  if (cq_) ibv_destroy_cq(cq_);
  if (channel_) ibv_destroy_comp_channel(channel_);
  if (pd_) ibv_dealloc_pd(pd_);
}

bool VerbsMadTransport::post_recv(size_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(buffers_.data() + slot * kRecvSlotBytes);
  sge.length = kRecvSlotBytes;
  sge.lkey = mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = kRecvTag | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp_, &wr, &bad) == 0;
}

ibv_ah* VerbsMadTransport::ah_for(uint32_t ip) {
  if (auto it = ahs_.find(ip); it != ahs_.end()) return it->second;
  ibv_ah_attr a{};
  a.is_global = 1;
  a.port_num = 1;
  a.grh.sgid_index = 0;
  a.grh.hop_limit = 64;
  a.grh.dgid = ipv4_gid(ip);
  ibv_ah* ah = ibv_create_ah(pd_, &a);
  if (ah) ahs_.emplace(ip, ah);
  return ah;
}

void VerbsMadTransport::send(const MadAddress& to, std::span<const uint8_t, kMadBytes> mad) {
  if (log().should_log(spdlog::level::debug))
    log().debug("MAD {} (TID {:#x}) → {} QP {}", attr_name(uint16_t(mad[16] << 8 | mad[17])),
                uint64_t(mad[8]) << 56 | uint64_t(mad[9]) << 48 | uint64_t(mad[10]) << 40 |
                    uint64_t(mad[11]) << 32 | uint64_t(mad[12]) << 24 | uint64_t(mad[13]) << 16 |
                    uint64_t(mad[14]) << 8 | mad[15],
                ip_string(to.ip), to.qpn);
  // Reap finished sends first, so a burst of MADs finds free slots.
  poll(nullptr);
  size_t slot = kSendSlots;
  for (size_t i = 0; i < kSendSlots; ++i) {
    size_t s = (next_send_ + i) % kSendSlots;
    if (!send_busy_[s]) {
      slot = s;
      break;
    }
  }
  ibv_ah* ah = slot < kSendSlots ? ah_for(to.ip) : nullptr;
  if (!ah) {
    ++send_drops_;
    return;
  }
  next_send_ = (slot + 1) % kSendSlots;
  uint8_t* buf = buffers_.data() + kRecvSlots * kRecvSlotBytes + slot * kMadBytes;
  std::memcpy(buf, mad.data(), kMadBytes);
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(buf);
  sge.length = kMadBytes;
  sge.lkey = mr_->lkey;
  ibv_send_wr wr{};
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = to.qpn;
  wr.wr.ud.remote_qkey = kGsiQkey;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_, &wr, &bad) != 0) {
    ++send_drops_;
    return;
  }
  send_busy_[slot] = true;
}

size_t VerbsMadTransport::sends_in_flight() const {
  size_t n = 0;
  for (bool busy : send_busy_) n += busy;
  return n;
}

uint64_t VerbsMadTransport::now_ns() {
  return clock::now_ns();
}

int VerbsMadTransport::event_fd() const {
  return channel_->fd;
}

void VerbsMadTransport::arm() {
  // Drain the channel (non-blocking): each event read is acknowledged.
  int flags = ::fcntl(channel_->fd, F_GETFL);
  if (!(flags & O_NONBLOCK)) ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK);
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  unsigned events = 0;
  while (events < 1024 && ibv_get_cq_event(channel_, &cq, &ctx) == 0) ++events;
  if (events) ibv_ack_cq_events(cq_, events);
  ibv_req_notify_cq(cq_, 0);
}

size_t VerbsMadTransport::poll(
    const std::function<void(std::span<const uint8_t>, const MadAddress&)>& on_mad) {
  size_t received = 0;
  if (on_mad) {
    // MADs reaped by send() (which polls to free its slots) wait here for a handler.
    std::vector<Received> pending;
    pending.swap(pending_);
    for (const Received& r : pending) {
      ++received;
      on_mad(std::span<const uint8_t>(r.bytes.data(), r.length), r.from);
    }
  }
  ibv_wc wc[16];
  for (size_t round = 0; round < (kRecvSlots + kSendSlots) / 16 + 1; ++round) {
    int n = ibv_poll_cq(cq_, 16, wc);
    if (n <= 0) break;
    for (int i = 0; i < n; ++i) {
      const ibv_wc& w = wc[i];
      if (!(w.wr_id & kRecvTag)) {
        if (w.wr_id < kSendSlots) send_busy_[w.wr_id] = false;
        if (w.status != IBV_WC_SUCCESS) ++send_drops_;
        continue;
      }
      const size_t slot = w.wr_id & ~kRecvTag;
      if (slot >= kRecvSlots) continue;
      const uint8_t* buf = buffers_.data() + slot * kRecvSlotBytes;
      const uint32_t from = (w.wc_flags & IBV_WC_GRH) ? source_ip(buf) : 0;
      if (w.status != IBV_WC_SUCCESS || from == 0) {
        ++recv_drops_;
      } else {
        const size_t len = std::min(w.byte_len > kGrhBytes ? w.byte_len - kGrhBytes : 0, kMadBytes);
        if (log().should_log(spdlog::level::debug) && len >= 18)
          log().debug("MAD {} ← {} QP {}{}",
                      attr_name(uint16_t(buf[kGrhBytes + 16] << 8 | buf[kGrhBytes + 17])),
                      ip_string(from), w.src_qp, on_mad ? "" : " (kept for the CM thread)");
        if (on_mad) {
          ++received;
          on_mad(std::span<const uint8_t>(buf + kGrhBytes, len), MadAddress{from, w.src_qp});
        } else if (pending_.size() < kRecvSlots) {
          Received r{{}, len, MadAddress{from, w.src_qp}};
          std::memcpy(r.bytes.data(), buf + kGrhBytes, len);
          pending_.push_back(r);
        } else {
          ++recv_drops_;
        }
      }
      if (w.status != IBV_WC_WR_FLUSH_ERR) post_recv(slot);
    }
  }
  return received;
}

}  // namespace softrdma::cm
