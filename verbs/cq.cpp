// ibv_cq and ibv_comp_channel: completion queues, polling (ibv_poll_cq through
// context->ops), arming and completion events.
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <unordered_set>

#include "verbs/ops.h"
#include "verbs/softrdma_private.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

static_assert(IBV_WC_RETRY_EXC_ERR == int(engine::WcStatus::kRetryExcErr));
static_assert(IBV_WC_GENERAL_ERR == int(engine::WcStatus::kGeneralErr));
static_assert(IBV_WC_RECV_RDMA_WITH_IMM == int(engine::WcOpcode::kRecvRdmaWithImm));

/// Live CQs. An event already queued on a channel when its CQ is destroyed still sits in
/// the pipe; ibv_get_cq_event skips such events instead of returning a freed CQ (the
/// kernel drops them from its queue in the same case).
std::mutex g_cq_mu;
/// Never destroyed (objects.h, "Process-wide state").
std::unordered_set<ibv_cq*>& g_live_cqs = *new std::unordered_set<ibv_cq*>;

void fill_wc(const engine::Cqe& c, ibv_wc& w) {
  w = ibv_wc{};
  w.wr_id = c.wr_id;
  w.status = static_cast<ibv_wc_status>(c.status);
  w.opcode = static_cast<ibv_wc_opcode>(c.opcode);
  w.vendor_err = c.vendor_err;
  w.byte_len = c.byte_len;
  w.imm_data = c.imm_be;
  w.qp_num = c.qp_num;
  w.src_qp = c.src_qp;
  w.wc_flags = c.wc_flags;
  w.sl = c.sl;
}

}  // namespace

namespace softrdma::verbs {

int op_poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  engine::Cqe buf[32];
  int total = 0;
  while (total < n) {
    const int want = std::min<int>(n - total, 32);
    const int got = to_cq(cq)->cq->poll(want, buf);
    if (got < 0) return total ? total : -1;  // CQ overrun
    for (int i = 0; i < got; ++i) fill_wc(buf[i], wc[total + i]);
    total += got;
    if (got < want) break;
  }
  return total;
}

Cq* create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel,
              int comp_vector, bool record_times, ibv_pd* parent_domain) {
  if (!ctx || cqe < 1 || static_cast<uint32_t>(cqe) > engine::DeviceLimits::kMaxCqe)
    return fail<Cq>(EINVAL);
  if (comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) return fail<Cq>(EINVAL);
  // The ring (and its completion times) in a buffer of the parent domain's allocator.
  engine::QueueMemory memory;
  const size_t slot = sizeof(engine::Cqe) + (record_times ? sizeof(engine::CompletionTime) : 0);
  if (int e = queue_memory(parent_domain, static_cast<uint32_t>(cqe), slot, SOFTRDMADV_RES_TYPE_CQ,
                           memory))
    return fail<Cq>(e);
  auto* c = new Cq{};
  if (!c->slot.take(*to_ctx(ctx)->dev, engine::ObjectKind::kCq)) {
    delete c;
    return fail<Cq>(ENOMEM);  // max_cq reached
  }
  ibv_cq* ib = c->as_cq();
  c->cq = std::make_unique<engine::CompletionQueue>(
      *to_ctx(ctx)->dev, static_cast<uint32_t>(cqe),
      channel ? &to_channel(channel)->channel : nullptr, ib, std::move(memory));
  if (parent_domain) {
    c->parent_domain = parent_domain;
    to_pd(parent_domain)->handle_users++;
  }
  if (record_times) c->cq->record_completion_times();
  c->cq->on_overrun = [ctx, ib] {
    ibv_async_event e{};
    e.element.cq = ib;
    e.event_type = IBV_EVENT_CQ_ERR;
    post_async_event(ctx, e);
  };
  async_target_created(ib);
  ib->context = ctx;
  ib->channel = channel;
  ib->cq_context = cq_context;
  ib->cqe = cqe;
  pthread_mutex_init(&ib->mutex, nullptr);
  pthread_cond_init(&ib->cond, nullptr);
  if (channel) ++channel->refcnt;
  std::lock_guard lk(g_cq_mu);
  g_live_cqs.insert(ib);
  return c;
}

int op_req_notify_cq(ibv_cq* cq, int solicited_only) {
  return to_cq(cq)->cq->request_notify(solicited_only != 0);
}

}  // namespace softrdma::verbs

extern "C" {

ibv_comp_channel* ibv_create_comp_channel(ibv_context* ctx) {
  if (!ctx) return fail<ibv_comp_channel>(EINVAL);
  auto* ch = new Channel{};
  if (!ch->channel.ok()) {
    int e = errno;
    delete ch;
    return fail<ibv_comp_channel>(e);
  }
  ch->ibv.context = ctx;
  ch->ibv.fd = ch->channel.fd();
  ch->ibv.refcnt = 0;
  return &ch->ibv;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  Channel* ch = to_channel(channel);
  if (ch->channel.users.load() > 0) return EBUSY;
  delete ch;
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel,
                      int comp_vector) {
  Cq* c = create_cq(ctx, cqe, cq_context, channel, comp_vector, false);
  return c ? c->as_cq() : nullptr;
}

/// Resizes `cq` to at least `cqe` entries (exactly `cqe` here; cq->cqe is updated). Returns
/// 0, or EINVAL for cqe < 1, cqe > max_cqe or fewer entries than the CQ holds unpolled, as
/// rxe (rxe_cq_chk_attr) — an errno value, as libibverbs returns it.
int ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (!cq || cqe < 1) return EINVAL;
  if (to_cq(cq)->cq->resize(static_cast<uint32_t>(cqe)) != std::errc{}) return EINVAL;
  cq->cqe = cqe;
  return 0;
}

int ibv_destroy_cq(ibv_cq* cq) {
  Cq* c = to_cq(cq);
  if (c->cq->users.load() > 0) return EBUSY;
  {
    std::lock_guard lk(g_cq_mu);
    g_live_cqs.erase(cq);
  }
  // As libibverbs does: wait until every event reported on the channel has been acked, so
  // no event can name a freed CQ.
  pthread_mutex_lock(&cq->mutex);
  while (cq->comp_events_completed != c->events_reported.load())
    pthread_cond_wait(&cq->cond, &cq->mutex);
  pthread_mutex_unlock(&cq->mutex);
  stop_async_events(cq, &cq->async_events_completed, c->async_reported);
  if (cq->channel) --cq->channel->refcnt;
  delete_handle(c, cq);
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  ibv_cq* handle = nullptr;
  for (;;) {
    // One read, as rdma-core's: a signal that interrupts it returns -1 with errno EINTR (qperf
    // ends its timed loops blocked here with SIGALRM; retrying left it blocked for good).
    const ssize_t r = ::read(channel->fd, &handle, sizeof handle);
    if (r != sizeof handle) {
      if (r >= 0) errno = EIO;
      return -1;
    }
    std::lock_guard lk(g_cq_mu);
    if (g_live_cqs.count(handle)) break;  // else: event of a destroyed CQ, skip it
  }
  to_cq(handle)->events_reported++;
  *cq = handle;
  *cq_context = handle->cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

}  // extern "C"
