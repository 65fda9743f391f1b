// Asynchronous events (ibv_get_async_event / ibv_ack_async_event, man
// ibv_get_async_event(3)) on the context's async_fd, the read end of a pipe: the engine
// writes one struct ibv_async_event per event from its own thread (the write end is
// non-blocking; a pipe holds thousands of 16-byte records, and a full pipe drops the event
// rather than stall the engine).
//
// Events raised (what softrdma can detect, named as IBTA 11.6.3 / rxe name them):
// - IBV_EVENT_QP_FATAL: the responder refused a request (IBTA 9.9.3 class C/D: bad R_Key,
//   invalid request, remote operational error) and moved the QP to ERR with no WQE to report
//   it on. Hardware splits this into QP_REQ_ERR / QP_ACCESS_ERR / QP_FATAL by NAK code; the
//   engine does not pass the code up (engine::QueuePair::on_error). Requester errors are
//   reported in their error CQE only, as on hardware.
// - IBV_EVENT_CQ_ERR: a CQ overran (rxe raises it from rxe_cq_post on a full queue).
// - IBV_EVENT_SRQ_LIMIT_REACHED: fewer WQEs than an armed SRQ limit are left (srq.cpp,
//   engine::SharedReceiveQueue::on_limit_reached; rxe get_srq_wqe); the limit disarms.
// - IBV_EVENT_QP_LAST_WQE_REACHED: a QP created with an SRQ entered ERR (ibv_modify_qp, or
//   the engine after its QP_FATAL) and was flushed (IBTA 11.6.3.1; rxe flush_recv_queue;
//   engine::QueuePair::on_last_wqe_reached), once per entry into ERR. uDAPL's dtestsrq
//   waits for it after a disconnect.
// No IBV_EVENT_PORT_ACTIVE at open: as on rxe, port events go to contexts open when the
// port changes state, and srdma0's port is active from the start.
//
// Lifetime, as libibverbs: an event names its QP/CQ; ibv_destroy_qp / ibv_destroy_cq wait
// until every event reported for the object has been acked, and an event still in the pipe
// when its object is destroyed is skipped (the kernel drops it from its queue likewise).
#include <fcntl.h>
#include <unistd.h>

#include <mutex>
#include <unordered_set>

#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

std::mutex g_live_mu;
// QPs, CQs and SRQs events may name. Never destroyed (objects.h, "Process-wide state").
std::unordered_set<const void*>& g_live = *new std::unordered_set<const void*>;

bool names_qp(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return true;
    default:
      return false;
  }
}

bool names_srq(ibv_event_type t) {
  return t == IBV_EVENT_SRQ_LIMIT_REACHED || t == IBV_EVENT_SRQ_ERR;
}

}  // namespace

namespace softrdma::verbs {

void async_target_created(const void* object) {
  std::lock_guard lk(g_live_mu);
  g_live.insert(object);
}

void async_target_destroyed(const void* object) {
  std::lock_guard lk(g_live_mu);
  g_live.erase(object);
}

void post_async_event(ibv_context* ctx, const ibv_async_event& event) {
  ssize_t r = ::write(to_ctx(ctx)->async_fds[1], &event, sizeof event);
  (void)r;  // a full pipe: the application stopped reading events; never block the engine
}

void wait_async_acks(pthread_mutex_t* mu, pthread_cond_t* cond, const uint32_t* completed,
                     const std::atomic<unsigned>& reported) {
  pthread_mutex_lock(mu);
  while (*completed != reported.load()) pthread_cond_wait(cond, mu);
  pthread_mutex_unlock(mu);
}

}  // namespace softrdma::verbs

extern "C" {

int ibv_get_async_event(ibv_context* ctx, ibv_async_event* event) {
  for (;;) {
    // One read, as rdma-core's: EINTR when a signal interrupts it.
    const ssize_t r = ::read(ctx->async_fd, event, sizeof *event);
    if (r != static_cast<ssize_t>(sizeof *event)) {
      if (r >= 0) errno = EIO;
      return -1;  // EAGAIN when the application made async_fd non-blocking, EINTR on a signal
    }
    std::lock_guard lk(g_live_mu);
    if (names_qp(event->event_type)) {
      if (!g_live.count(event->element.qp)) continue;  // its QP was destroyed meanwhile
      to_qp(event->element.qp)->async_reported++;
    } else if (event->event_type == IBV_EVENT_CQ_ERR) {
      if (!g_live.count(event->element.cq)) continue;
      to_cq(event->element.cq)->async_reported++;
    } else if (names_srq(event->event_type)) {
      if (!g_live.count(event->element.srq)) continue;
      to_srq(event->element.srq)->async_reported++;
    }
    return 0;
  }
}

void ibv_ack_async_event(ibv_async_event* event) {
  if (names_qp(event->event_type)) {
    ibv_qp* qp = event->element.qp;
    pthread_mutex_lock(&qp->mutex);
    ++qp->events_completed;
    pthread_cond_signal(&qp->cond);
    pthread_mutex_unlock(&qp->mutex);
  } else if (event->event_type == IBV_EVENT_CQ_ERR) {
    ibv_cq* cq = event->element.cq;
    pthread_mutex_lock(&cq->mutex);
    ++cq->async_events_completed;
    pthread_cond_signal(&cq->cond);
    pthread_mutex_unlock(&cq->mutex);
  } else if (names_srq(event->event_type)) {
    ibv_srq* srq = event->element.srq;
    pthread_mutex_lock(&srq->mutex);
    ++srq->events_completed;
    pthread_cond_signal(&srq->cond);
    pthread_mutex_unlock(&srq->mutex);
  }
}

}  // extern "C"
