#include "engine/qp.h"

#include <algorithm>
#include <iterator>
#include <mutex>

#include "engine/ah.h"
#include "engine/cq.h"
#include "engine/log.h"
#include "engine/srq.h"
#include "engine/xrcd.h"

namespace softrdma::engine {

namespace {

// Bits an application may give qp_access_flags: the ibv_access_flags an MR takes too (the
// kernel passes them through; only the remote ones mean something on a QP, the others —
// ON_DEMAND in pyverbs' ODP tests, MW_BIND — are accepted and ignored, as rxe does).
constexpr uint32_t kAccessAllowedOnQp = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic |
                                        kMwBind | kZeroBased | kOnDemand | kHugetlb |
                                        kRelaxedOrdering;

const char* state_name(QpState s) {
  static constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  const auto i = static_cast<size_t>(s);
  return i < std::size(kNames) ? kNames[i] : "?";
}

const QpTransition* find_transition(const QpTypeInfo& type, QpState from, QpState to) {
  if (to == QpState::kReset || to == QpState::kErr) {
    static constexpr QpTransition kAny{QpState::kReset, QpState::kReset, 0, 0};
    return &kAny;  // any state may go to RESET or ERR with no other attribute
  }
  for (const auto& t : type.transitions)
    if (t.from == from && t.to == to) return &t;
  return nullptr;
}

}  // namespace

QueuePair::QueuePair(ObjectRegistry& dev, const QpInit& init)
    : srq(init.srq),
      xrcd(init.xrcd),
      cap(init.cap),
      sq_sig_all(init.sq_sig_all),
      send_cq(init.send_cq),
      recv_cq(init.recv_cq),
      transport(&dev.transport()),
      sq_memory(init.sq_memory),
      rq_memory(init.rq_memory),
      sq(resource_of(sq_memory)),
      rq(resource_of(rq_memory)),
      dev_(dev),
      type_(qp_type_info(init.type)),
      pd_(init.pd) {
  // A UD QP has no path MTU attribute: its messages are bounded by the port's MTU.
  if (type_->single_packet) mtu = mtu_bytes(dev.active_mtu());
  std::lock_guard lk(dev_.mutex());
  if (init.qpn == 0)
    qpn_ = dev_.register_qp(this);
  else if (dev_.register_qp_at(this, init.qpn))
    qpn_ = init.qpn;
  else
    return;  // the QPN is taken: qpn() == 0, nothing to undo
  if (pd_) pd_->users++;
  if (send_cq) send_cq->users++;
  if (recv_cq) recv_cq->users++;
  if (srq) srq->users++;
  if (xrcd) xrcd->users++;
}

QueuePair::QueuePair(ObjectRegistry& dev, ProtectionDomain& pd, CompletionQueue& scq,
                     CompletionQueue& rcq, const QpCap& c, bool sig_all)
    : QueuePair(dev, QpInit{.type = QpType::kRc,
                            .pd = &pd,
                            .send_cq = &scq,
                            .recv_cq = &rcq,
                            .cap = c,
                            .sq_sig_all = sig_all}) {}

QueuePair::~QueuePair() {
  std::lock_guard lk(dev_.mutex());
  if (qpn_ == 0) return;
  release_recv_wqe();
  dev_.publish_qp(*this, true);
  dev_.unregister_qp(qpn_);
  if (pd_) pd_->users--;
  if (send_cq) send_cq->users--;
  if (recv_cq) recv_cq->users--;
  if (srq) srq->users--;
  if (xrcd) xrcd->users--;
}

Status QueuePair::validate_init(const QpInit& in) {
  const QpTypeInfo* t = qp_type_info(in.type);
  if (!t) return std::errc::operation_not_supported;
  const bool needs_pd = in.type != QpType::kXrcRecv;
  if (needs_pd != (in.pd != nullptr)) return std::errc::invalid_argument;
  if (t->has_send_queue && !in.send_cq) return std::errc::invalid_argument;
  if (t->has_recv_queue && !in.recv_cq) return std::errc::invalid_argument;
  if (in.srq && (!t->has_recv_queue || in.srq->kind() != SharedReceiveQueue::Kind::kBasic))
    return std::errc::invalid_argument;
  if ((in.type == QpType::kXrcRecv) != (in.xrcd != nullptr)) return std::errc::invalid_argument;
  return validate_cap(in.cap);
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
  if (!type_->reliable) complete_sent_unreliable();
}

void QueuePair::complete_sent_unreliable() {
  // The requester has moved past every WQE it sent whole (IBTA: UC and UD complete a send
  // WQE once its packets are on the wire; rxe's completer does so at the last packet).
  while (sq_base < req.next)
    retire_send(WcStatus::kSuccess, static_cast<uint32_t>(sq.front().length));
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
  if (comp.probe_ns && (!d || comp.probe_ns < d)) d = comp.probe_ns;
  return d;
}

Status QueuePair::modify(const QpAttr& a, uint32_t mask) {
  std::lock_guard lk(dev_.mutex());
  ModifyPlan plan;
  if (Status st = validate_modify(a, mask, plan); st != kOk) return st;
  if ((plan.next == QpState::kErr || plan.next == QpState::kReset) && accepts_requests()) {
    // Placed WRITEs the application may have seen get their ACKs: no same-host sender may
    // place into the QP any more (withdrawing waits for one that holds it pinned, between
    // its copy and its headers), and what they sent is processed.
    dev_.publish_qp(*this, true);
    dev_.drain_inbound();
  }
  apply_modify(a, mask, plan);
  dev_.publish_qp(*this, false);
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
  const QpTransition* t = find_transition(*type_, cur, plan.next);
  if (!t) {
    log().debug("qp {:#x}: modify_qp refused: IBV_QP_STATE {} → {} is not an {} transition", qpn_,
                state_name(cur), state_name(plan.next), type_->name);
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
    const char* why = nullptr;
    if (check_address_vector(a.ah, /*port_may_be_zero=*/true, plan.peer_ip, why) != kOk)
      return refuse("IBV_QP_AV", why);
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
  if (mask & kAttrQkey) attr.qkey = a.qkey;
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
      if (send_cq) send_cq->purge_qp(qpn_);
      if (recv_cq && recv_cq != send_cq) recv_cq->purge_qp(qpn_);
      sq.clear();
      rq.clear();
      release_recv_wqe();  // RESET discards without completions, a WQE held from an SRQ too
      sq_base = 0;
      req = RequesterState{};
      comp = CompleterState{};
      resp = ResponderState{};
      remote_ip = 0;
      attr = QpAttr{};
      if (type_->single_packet) mtu = mtu_bytes(dev_.active_mtu());
      break;
    case QpState::kErr:
      flush_queues();
      last_wqe_reached();
      break;
    case QpState::kRts:
      if (cur == QpState::kSqd) attr.sq_draining = false;
      transmit_pending_requests();
      break;
    case QpState::kSqd:
      attr.sq_draining = true;
      break;
    case QpState::kRtr:
      // Who the peer is now: a later look at its address could find another process in
      // its slot (a restarted peer), and take it for the peer being alive.
      if (type_->connected) peer_pid = dev_.transport().peer_pid(remote_ip, attr.dest_qp_num);
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
  if (!type_->has_send_queue) return std::errc::invalid_argument;
  if (attr.state == QpState::kReset || attr.state == QpState::kInit || attr.state == QpState::kRtr)
    return std::errc::invalid_argument;
  if (wr.num_sge > cap.max_send_sge) return std::errc::invalid_argument;
  if (wr.num_sge && !wr.sg_list) return std::errc::invalid_argument;
  if (!wr_opcode_supported(static_cast<uint8_t>(wr.opcode))) return std::errc::invalid_argument;
  const WrOpcodeInfo& info = wr_info(wr.opcode);
  // UC takes no READ or atomics, UD only SENDs (IBTA 9.4, table 41 of operations per service).
  if (!type_->allows(info.cls)) return std::errc::invalid_argument;
  // An operation the service has no opcode for (SEND with invalidate on UC and UD).
  if (info.cls != WrClass::kLocal && !wire::opcode_info(type_->opcode(info.only)))
    return std::errc::invalid_argument;
  if (!type_->connected && (wr.ud_dst_ip == 0 || wr.remote_qpn > wire::kQpnMask))
    return std::errc::invalid_argument;
  uint64_t length = 0;
  for (uint32_t i = 0; i < wr.num_sge; ++i) length += wr.sg_list[i].length;
  if (length > DeviceLimits::kMaxMsgSize) return std::errc::invalid_argument;
  // Atomics: exactly 8 bytes at an 8-byte aligned remote address (IBTA 9.4.5). ATOMIC
  // WRITE: exactly 8 bytes; its alignment is the responder's check, as in rxe (a misaligned
  // one is NAKed as an invalid request: IBV_WC_REM_INV_REQ_ERR).
  if (info.fixed_length &&
      (length != info.fixed_length ||
       (info.cls == WrClass::kAtomic && (wr.remote_addr & (info.fixed_length - 1)))))
    return std::errc::invalid_argument;
  const bool inl = (wr.flags & kInline) && info.inline_allowed;
  // ATOMIC WRITE's 8 bytes travel in the WQE itself (rxe: wqe->dma.atomic_wr), whatever the
  // QP's max_inline_data: ibv_wr_atomic_write hands them over inline.
  if (inl && length > cap.max_inline_data && info.cls != WrClass::kAtomicWrite)
    return std::errc::invalid_argument;
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
  // A QP with an SRQ, or without a receive queue (XRC), has no RQ to post to.
  if (!type_->has_recv_queue || srq) return std::errc::invalid_argument;
  if (attr.state == QpState::kReset) return std::errc::invalid_argument;
  if (num_sge > cap.max_recv_sge || (num_sge && !sges)) return std::errc::invalid_argument;
  // A WQE taken for a message in progress still counts against the queue's capacity.
  if (rq.size() + (resp.wqe ? 1 : 0) >= cap.max_recv_wr) return std::errc::not_enough_memory;
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
    recv_cq->push(c, false);
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
      send_cq->push(c, false);
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

bool QueuePair::take_recv_wqe() {
  if (resp.wqe) return true;
  if (SharedReceiveQueue* from = resp.xrc_srq ? resp.xrc_srq : srq) {
    RecvWqe w;
    if (!from->take(w)) return false;
    resp.wqe = std::move(w);
    resp.wqe_cq = from->cq() ? from->cq() : recv_cq;
    // An XRC SRQ's CQ is not the QP's: it stays in use (ibv_destroy_cq EBUSY) while this QP
    // holds a WQE bound for it, even if the SRQ goes.
    if (from->cq()) from->cq()->users++;
    return true;
  }
  if (rq.empty()) return false;
  resp.wqe = std::move(rq.front());
  rq.pop_front();
  resp.wqe_cq = recv_cq;
  return true;
}

void QueuePair::complete_recv(WcStatus status, WcOpcode opcode, uint32_t byte_len, uint32_t imm_be,
                              uint32_t wc_flags, bool solicited) {
  complete_recv(status, opcode, byte_len, imm_be, wc_flags, solicited, attr.dest_qp_num);
}

void QueuePair::complete_recv(WcStatus status, WcOpcode opcode, uint32_t byte_len, uint32_t imm_be,
                              uint32_t wc_flags, bool solicited, uint32_t src_qp, uint8_t sl) {
  Cqe c;
  c.wr_id = resp.wqe->wr_id;
  c.status = status;
  c.opcode = opcode;
  c.byte_len = byte_len;
  c.imm_be = imm_be;
  c.wc_flags = wc_flags;
  c.qp_num = qpn_;
  c.src_qp = src_qp;
  c.sl = sl;
  CompletionQueue* cq = resp.wqe_cq;
  release_recv_wqe();
  if (cq) transport->deliver_recv_completion(*cq, c, solicited);
}

void QueuePair::release_recv_wqe() {
  if (resp.wqe && resp.wqe_cq && resp.wqe_cq != recv_cq) resp.wqe_cq->users--;
  resp.wqe.reset();
  resp.wqe_cq = nullptr;
}

ProtectionDomain& QueuePair::responder_pd() const {
  return resp.xrc_srq ? resp.xrc_srq->pd() : *pd_;
}

void QueuePair::flush_queues() {
  while (!sq.empty()) retire_send(WcStatus::kWrFlushErr);
  // The WQE a message in progress holds (taken from the RQ or an SRQ) is the QP's now: it
  // is flushed with the rest (IBTA 10.3.1: WQEs a QP took from an SRQ complete in error).
  if (resp.wqe) complete_recv(WcStatus::kWrFlushErr, WcOpcode::kRecv, 0, 0, 0, false);
  while (!rq.empty()) {
    take_recv_wqe();
    complete_recv(WcStatus::kWrFlushErr, WcOpcode::kRecv, 0, 0, 0, false);
  }
  comp.timer_ns = comp.rnr_ns = 0;
  comp.rd_atomic_inflight.clear();
  req.recovery = Recovery::kNone;
  req.recovery_end = kNoPsn;
  resp.in_send = resp.in_write = false;
  resp.ack_pending = false;
  resp.pending.clear();
}

void QueuePair::enter_error(WcStatus status) {
  if (attr.state == QpState::kErr) return;
  if (!sq.empty() && status != WcStatus::kWrFlushErr) retire_send(status);
  attr.state = QpState::kErr;
  dev_.publish_qp(*this, true);
  flush_queues();
  if (on_error) on_error(status);
  last_wqe_reached();
}

void QueuePair::last_wqe_reached() {
  if (srq && on_last_wqe_reached) on_last_wqe_reached();
}

}  // namespace softrdma::engine
