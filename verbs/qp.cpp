// ibv_qp: creation of every type (ibv_create_qp, ibv_create_qp_ex through verbs_context;
// XRC receive QPs are tracked by their domain, xrc.cpp), the state machine's attributes
// (modify/query), and posting (ibv_post_send / ibv_post_recv through context->ops; UD WRs
// carry their address handle's destination, XRC WRs their remote SRQ number).
#include <algorithm>
#include <cstring>
#include <vector>

#include "verbs/ops.h"
#include "verbs/softrdma_private.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

static_assert(sizeof(ibv_sge) == sizeof(engine::Sge));
static_assert(offsetof(ibv_sge, lkey) == offsetof(engine::Sge, lkey));
static_assert(IBV_WR_ATOMIC_FETCH_AND_ADD == int(engine::WrOpcode::kFetchAdd) &&
              IBV_WR_LOCAL_INV == int(engine::WrOpcode::kLocalInv) &&
              IBV_WR_BIND_MW == int(engine::WrOpcode::kBindMw) &&
              IBV_WR_SEND_WITH_INV == int(engine::WrOpcode::kSendInv) &&
              IBV_WR_ATOMIC_WRITE == int(engine::WrOpcode::kAtomicWrite) &&
              IBV_WR_ATOMIC_WRITE + 1 == int(engine::kWrOpcodeCount));
static_assert(IBV_WC_ATOMIC_WRITE == int(engine::WcOpcode::kAtomicWrite));
static_assert(IBV_WC_LOCAL_INV == int(engine::WcOpcode::kLocalInv) &&
              IBV_WC_WITH_INV == int(engine::kWcWithInv));
static_assert(unsigned(IBV_QP_DEST_QPN) == engine::kAttrDestQpn &&
              unsigned(IBV_QP_RATE_LIMIT) == engine::kAttrRateLimit);
static_assert(unsigned(IBV_ACCESS_REMOTE_ATOMIC) == engine::kRemoteAtomic);
static_assert(unsigned(IBV_SEND_INLINE) == engine::kInline &&
              unsigned(IBV_SEND_FENCE) == engine::kFence);
static_assert(IBV_QPS_ERR == int(engine::QpState::kErr));

static_assert(IBV_QPT_RC == int(engine::QpType::kRc) && IBV_QPT_UD == int(engine::QpType::kUd) &&
              IBV_QPT_XRC_SEND == int(engine::QpType::kXrcSend) &&
              IBV_QPT_XRC_RECV == int(engine::QpType::kXrcRecv));

engine::CompletionQueue* engine_cq(ibv_cq* cq) {
  return cq ? to_cq(cq)->cq.get() : nullptr;
}

// The inline capacity a QP gets: what was asked, but at least the bytes its send SGEs could
// describe (16 per SGE), as rxe's rxe_qp_init_req sizes a WQE — programs that post a small
// IBV_SEND_INLINE without asking for inline room (rdma_xclient: 16 B, one SGE) work there.
uint32_t inline_capacity(const ibv_qp_cap& cap) {
  const uint64_t sge_room = uint64_t{cap.max_send_sge} * sizeof(ibv_sge);
  return std::max<uint32_t>(
      cap.max_inline_data,
      uint32_t(std::min<uint64_t>(sge_room, engine::DeviceLimits::kMaxInlineData)));
}

// ibv_qp_init_attr_ex → engine::QpInit: the objects must belong to `ctx`; which ones a type
// needs is checked by the engine (QueuePair::validate_init) — a type it lacks gives
// EOPNOTSUPP, as rxe's rxe_qp_chk_init.
int resolve_init(ibv_context* ctx, const ibv_qp_init_attr_ex& a, uint32_t qpn, engine::QpInit& in) {
  const engine::QpTypeInfo* type = engine::qp_type_info(static_cast<engine::QpType>(a.qp_type));
  if (!type) return EOPNOTSUPP;
  ibv_pd* pd = (a.comp_mask & IBV_QP_INIT_ATTR_PD) ? a.pd : nullptr;
  ibv_xrcd* xrcd = (a.comp_mask & IBV_QP_INIT_ATTR_XRCD) ? a.xrcd : nullptr;
  if (a.qp_type == IBV_QPT_XRC_RECV) pd = nullptr;  // the target takes the SRQs' PDs
  if ((pd && pd->context != ctx) || (xrcd && xrcd->context != ctx)) return EINVAL;
  ibv_cq* scq = type->has_send_queue ? a.send_cq : nullptr;
  ibv_cq* rcq = type->has_recv_queue ? a.recv_cq : nullptr;
  ibv_srq* srq = type->has_recv_queue ? a.srq : nullptr;
  if ((scq && scq->context != ctx) || (rcq && rcq->context != ctx) || (srq && srq->context != ctx))
    return EINVAL;
  in.type = type->type;
  in.pd = pd ? to_pd(pd)->pd.get() : nullptr;
  in.send_cq = engine_cq(scq);
  in.recv_cq = engine_cq(rcq);
  in.srq = srq ? to_srq(srq)->srq.get() : nullptr;
  in.xrcd = xrcd && a.qp_type == IBV_QPT_XRC_RECV ? &to_xrcd(xrcd)->shared->domain : nullptr;
  in.cap = {type->has_send_queue ? a.cap.max_send_wr : 0,
            type->has_recv_queue && !srq ? a.cap.max_recv_wr : 0,
            type->has_send_queue ? a.cap.max_send_sge : 0,
            type->has_recv_queue && !srq ? a.cap.max_recv_sge : 0,
            type->has_send_queue ? inline_capacity(a.cap) : 0};
  in.sq_sig_all = a.sq_sig_all != 0;
  in.qpn = qpn;
  return err(engine::QueuePair::validate_init(in));
}

}  // namespace

namespace softrdma::verbs {

Qp* new_qp_handle(ibv_context* ctx, std::shared_ptr<engine::QueuePair> eqp, void* qp_context,
                  ibv_pd* pd, ibv_cq* scq, ibv_cq* rcq, ibv_srq* srq) {
  auto* q = new Qp{};
  q->qp = std::move(eqp);
  ibv_qp& ib = *q->as_qp();
  ib.context = ctx;
  ib.qp_context = qp_context;
  ib.pd = pd;
  ib.send_cq = scq;
  ib.recv_cq = rcq;
  ib.srq = srq;
  ib.handle = q->qp->qpn();
  ib.qp_num = q->qp->qpn();
  ib.state = static_cast<ibv_qp_state>(q->qp->query().state);
  ib.qp_type = static_cast<ibv_qp_type>(q->qp->type());
  pthread_mutex_init(&ib.mutex, nullptr);
  pthread_cond_init(&ib.cond, nullptr);
  async_target_created(&ib);
  return q;
}

ibv_qp* create_qp(ibv_context* ctx, ibv_qp_init_attr_ex* a, uint32_t qpn) {
  engine::QpInit in;
  if (int e = resolve_init(ctx, *a, qpn, in)) return fail<ibv_qp>(e);
  Context* c = to_ctx(ctx);
  // On a parent domain with allocators, the queues' buffers come from it (parent_domain.cpp).
  ibv_pd* parent = in.pd && to_pd(a->pd)->parent ? a->pd : nullptr;
  if (parent) {
    const engine::QpTypeInfo& type = *engine::qp_type_info(in.type);
    if (type.has_send_queue)
      if (int e = queue_memory(parent, in.cap.max_send_wr, sizeof(engine::SendWqe),
                               SOFTRDMADV_RES_TYPE_SQ, in.sq_memory))
        return fail<ibv_qp>(e);
    if (type.has_recv_queue && !in.srq)
      if (int e = queue_memory(parent, in.cap.max_recv_wr, sizeof(engine::RecvWqe),
                               SOFTRDMADV_RES_TYPE_RQ, in.rq_memory))
        return fail<ibv_qp>(e);
  }
  Reservation slot;
  if (!slot.take(*c->dev, engine::ObjectKind::kQp)) return fail<ibv_qp>(ENOMEM);  // max_qp
  auto eqp = std::make_shared<engine::QueuePair>(*c->dev, in);
  if (eqp->qpn() == 0) return fail<ibv_qp>(EBUSY);  // the QPN asked for is taken
  const bool recv_side = eqp->type_info().has_recv_queue;
  Qp* q = new_qp_handle(ctx, eqp, a->qp_context, in.pd ? a->pd : nullptr,
                        eqp->type_info().has_send_queue ? a->send_cq : nullptr,
                        recv_side ? a->recv_cq : nullptr, recv_side ? a->srq : nullptr);
  q->slot.adopt(slot);
  if (parent) {
    q->parent_domain = parent;
    to_pd(parent)->handle_users++;
  }
  if (eqp->type_info().has_send_queue) a->cap.max_inline_data = in.cap.max_inline_data;
  ibv_qp* handle = q->as_qp();
  q->qp->on_error = [handle](engine::WcStatus status) {
    // Requester errors reach the application in their error CQE, as on hardware; a request
    // the responder refused has no WQE to carry it (async_event.cpp).
    if (status != engine::WcStatus::kWrFlushErr) return;
    ibv_async_event e{};
    e.element.qp = handle;
    e.event_type = IBV_EVENT_QP_FATAL;
    post_async_event(handle->context, e);
  };
  q->qp->on_last_wqe_reached = [handle] {
    ibv_async_event e{};
    e.element.qp = handle;
    e.event_type = IBV_EVENT_QP_LAST_WQE_REACHED;
    post_async_event(handle->context, e);
  };
  if (a->qp_type == IBV_QPT_XRC_RECV) track_xrc_recv_qp(a->xrcd, q->qp);
  return handle;
}

// The per-thread WR buffer of op_post_send, and whether it has been destroyed: at exit a
// thread's thread_local objects go before static destructors and atexit handlers, which may
// still post (the RDMA-CM's teardown at unload sends its last MADs). A trivially destructible
// flag outlives the vector, so such a late post uses a local buffer instead.
thread_local bool t_post_buffer_gone = false;
struct PostBuffer {
  std::vector<engine::SendWr> wrs;
  ~PostBuffer() { t_post_buffer_gone = true; }
};
thread_local PostBuffer t_post_buffer;

/// The engine's view of one ibv_send_wr (fields by opcode and QP type, as rxe's
/// init_send_wr). False for an opcode the engine does not implement or a negative num_sge.
static bool to_engine_wr(const ibv_qp& qp, const ibv_send_wr& w, engine::SendWr& e) {
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
      return true;
    default:
      e.remote_addr = w.wr.rdma.remote_addr;
      e.rkey = w.wr.rdma.rkey;
      if (e.opcode == engine::WrOpcode::kSendInv) e.invalidate_rkey = w.invalidate_rkey;
      break;
  }
  if (qp.qp_type == IBV_QPT_UD) {
    // The destination resolved now: a WQE outlives neither its AH nor needs it later.
    e.ud_dst_ip = w.wr.ud.ah ? to_ah(w.wr.ud.ah)->ah->peer_ip() : 0;
    e.remote_qpn = w.wr.ud.remote_qpn;
    e.remote_qkey = w.wr.ud.remote_qkey;
  } else if (qp.qp_type == IBV_QPT_XRC_SEND) {
    e.remote_srqn = w.qp_type.xrc.remote_srqn;
  }
  return true;
}

int op_post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  engine::QueuePair& qp = *to_qp(ibqp)->qp;
  std::vector<engine::SendWr> late;  // stays empty (no allocation) unless the buffer is gone
  std::vector<engine::SendWr>& wrs = t_post_buffer_gone ? late : t_post_buffer.wrs;
  wrs.clear();
  ibv_send_wr* refused = nullptr;
  for (ibv_send_wr* w = wr; w; w = w->next) {
    engine::SendWr e;
    if (!to_engine_wr(*ibqp, *w, e)) {
      // TSO, DRIVER1, FLUSH, …: not on this device. WRs before this one are posted.
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
  return post_recv_chain(wr, bad, [&qp](uint64_t id, const engine::Sge* sges, uint32_t n) {
    return qp.post_recv(id, sges, n);
  });
}

ibv_qp* ctx_create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* a) {
  // An XRC receive QP is created in an XRC domain, every other type with a PD.
  const uint32_t needed =
      a->qp_type == IBV_QPT_XRC_RECV ? IBV_QP_INIT_ATTR_XRCD : IBV_QP_INIT_ATTR_PD;
  if (!(a->comp_mask & needed) ||
      (needed == IBV_QP_INIT_ATTR_PD ? a->pd == nullptr : a->xrcd == nullptr))
    return fail<ibv_qp>(EINVAL);
  constexpr uint32_t kKnown = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD |
                              IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  if (a->comp_mask & ~kKnown) return fail<ibv_qp>(EOPNOTSUPP);
  // No create flag (scatter FCS, CVLAN stripping, source QPN, …) applies to this device;
  // the mask bit with no flag set is accepted (pyverbs sets it at random).
  if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags)
    return fail<ibv_qp>(EOPNOTSUPP);
  const bool ex = a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (ex) {
    if (int e = check_send_ops_flags(a->qp_type, a->send_ops_flags)) return fail<ibv_qp>(e);
  }
  ibv_qp* qp = create_qp(ctx, a, 0);
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
  ibv_qp* qp = create_qp(pd->context, &a, 0);
  if (qp) attr->cap = a.cap;
  return qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if (!qp || !attr) return EINVAL;
  engine::QpAttr a;
  // The enum fields only under their mask bit: a field the mask leaves out may hold anything
  // (ibv_xsrq_pingpong leaves cur_qp_state unset on the stack), and loading an enum that
  // holds no enumerator's value is undefined (UBSan stops on it).
  if (mask & IBV_QP_STATE) a.state = static_cast<engine::QpState>(attr->qp_state);
  if (mask & IBV_QP_CUR_STATE) a.cur_state = static_cast<engine::QpState>(attr->cur_qp_state);
  if (mask & IBV_QP_PATH_MTU) a.path_mtu = static_cast<uint8_t>(attr->path_mtu);
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
  // As the kernel (ib_destroy_qp_user: the QP's usecnt counts its multicast attachments).
  if (q->mcast_attached.load(std::memory_order_relaxed) != 0) return EBUSY;
  // As libibverbs: every async event returned for this QP must be acked first.
  stop_async_events(qp, &qp->events_completed, q->async_reported);
  delete_handle(q, qp);
  return 0;
}

}  // extern "C"
