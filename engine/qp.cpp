#include "engine/qp.h"

#include <algorithm>
#include <iterator>
#include <mutex>

#include "engine/cq.h"
#include "engine/log.h"

namespace softrdma::engine {

namespace {

// Bits an application may give qp_access_flags: the ibv_access_flags an MR takes too (the
// kernel passes them through; only the remote ones mean something on a QP, the others —
// ON_DEMAND in pyverbs' ODP tests, MW_BIND — are accepted and ignored, as rxe does).
constexpr uint32_t kAccessAllowedOnQp = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic |
                                        kMwBind | kZeroBased | kOnDemand | kHugetlb |
                                        kRelaxedOrdering;

// Required and optional attribute masks of each valid RC transition (IBTA vol 1 table 91;
// the same table Linux keeps in ib_modify_qp_is_ok()). A transition absent here is invalid.
struct Transition {
  QpState from, to;
  uint32_t required, optional;
};

constexpr Transition kRcTransitions[] = {
    {QpState::kReset, QpState::kReset, 0, 0},
    {QpState::kReset, QpState::kInit, kAttrPkeyIndex | kAttrPort | kAttrAccessFlags, 0},
    {QpState::kInit, QpState::kInit, 0, kAttrPkeyIndex | kAttrPort | kAttrAccessFlags},
    {QpState::kInit, QpState::kRtr,
     kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic | kAttrMinRnrTimer,
     kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex | kAttrRateLimit},
    {QpState::kRtr, QpState::kRts,
     kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrSqPsn | kAttrMaxQpRdAtomic,
     kAttrCurState | kAttrAltPath | kAttrAccessFlags | kAttrMinRnrTimer | kAttrPathMigState |
         kAttrRateLimit},
    {QpState::kRts, QpState::kRts, 0,
     kAttrCurState | kAttrAccessFlags | kAttrAltPath | kAttrPathMigState | kAttrMinRnrTimer |
         kAttrRateLimit},
    {QpState::kRts, QpState::kSqd, 0, kAttrEnSqdAsyncNotify},
    {QpState::kSqd, QpState::kRts, 0,
     kAttrCurState | kAttrAccessFlags | kAttrAltPath | kAttrPathMigState | kAttrMinRnrTimer |
         kAttrRateLimit},
    {QpState::kSqd, QpState::kSqd, 0,
     kAttrPort | kAttrAv | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic |
         kAttrMaxDestRdAtomic | kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex |
         kAttrMinRnrTimer | kAttrPathMigState},
    // SQE → RTS exists for UC/UD only; an RC QP never enters SQE (errors go to ERR).
};

const char* state_name(QpState s) {
  static constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  const auto i = static_cast<size_t>(s);
  return i < std::size(kNames) ? kNames[i] : "?";
}

const Transition* find_transition(QpState from, QpState to) {
  if (to == QpState::kReset || to == QpState::kErr) {
    static constexpr Transition kAny{QpState::kReset, QpState::kReset, 0, 0};
    return &kAny;  // any state may go to RESET or ERR with no other attribute
  }
  for (const auto& t : kRcTransitions)
    if (t.from == from && t.to == to) return &t;
  return nullptr;
}

}  // namespace

QueuePair::QueuePair(ObjectRegistry& dev, ProtectionDomain& pd, CompletionQueue& scq,
                     CompletionQueue& rcq, const QpCap& c, bool sig_all)
    : cap(c),
      sq_sig_all(sig_all),
      send_cq(scq),
      recv_cq(rcq),
      transport(&dev.transport()),
      dev_(dev),
      pd_(pd) {
  std::lock_guard lk(dev_.mutex());
  qpn_ = dev_.register_qp(this);
  pd_.users++;
  send_cq.users++;
  recv_cq.users++;
}

QueuePair::~QueuePair() {
  std::lock_guard lk(dev_.mutex());
  dev_.unregister_qp(qpn_);
  pd_.users--;
  send_cq.users--;
  recv_cq.users--;
}

Status QueuePair::validate_cap(const QpCap& c) {
  if (c.max_send_wr > DeviceLimits::kMaxQpWr || c.max_recv_wr > DeviceLimits::kMaxQpWr ||
      c.max_send_sge > DeviceLimits::kMaxSge || c.max_recv_sge > DeviceLimits::kMaxSge ||
      c.max_inline_data > DeviceLimits::kMaxInlineData)
    return std::errc::invalid_argument;
  return kOk;
}

void QueuePair::transmit_pending_requests() {
  requester::run(*this, *transport);
  transport->flush();
}

uint64_t QueuePair::retransmit_timeout_ns() const {
  if (attr.timeout == 0) return 0;
  uint64_t ns = 4096ull << attr.timeout;  // 4.096 µs · 2^timeout
  return std::max<uint64_t>(ns, 1'000'000);
}

uint64_t QueuePair::next_deadline() const {
  uint64_t d = comp.timer_ns;
  if (comp.rnr_ns && (!d || comp.rnr_ns < d)) d = comp.rnr_ns;
  if (comp.pace_ns && (!d || comp.pace_ns < d)) d = comp.pace_ns;
  if (comp.resend_check_ns && (!d || comp.resend_check_ns < d)) d = comp.resend_check_ns;
  return d;
}

Status QueuePair::modify(const QpAttr& a, uint32_t mask) {
  std::lock_guard lk(dev_.mutex());
  ModifyPlan plan;
  if (Status st = validate_modify(a, mask, plan); st != kOk) return st;
  apply_modify(a, mask, plan);
  return kOk;
}

Status QueuePair::validate_modify(const QpAttr& a, uint32_t mask, ModifyPlan& plan) const {
  // Each refusal names the attribute (its ibv_qp_attr_mask bit) and why (rxe logs the
  // same in rxe_qp_chk_attr); the caller sees only EINVAL.
  auto refuse = [&](const char* attribute, const char* why) {
    log().debug("qp {:#x}: modify_qp refused: {} {}", qpn_, attribute, why);
    return std::errc::invalid_argument;
  };
  const QpState cur = attr.state;
  if ((mask & kAttrCurState) && a.cur_state != cur)
    return refuse("IBV_QP_CUR_STATE", "is not the QP's current state");
  plan.next = (mask & kAttrState) ? a.state : cur;
  const Transition* t = find_transition(cur, plan.next);
  if (!t) {
    log().debug("qp {:#x}: modify_qp refused: IBV_QP_STATE {} → {} is not an RC transition", qpn_,
                state_name(cur), state_name(plan.next));
    return std::errc::invalid_argument;
  }
  const uint32_t given = mask & ~(kAttrState | kAttrCurState);
  if ((given & t->required) != t->required) {
    log().debug("qp {:#x}: modify_qp refused: mask {:#x} lacks required attributes {:#x}", qpn_,
                mask, t->required & ~given);
    return std::errc::invalid_argument;
  }
  if (given & ~(t->required | t->optional | kAttrCurState)) {
    log().debug("qp {:#x}: modify_qp refused: attributes {:#x} not allowed in this transition",
                qpn_, given & ~(t->required | t->optional | kAttrCurState));
    return std::errc::invalid_argument;
  }

  // Field ranges (ibv_modify_qp(3), IBTA 10.3.1 / 9.7).
  if ((mask & kAttrPort) && a.port_num != 1) return refuse("IBV_QP_PORT", "is not 1");
  if ((mask & kAttrPkeyIndex) && a.pkey_index != 0) return refuse("IBV_QP_PKEY_INDEX", "is not 0");
  if ((mask & kAttrAccessFlags) && (a.access_flags & ~kAccessAllowedOnQp))
    return refuse("IBV_QP_ACCESS_FLAGS", "has bits that are no ibv_access_flags");
  if ((mask & kAttrPathMtu) && (a.path_mtu < 1 || a.path_mtu > dev_.active_mtu()))
    return refuse("IBV_QP_PATH_MTU", "is outside 1 … the port's active MTU");
  if ((mask & kAttrDestQpn) && a.dest_qp_num > wire::kQpnMask)
    return refuse("IBV_QP_DEST_QPN", "does not fit 24 bits");
  if ((mask & kAttrTimeout) && a.timeout > 31) return refuse("IBV_QP_TIMEOUT", "is over 31");
  if ((mask & kAttrRetryCnt) && a.retry_cnt > 7) return refuse("IBV_QP_RETRY_CNT", "is over 7");
  if ((mask & kAttrRnrRetry) && a.rnr_retry > 7) return refuse("IBV_QP_RNR_RETRY", "is over 7");
  if ((mask & kAttrMinRnrTimer) && a.min_rnr_timer > 31)
    return refuse("IBV_QP_MIN_RNR_TIMER", "is over 31");
  if ((mask & kAttrMaxQpRdAtomic) && a.max_rd_atomic > DeviceLimits::kMaxQpRdAtom)
    return refuse("IBV_QP_MAX_QP_RD_ATOMIC", "is over the device's max_qp_rd_atom");
  if ((mask & kAttrMaxDestRdAtomic) && a.max_dest_rd_atomic > DeviceLimits::kMaxQpRdAtom)
    return refuse("IBV_QP_MAX_DEST_RD_ATOMIC", "is over the device's max_qp_rd_atom");
  plan.peer_ip = 0;
  if (mask & kAttrAv) {
    // RoCE carries every packet in IP/UDP: the address vector must hold a GRH with an
    // IPv4-mapped destination GID, from our only source GID (index 0).
    if (!a.ah.is_global) return refuse("IBV_QP_AV", "has no GRH (RoCE needs one)");
    if (a.ah.sgid_index != 0) return refuse("IBV_QP_AV", "sgid_index is not 0");
    if (a.ah.port_num > 1) return refuse("IBV_QP_AV", "port_num is over 1");
    if (!a.ah.dgid.to_ipv4(plan.peer_ip) || plan.peer_ip == 0)
      return refuse("IBV_QP_AV", "dgid is not an IPv4-mapped address");
  }
  return kOk;
}

void QueuePair::apply_modify(const QpAttr& a, uint32_t mask, const ModifyPlan& plan) {
  const QpState cur = attr.state, next = plan.next;
  if (mask & kAttrPort) attr.port_num = a.port_num;
  if (mask & kAttrPkeyIndex) attr.pkey_index = a.pkey_index;
  if (mask & kAttrAccessFlags) attr.access_flags = a.access_flags;
  if (mask & kAttrPathMtu) {
    attr.path_mtu = a.path_mtu;
    mtu = mtu_bytes(a.path_mtu);
  }
  if (mask & kAttrDestQpn) attr.dest_qp_num = a.dest_qp_num;
  if (mask & kAttrRqPsn) attr.rq_psn = a.rq_psn & wire::kPsnMask;
  if (mask & kAttrSqPsn) attr.sq_psn = a.sq_psn & wire::kPsnMask;
  if (mask & kAttrTimeout) attr.timeout = a.timeout;
  if (mask & kAttrRetryCnt) attr.retry_cnt = a.retry_cnt;
  if (mask & kAttrRnrRetry) attr.rnr_retry = a.rnr_retry;
  if (mask & kAttrMinRnrTimer) attr.min_rnr_timer = a.min_rnr_timer;
  if (mask & kAttrMaxQpRdAtomic) attr.max_rd_atomic = a.max_rd_atomic;
  if (mask & kAttrMaxDestRdAtomic) attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & kAttrEnSqdAsyncNotify) attr.en_sqd_async_notify = a.en_sqd_async_notify;
  if (mask & kAttrAv) {
    attr.ah = a.ah;
    remote_ip = plan.peer_ip;
  }
  if (mask & kAttrRqPsn) resp.epsn = attr.rq_psn;
  if (mask & kAttrSqPsn) {
    req.psn = req.max_psn = comp.psn = attr.sq_psn;
  }
  if (mask & kAttrRetryCnt) comp.retry_left = attr.retry_cnt;
  if (mask & kAttrRnrRetry) comp.rnr_retry_left = attr.rnr_retry;

  if (next == cur) return;
  attr.state = next;
  switch (next) {
    case QpState::kReset:
      // RESET discards both queues without completions and forgets transport state, and
      // the completions of this QP still in its CQs (as mlx5_ib_cq_clean on RESET).
      send_cq.purge_qp(qpn_);
      if (&recv_cq != &send_cq) recv_cq.purge_qp(qpn_);
      sq.clear();
      rq.clear();
      sq_base = 0;
      req = RequesterState{};
      comp = CompleterState{};
      resp = ResponderState{};
      remote_ip = 0;
      attr = QpAttr{};
      break;
    case QpState::kErr:
      flush_queues();
      break;
    case QpState::kRts:
      if (cur == QpState::kSqd) attr.sq_draining = false;
      transmit_pending_requests();
      break;
    case QpState::kSqd:
      attr.sq_draining = true;
      break;
    default:
      break;
  }
}

QpAttr QueuePair::query() const {
  std::lock_guard lk(dev_.mutex());
  QpAttr a = attr;
  a.cur_state = attr.state;
  a.cap = cap;
  if (attr.state == QpState::kSqd) {
    // Drained once every started WQE has completed.
    a.sq_draining = !sq.empty() && sq.front().started;
  }
  return a;
}

Status QueuePair::post_send_locked(const SendWr& wr) {
  if (attr.state == QpState::kReset || attr.state == QpState::kInit || attr.state == QpState::kRtr)
    return std::errc::invalid_argument;
  if (wr.num_sge > cap.max_send_sge) return std::errc::invalid_argument;
  if (wr.num_sge && !wr.sg_list) return std::errc::invalid_argument;
  if (!wr_opcode_supported(static_cast<uint8_t>(wr.opcode))) return std::errc::invalid_argument;
  const WrOpcodeInfo& info = wr_info(wr.opcode);
  uint64_t length = 0;
  for (uint32_t i = 0; i < wr.num_sge; ++i) length += wr.sg_list[i].length;
  if (length > DeviceLimits::kMaxMsgSize) return std::errc::invalid_argument;
  // Atomics: exactly 8 bytes at an 8-byte aligned remote address (IBTA 9.4.5).
  if (info.fixed_length &&
      (length != info.fixed_length || (wr.remote_addr & (info.fixed_length - 1))))
    return std::errc::invalid_argument;
  const bool inl = (wr.flags & kInline) && info.inline_allowed;
  if (inl && length > cap.max_inline_data) return std::errc::invalid_argument;
  if (sq.size() >= cap.max_send_wr) return std::errc::not_enough_memory;

  SendWqe& w = sq.emplace_back();
  w.wr = wr;
  w.wr.sg_list = nullptr;
  w.length = length;
  if (inl) {
    // Inline data is copied now: the caller may reuse its buffer as soon as post returns.
    w.inline_data.resize(length);
    size_t off = 0;
    for (uint32_t i = 0; i < wr.num_sge; ++i) {
      const Sge& s = wr.sg_list[i];
      if (s.length) {
        if (!s.addr) {
          sq.pop_back();
          return std::errc::invalid_argument;
        }
        std::copy_n(reinterpret_cast<const uint8_t*>(s.addr), s.length,
                    w.inline_data.begin() + static_cast<ptrdiff_t>(off));
      }
      off += s.length;
    }
  } else {
    w.sges.assign(wr.sg_list, wr.sg_list + wr.num_sge);
  }
  if (attr.state == QpState::kErr) retire_send(WcStatus::kWrFlushErr);
  return kOk;
}

Status QueuePair::post_send(const SendWr& wr) {
  size_t bad = 0;
  return post_send_batch(&wr, 1, bad);
}

Status QueuePair::post_send_batch(const SendWr* wrs, size_t n, size_t& bad) {
  std::lock_guard lk(dev_.mutex());
  Status st = kOk;
  size_t i = 0;
  for (; i < n; ++i) {
    st = post_send_locked(wrs[i]);
    if (st != kOk) break;
  }
  bad = i;
  if (i > 0) transmit_pending_requests();
  return st;
}

Status QueuePair::post_recv(uint64_t wr_id, const Sge* sges, uint32_t num_sge) {
  std::lock_guard lk(dev_.mutex());
  if (attr.state == QpState::kReset) return std::errc::invalid_argument;
  if (num_sge > cap.max_recv_sge || (num_sge && !sges)) return std::errc::invalid_argument;
  if (rq.size() >= cap.max_recv_wr) return std::errc::not_enough_memory;
  RecvWqe& r = rq.emplace_back();
  r.wr_id = wr_id;
  r.sges.assign(sges, sges + num_sge);
  for (const Sge& s : r.sges) r.length += s.length;
  if (attr.state == QpState::kErr) {
    // Already in error: complete at once, as flush would have.
    rq.pop_back();
    Cqe c;
    c.wr_id = wr_id;
    c.status = WcStatus::kWrFlushErr;
    c.opcode = WcOpcode::kRecv;
    c.qp_num = qpn_;
    recv_cq.push(c, false);
  }
  return kOk;
}

void QueuePair::retire_send(WcStatus status, uint32_t byte_len) {
  for (;;) {
    SendWqe& w = sq.front();
    if (status != WcStatus::kSuccess || sq_sig_all || (w.wr.flags & kSignaled)) {
      Cqe c;
      c.wr_id = w.wr.wr_id;
      c.status = status;
      c.opcode = w.info().wc_opcode;
      c.byte_len = byte_len;
      c.qp_num = qpn_;
      send_cq.push(c, false);
    }
    sq.pop_front();
    ++sq_base;
    if (req.next < sq_base) {
      req.next = sq_base;
      req.offset = 0;
    }
    // Local operations (BIND_MW, LOCAL_INV) the requester executed behind this WQE
    // complete as soon as everything before them has: they wait for no response. Only
    // successful ones were marked started; a failed one stays unstarted until it reaches
    // the head (requester::run reports it there).
    if (status != WcStatus::kSuccess || sq.empty() || !sq.front().started ||
        sq.front().info().cls != WrClass::kLocal)
      return;
    byte_len = 0;
  }
}

void QueuePair::complete_recv(WcStatus status, WcOpcode opcode, uint32_t byte_len, uint32_t imm_be,
                              uint32_t wc_flags, bool solicited) {
  RecvWqe& r = rq.front();
  Cqe c;
  c.wr_id = r.wr_id;
  c.status = status;
  c.opcode = opcode;
  c.byte_len = byte_len;
  c.imm_be = imm_be;
  c.wc_flags = wc_flags;
  c.qp_num = qpn_;
  c.src_qp = attr.dest_qp_num;
  rq.pop_front();
  transport->deliver_recv_completion(recv_cq, c, solicited);
}

void QueuePair::flush_queues() {
  while (!sq.empty()) retire_send(WcStatus::kWrFlushErr);
  while (!rq.empty()) complete_recv(WcStatus::kWrFlushErr, WcOpcode::kRecv, 0, 0, 0, false);
  comp.timer_ns = comp.rnr_ns = 0;
  comp.rd_atomic_inflight.clear();
  req.rnr_wait = false;
  resp.in_send = resp.in_write = false;
  resp.ack_pending = false;
}

void QueuePair::enter_error(WcStatus status) {
  if (attr.state == QpState::kErr) return;
  if (!sq.empty() && status != WcStatus::kWrFlushErr) retire_send(status);
  attr.state = QpState::kErr;
  flush_queues();
  if (on_error) on_error(status);
}

}  // namespace softrdma::engine
