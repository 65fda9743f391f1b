// ibv_qp: creation (ibv_create_qp, ibv_create_qp_ex through verbs_context), the state
// machine's attributes (modify/query), and posting (ibv_post_send / ibv_post_recv through
// context->ops).
#include <cstring>
#include <vector>

#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

static_assert(sizeof(ibv_sge) == sizeof(engine::Sge));
static_assert(offsetof(ibv_sge, lkey) == offsetof(engine::Sge, lkey));
static_assert(IBV_WR_ATOMIC_FETCH_AND_ADD == int(engine::WrOpcode::kFetchAdd) &&
              IBV_WR_LOCAL_INV == int(engine::WrOpcode::kLocalInv) &&
              IBV_WR_BIND_MW == int(engine::WrOpcode::kBindMw) &&
              IBV_WR_SEND_WITH_INV + 1 == int(engine::kWrOpcodeCount));
static_assert(IBV_WC_LOCAL_INV == int(engine::WcOpcode::kLocalInv) &&
              IBV_WC_WITH_INV == int(engine::kWcWithInv));
static_assert(unsigned(IBV_QP_DEST_QPN) == engine::kAttrDestQpn &&
              unsigned(IBV_QP_RATE_LIMIT) == engine::kAttrRateLimit);
static_assert(unsigned(IBV_ACCESS_REMOTE_ATOMIC) == engine::kRemoteAtomic);
static_assert(unsigned(IBV_SEND_INLINE) == engine::kInline &&
              unsigned(IBV_SEND_FENCE) == engine::kFence);
static_assert(IBV_QPS_ERR == int(engine::QpState::kErr));

ibv_qp* create_qp_common(ibv_pd* pd, ibv_qp_init_attr_ex* a) {
  if (a->qp_type != IBV_QPT_RC) return fail<ibv_qp>(EOPNOTSUPP);  // UC/UD/XRC not yet
  if (!a->send_cq || !a->recv_cq) return fail<ibv_qp>(EINVAL);
  if (a->srq) return fail<ibv_qp>(EOPNOTSUPP);
  engine::QpCap cap{a->cap.max_send_wr, a->cap.max_recv_wr, a->cap.max_send_sge,
                    a->cap.max_recv_sge, a->cap.max_inline_data};
  if (engine::QueuePair::validate_cap(cap) != engine::kOk) return fail<ibv_qp>(EINVAL);
  Context* c = to_ctx(pd->context);
  if (a->send_cq->context != pd->context || a->recv_cq->context != pd->context)
    return fail<ibv_qp>(EINVAL);
  auto* q = new Qp{};
  if (!q->slot.take(*c->dev, engine::ObjectKind::kQp)) {
    delete q;
    return fail<ibv_qp>(ENOMEM);  // max_qp reached
  }
  q->qp = std::make_unique<engine::QueuePair>(*c->dev, *to_pd(pd)->pd, *to_cq(a->send_cq)->cq,
                                              *to_cq(a->recv_cq)->cq, cap, a->sq_sig_all != 0);
  ibv_qp& ib = *q->as_qp();
  ib.context = pd->context;
  ib.qp_context = a->qp_context;
  ib.pd = pd;
  ib.send_cq = a->send_cq;
  ib.recv_cq = a->recv_cq;
  ib.srq = nullptr;
  ib.handle = q->qp->qpn();
  ib.qp_num = q->qp->qpn();
  ib.state = IBV_QPS_RESET;
  ib.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&ib.mutex, nullptr);
  pthread_cond_init(&ib.cond, nullptr);
  ibv_qp* handle = &ib;
  q->qp->on_error = [handle](engine::WcStatus status) {
    // Requester errors reach the application in their error CQE, as on hardware; a request
    // the responder refused has no WQE to carry it (async_event.cpp).
    if (status != engine::WcStatus::kWrFlushErr) return;
    ibv_async_event e{};
    e.element.qp = handle;
    e.event_type = IBV_EVENT_QP_FATAL;
    post_async_event(handle->context, e);
  };
  async_target_created(handle);
  return &ib;
}

/// The engine's view of one ibv_send_wr (fields by opcode, as rxe's init_send_wr). False
/// for an opcode the engine does not implement or a negative num_sge.
bool to_engine_wr(const ibv_send_wr& w, engine::SendWr& e) {
  if (!engine::wr_opcode_supported(w.opcode) || w.num_sge < 0) return false;
  e.wr_id = w.wr_id;
  e.opcode = static_cast<engine::WrOpcode>(w.opcode);
  e.flags = w.send_flags;
  e.imm_be = w.imm_data;
  e.sg_list = reinterpret_cast<const engine::Sge*>(w.sg_list);
  e.num_sge = static_cast<uint32_t>(w.num_sge);
  switch (engine::wr_info(e.opcode).cls) {
    case engine::WrClass::kAtomic:
      e.remote_addr = w.wr.atomic.remote_addr;
      e.rkey = w.wr.atomic.rkey;
      e.compare_add = w.wr.atomic.compare_add;
      e.swap = w.wr.atomic.swap;
      break;
    case engine::WrClass::kLocal:
      e.sg_list = nullptr;  // a local operation gathers nothing
      e.num_sge = 0;
      e.flags &= ~unsigned(IBV_SEND_INLINE);
      if (e.opcode == engine::WrOpcode::kLocalInv) {
        e.invalidate_rkey = w.invalidate_rkey;
      } else {
        const ibv_mw_bind_info& b = w.bind_mw.bind_info;
        if (!w.bind_mw.mw) return false;
        e.bind = {w.bind_mw.mw->rkey,  w.bind_mw.rkey,   b.mr ? b.mr->lkey : 0u, b.addr,
                  b.mr ? b.length : 0, b.mw_access_flags};
      }
      break;
    default:
      e.remote_addr = w.wr.rdma.remote_addr;
      e.rkey = w.wr.rdma.rkey;
      if (e.opcode == engine::WrOpcode::kSendInv) e.invalidate_rkey = w.invalidate_rkey;
      break;
  }
  return true;
}

}  // namespace

namespace softrdma::verbs {

int op_post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  engine::QueuePair& qp = *to_qp(ibqp)->qp;
  thread_local std::vector<engine::SendWr> wrs;
  wrs.clear();
  ibv_send_wr* refused = nullptr;
  for (ibv_send_wr* w = wr; w; w = w->next) {
    engine::SendWr e;
    if (!to_engine_wr(*w, e)) {
      // TSO, DRIVER1, ATOMIC_WRITE, …: not on this device. WRs before this one are posted.
      refused = w;
      break;
    }
    wrs.push_back(e);
  }
  size_t ok = 0;
  engine::Status st = qp.post_send_batch(wrs.data(), wrs.size(), ok);
  // A window's R_Key changes with each bind posted (what rxe's provider does for
  // ibv_bind_mw); the application reads the new one from the ibv_mw.
  ibv_send_wr* w = wr;
  for (size_t i = 0; i < ok; ++i, w = w->next)
    if (w->opcode == IBV_WR_BIND_MW) w->bind_mw.mw->rkey = w->bind_mw.rkey;
  if (st == engine::kOk && !refused) return 0;
  if (bad) *bad = st == engine::kOk ? refused : w;
  return st == engine::kOk ? EINVAL : err(st);
}

int op_post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  engine::QueuePair& qp = *to_qp(ibqp)->qp;
  for (ibv_recv_wr* w = wr; w; w = w->next) {
    engine::Status st =
        w->num_sge < 0 ? std::errc::invalid_argument
                       : qp.post_recv(w->wr_id, reinterpret_cast<const engine::Sge*>(w->sg_list),
                                      static_cast<uint32_t>(w->num_sge));
    if (st != engine::kOk) {
      if (bad) *bad = w;
      return err(st);
    }
  }
  return 0;
}

int op_post_srq_recv(ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (bad) *bad = wr;
  return EOPNOTSUPP;
}

ibv_qp* ctx_create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* a) {
  if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx)
    return fail<ibv_qp>(EINVAL);
  constexpr uint32_t kKnown =
      IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  if (a->comp_mask & ~kKnown) return fail<ibv_qp>(EOPNOTSUPP);
  // No create flag (scatter FCS, CVLAN stripping, source QPN, …) applies to this device;
  // the mask bit with no flag set is accepted (pyverbs sets it at random).
  if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags)
    return fail<ibv_qp>(EOPNOTSUPP);
  const bool ex = a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (ex) {
    if (int e = check_send_ops_flags(a->qp_type, a->send_ops_flags)) return fail<ibv_qp>(e);
  }
  ibv_qp* qp = create_qp_common(a->pd, a);
  if (qp && ex) enable_qp_ex(to_qp(qp), a->send_ops_flags);
  return qp;
}

}  // namespace softrdma::verbs

extern "C" {

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (!pd || !attr) return fail<ibv_qp>(EINVAL);
  ibv_qp_init_attr_ex a{};
  a.qp_context = attr->qp_context;
  a.send_cq = attr->send_cq;
  a.recv_cq = attr->recv_cq;
  a.srq = attr->srq;
  a.cap = attr->cap;
  a.qp_type = attr->qp_type;
  a.sq_sig_all = attr->sq_sig_all;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = pd;
  ibv_qp* qp = create_qp_common(pd, &a);
  if (qp) attr->cap = a.cap;
  return qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if (!qp || !attr) return EINVAL;
  engine::QpAttr a;
  a.state = static_cast<engine::QpState>(attr->qp_state);
  a.cur_state = static_cast<engine::QpState>(attr->cur_qp_state);
  a.path_mtu = static_cast<uint8_t>(attr->path_mtu);
  a.qkey = attr->qkey;
  a.rq_psn = attr->rq_psn;
  a.sq_psn = attr->sq_psn;
  a.dest_qp_num = attr->dest_qp_num;
  a.access_flags = static_cast<uint32_t>(attr->qp_access_flags);
  a.pkey_index = attr->pkey_index;
  a.en_sqd_async_notify = attr->en_sqd_async_notify != 0;
  a.max_rd_atomic = attr->max_rd_atomic;
  a.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  a.min_rnr_timer = attr->min_rnr_timer;
  a.port_num = attr->port_num;
  a.timeout = attr->timeout;
  a.retry_cnt = attr->retry_cnt;
  a.rnr_retry = attr->rnr_retry;
  const ibv_ah_attr& ah = attr->ah_attr;
  a.ah.is_global = ah.is_global != 0;
  std::memcpy(a.ah.dgid.raw, ah.grh.dgid.raw, 16);
  a.ah.flow_label = ah.grh.flow_label;
  a.ah.sgid_index = ah.grh.sgid_index;
  a.ah.hop_limit = ah.grh.hop_limit;
  a.ah.traffic_class = ah.grh.traffic_class;
  a.ah.sl = ah.sl;
  a.ah.port_num = ah.port_num;
  a.ah.static_rate = ah.static_rate;
  a.ah.dlid = ah.dlid;
  a.ah.src_path_bits = ah.src_path_bits;
  if (engine::Status s = to_qp(qp)->qp->modify(a, static_cast<uint32_t>(mask)); s != engine::kOk)
    return err(s);
  if (mask & IBV_QP_STATE) qp->state = attr->qp_state;
  return 0;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int /*mask*/, ibv_qp_init_attr* init) {
  if (!qp || !attr || !init) return EINVAL;
  engine::QpAttr a = to_qp(qp)->qp->query();
  *attr = ibv_qp_attr{};
  attr->qp_state = static_cast<ibv_qp_state>(a.state);
  attr->cur_qp_state = static_cast<ibv_qp_state>(a.state);
  attr->path_mtu = static_cast<ibv_mtu>(a.path_mtu);
  attr->path_mig_state = IBV_MIG_MIGRATED;
  attr->qkey = a.qkey;
  attr->rq_psn = a.rq_psn;
  attr->sq_psn = a.sq_psn;
  attr->dest_qp_num = a.dest_qp_num;
  attr->qp_access_flags = static_cast<unsigned>(a.access_flags);
  attr->cap = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge,
               a.cap.max_inline_data};
  attr->ah_attr.is_global = a.ah.is_global;
  std::memcpy(attr->ah_attr.grh.dgid.raw, a.ah.dgid.raw, 16);
  attr->ah_attr.grh.flow_label = a.ah.flow_label;
  attr->ah_attr.grh.sgid_index = a.ah.sgid_index;
  attr->ah_attr.grh.hop_limit = a.ah.hop_limit;
  attr->ah_attr.grh.traffic_class = a.ah.traffic_class;
  attr->ah_attr.sl = a.ah.sl;
  attr->ah_attr.port_num = a.ah.port_num;
  attr->ah_attr.static_rate = a.ah.static_rate;
  attr->pkey_index = a.pkey_index;
  attr->en_sqd_async_notify = a.en_sqd_async_notify;
  attr->sq_draining = a.sq_draining;
  attr->max_rd_atomic = a.max_rd_atomic;
  attr->max_dest_rd_atomic = a.max_dest_rd_atomic;
  attr->min_rnr_timer = a.min_rnr_timer;
  attr->port_num = a.port_num;
  attr->timeout = a.timeout;
  attr->retry_cnt = a.retry_cnt;
  attr->rnr_retry = a.rnr_retry;
  *init = ibv_qp_init_attr{};
  init->qp_context = qp->qp_context;
  init->send_cq = qp->send_cq;
  init->recv_cq = qp->recv_cq;
  init->srq = qp->srq;
  init->cap = attr->cap;
  init->qp_type = qp->qp_type;
  init->sq_sig_all = to_qp(qp)->qp->sq_sig_all;
  return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
  Qp* q = to_qp(qp);
  // As libibverbs: every async event returned for this QP must be acked first.
  async_target_destroyed(qp);
  wait_async_acks(&qp->mutex, &qp->cond, &qp->events_completed, q->async_reported);
  pthread_mutex_destroy(&qp->mutex);
  pthread_cond_destroy(&qp->cond);
  delete q;
  return 0;
}

}  // extern "C"
