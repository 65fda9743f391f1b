// ibv_mw: memory windows (man ibv_alloc_mw(3), ibv_bind_mw(3); IBTA vol 1, 10.6.7), reached
// through ibv_context::ops as the inline ibv_alloc_mw / ibv_dealloc_mw / ibv_bind_mw of
// <infiniband/verbs.h> call them. Type 1 windows are bound by ibv_bind_mw, which — as rxe's
// provider does — posts an IBV_WR_BIND_MW work request with the next R_Key
// (ibv_inc_rkey) on the QP, so binds complete in send-queue order with an IBV_WC_BIND_MW
// completion; type 2 windows are bound by the application's own IBV_WR_BIND_MW (ibv_post_send
// or ibv_wr_bind_mw). The engine checks and executes both (engine/mw.h).
#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace softrdma::verbs {

/// ops.alloc_mw. NULL with errno EINVAL for a type other than 1 or 2 (rxe_alloc_mw),
/// ENOMEM at max_mw.
ibv_mw* op_alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  if (!pd) return fail<ibv_mw>(EINVAL);
  if (!engine::MemoryWindow::valid_type(static_cast<uint32_t>(type))) return fail<ibv_mw>(EINVAL);
  auto* m = new Mw{};
  if (!m->slot.take(*to_ctx(pd->context)->dev, engine::ObjectKind::kMw)) {
    delete m;
    return fail<ibv_mw>(ENOMEM);
  }
  m->mw = std::make_unique<engine::MemoryWindow>(*to_pd(pd)->pd, static_cast<engine::MwType>(type));
  m->ibv.context = pd->context;
  m->ibv.pd = pd;
  m->ibv.rkey = m->mw->rkey();
  m->ibv.handle = m->ibv.rkey >> 8;
  m->ibv.type = type;
  return &m->ibv;
}

/// ops.dealloc_mw: unbinds and frees the window; accesses through its R_Key fail from now on.
/// Always 0.
int op_dealloc_mw(ibv_mw* mw) {
  delete to_mw(mw);
  return 0;
}

/// ops.bind_mw (ibv_bind_mw, after the inline checks: type 1, MR and range consistent, same
/// PD). EINVAL for a zero-based binding (o10-36.2.2) or a missing argument; otherwise what
/// ibv_post_send returns for the bind WR (ENOMEM: send queue full; EINVAL: QP not in RTS).
/// The bind itself is checked when it executes: a refused bind completes with
/// IBV_WC_MW_BIND_ERR.
int op_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) {
  if (!qp || !mw || !bind) return EINVAL;
  if (bind->bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED) return EINVAL;
  ibv_send_wr wr{};
  wr.wr_id = bind->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = bind->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = bind->bind_info;
  ibv_send_wr* bad = nullptr;
  return op_post_send(qp, &wr, &bad);
}

}  // namespace softrdma::verbs
