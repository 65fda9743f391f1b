// ibv_srq: shared receive queues, basic and XRC (ibv_create_srq(3), ibv_create_srq_ex(3),
// ibv_modify_srq(3), ibv_query_srq, ibv_destroy_srq, ibv_post_srq_recv, ibv_get_srq_num).
// The SRQ limit event (IBV_EVENT_SRQ_LIMIT_REACHED) reaches the context's async_fd
// (async_event.cpp); destroy waits until every such event returned has been acked.
#include "verbs/ops.h"
#include "verbs/softrdma_private.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

/// The SRQ of `attr` on `ctx`: EINVAL for attributes out of range (engine validate), ENOMEM
/// at max_srq. `kind`, `cq` and `xrcd` make an XRC SRQ.
ibv_srq* create_srq(ibv_context* ctx, ibv_pd* pd, ibv_srq_attr& attr, void* srq_context,
                    engine::SharedReceiveQueue::Kind kind, ibv_cq* cq, ibv_xrcd* xrcd) {
  const engine::SharedReceiveQueue::Attr a{attr.max_wr, attr.max_sge, attr.srq_limit};
  if (engine::SharedReceiveQueue::validate(a) != engine::kOk) return fail<ibv_srq>(EINVAL);
  // On a parent domain with allocators, the queue's buffer comes from it (parent_domain.cpp).
  ibv_pd* parent = to_pd(pd)->parent ? pd : nullptr;
  engine::QueueMemory memory;
  if (int e =
          queue_memory(parent, a.max_wr, sizeof(engine::RecvWqe), SOFTRDMADV_RES_TYPE_SRQ, memory))
    return fail<ibv_srq>(e);
  auto* s = new Srq{};
  if (!s->slot.take(*to_ctx(ctx)->dev, engine::ObjectKind::kSrq)) {
    delete s;
    return fail<ibv_srq>(ENOMEM);  // max_srq reached
  }
  s->srq = std::make_unique<engine::SharedReceiveQueue>(
      *to_ctx(ctx)->dev, *to_pd(pd)->pd, kind, a, cq ? to_cq(cq)->cq.get() : nullptr,
      xrcd ? &to_xrcd(xrcd)->shared->domain : nullptr, std::move(memory));
  if (parent) {
    s->parent_domain = parent;
    to_pd(parent)->handle_users++;
  }
  ibv_srq& ib = s->ibv;
  ib.context = ctx;
  ib.srq_context = srq_context;
  ib.pd = pd;
  ib.handle = s->srq->srqn();
  pthread_mutex_init(&ib.mutex, nullptr);
  pthread_cond_init(&ib.cond, nullptr);
  ibv_srq* handle = &ib;
  s->srq->on_limit_reached = [handle] {
    ibv_async_event e{};
    e.element.srq = handle;
    e.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
    post_async_event(handle->context, e);
  };
  async_target_created(handle);
  return handle;
}

}  // namespace

namespace softrdma::verbs {

int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  engine::SharedReceiveQueue& q = *to_srq(srq)->srq;
  return post_recv_chain(wr, bad, [&q](uint64_t id, const engine::Sge* sges, uint32_t n) {
    return q.post_recv(id, sges, n);
  });
}

ibv_srq* ctx_create_srq_ex(ibv_context* ctx, ibv_srq_init_attr_ex* a) {
  if (!a) return fail<ibv_srq>(EINVAL);
  constexpr uint32_t kKnown =
      IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  if (a->comp_mask & ~kKnown) return fail<ibv_srq>(EOPNOTSUPP);  // tag matching, …
  const ibv_srq_type type = (a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? a->srq_type : IBV_SRQT_BASIC;
  if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) return fail<ibv_srq>(EOPNOTSUPP);
  if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx)
    return fail<ibv_srq>(EINVAL);
  if (type == IBV_SRQT_BASIC)
    return create_srq(ctx, a->pd, a->attr, a->srq_context, engine::SharedReceiveQueue::Kind::kBasic,
                      nullptr, nullptr);
  // An XRC SRQ has its own CQ and belongs to an XRC domain (ibv_create_srq_ex(3)).
  const uint32_t xrc = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  if ((a->comp_mask & xrc) != xrc || !a->xrcd || !a->cq || a->xrcd->context != ctx ||
      a->cq->context != ctx)
    return fail<ibv_srq>(EINVAL);
  return create_srq(ctx, a->pd, a->attr, a->srq_context, engine::SharedReceiveQueue::Kind::kXrc,
                    a->cq, a->xrcd);
}

int ctx_get_srq_num(ibv_srq* srq, uint32_t* srq_num) {
  if (!srq || !srq_num) return EINVAL;
  *srq_num = to_srq(srq)->srq->srqn();
  return 0;
}

}  // namespace softrdma::verbs

extern "C" {

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!pd || !attr) return fail<ibv_srq>(EINVAL);
  return create_srq(pd->context, pd, attr->attr, attr->srq_context,
                    engine::SharedReceiveQueue::Kind::kBasic, nullptr, nullptr);
}

int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  if (!srq || !attr) return EINVAL;
  const engine::SharedReceiveQueue::Attr a{attr->max_wr, attr->max_sge, attr->srq_limit};
  return err(to_srq(srq)->srq->modify(a, static_cast<uint32_t>(mask)));
}

int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  if (!srq || !attr) return EINVAL;
  const engine::SharedReceiveQueue::Attr a = to_srq(srq)->srq->query();
  attr->max_wr = a.max_wr;
  attr->max_sge = a.max_sge;
  attr->srq_limit = a.srq_limit;
  return 0;
}

/// ibv_destroy_srq: EBUSY while a QP uses it (as the kernel's ib_destroy_srq: usecnt).
int ibv_destroy_srq(ibv_srq* srq) {
  if (!srq) return EINVAL;
  Srq* s = to_srq(srq);
  if (s->srq->users.load() > 0) return EBUSY;
  stop_async_events(srq, &srq->events_completed, s->async_reported);
  delete_handle(s, srq);
  return 0;
}

}  // extern "C"
