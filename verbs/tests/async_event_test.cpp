// Affiliated asynchronous events (ibv_get_async_event(3)) on the context's async_fd: a CQ
// overrun raises IBV_EVENT_CQ_ERR, a request the responder refuses (bad R_Key) raises
// IBV_EVENT_QP_FATAL on the responder's QP only; the requester learns of it from its error
// CQE alone. A QP with an SRQ that enters ERR raises IBV_EVENT_QP_LAST_WQE_REACHED. Nothing
// is queued at open, and a destroyed object's queued event is skipped.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

class AsyncEvents : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(open_device(d));
    // Non-blocking, so that "no event" is a clean EAGAIN, never a hang.
    const int fl = fcntl(d.ctx->async_fd, F_GETFL);
    ASSERT_EQ(0, fcntl(d.ctx->async_fd, F_SETFL, fl | O_NONBLOCK));
  }
  void TearDown() override { close_device(d); }

  /// Waits up to `ms` for async_fd to become readable and reads one event.
  bool next_event(ibv_async_event& e, int ms = 5000) {
    pollfd p{d.ctx->async_fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return false;
    return ibv_get_async_event(d.ctx, &e) == 0;
  }

  /// Connects a to b and lets a WRITE to b with a wrong R_Key: b's responder refuses it
  /// (NAK, b to ERR), a gets IBV_WC_REM_ACCESS_ERR. `mr` is the buffer's registration.
  void write_with_bad_rkey(Endpoint& a, Endpoint& b, ibv_mr*& mr) {
    ASSERT_TRUE(connect_pair(d, ConnOptions{}, a, b));
    mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
    ASSERT_NE(nullptr, mr);
    ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_WRITE, 1, buf.data(), 8, mr->lkey, buf.addr(),
                           mr->rkey + 1000));
    ibv_wc wc = poll_one(a.scq);
    ASSERT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << describe(wc);
  }

  Device d;
  Buffer buf{4096};
};

TEST_F(AsyncEvents, NoneAtOpenAndAsyncFdIsARealFd) {
  EXPECT_GE(d.ctx->async_fd, 0);
  pollfd p{d.ctx->async_fd, POLLIN, 0};
  EXPECT_EQ(0, poll(&p, 1, 50)) << "no event queued at open (rxe sends PORT_ACTIVE only on "
                                   "a port state change)";
  ibv_async_event e{};
  errno = 0;
  EXPECT_EQ(-1, ibv_get_async_event(d.ctx, &e));
  EXPECT_EQ(EAGAIN, errno);
}

TEST_F(AsyncEvents, CqOverrunRaisesCqErrOnce) {
  ConnOptions o;
  o.cq_depth = 2;
  Endpoint a, b;
  ASSERT_TRUE(connect_pair(d, o, a, b));
  Buffer buf(4096);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  for (uint64_t id = 1; id <= 4; ++id)
    ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_WRITE, id, buf.data(), 8, mr->lkey, buf.addr() + 1024,
                           mr->rkey));
  ibv_async_event e{};
  ASSERT_TRUE(next_event(e)) << "CQ_ERR expected";
  EXPECT_EQ(IBV_EVENT_CQ_ERR, e.event_type) << ibv_event_type_str(e.event_type);
  EXPECT_EQ(a.scq, e.element.cq);
  ibv_ack_async_event(&e);
  EXPECT_FALSE(next_event(e, 100))
      << "one event per overrun, got " << ibv_event_type_str(e.event_type);
  destroy_endpoint(a);
  destroy_endpoint(b);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

TEST_F(AsyncEvents, RefusedRequestRaisesQpFatalOnTheResponder) {
  Endpoint a, b;
  ibv_mr* mr = nullptr;
  ASSERT_NO_FATAL_FAILURE(write_with_bad_rkey(a, b, mr));
  ibv_async_event e{};
  ASSERT_TRUE(next_event(e)) << "QP_FATAL expected";
  EXPECT_EQ(IBV_EVENT_QP_FATAL, e.event_type) << ibv_event_type_str(e.event_type);
  EXPECT_EQ(b.qp, e.element.qp) << "the responder's QP, not the requester's";
  EXPECT_EQ(IBV_QPS_ERR, qp_state(b.qp));
  ibv_ack_async_event(&e);
  EXPECT_FALSE(next_event(e, 100))
      << "no event for the requester, got " << ibv_event_type_str(e.event_type);
  destroy_endpoint(a);
  destroy_endpoint(b);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

TEST_F(AsyncEvents, EventOfADestroyedQpIsSkipped) {
  Endpoint a, b;
  ibv_mr* mr = nullptr;
  ASSERT_NO_FATAL_FAILURE(write_with_bad_rkey(a, b, mr));
  pollfd p{d.ctx->async_fd, POLLIN, 0};
  ASSERT_EQ(1, poll(&p, 1, 5000)) << "the QP_FATAL is queued";
  destroy_endpoint(b);  // before the event was read: nothing to wait for
  ibv_async_event e{};
  errno = 0;
  EXPECT_EQ(-1, ibv_get_async_event(d.ctx, &e))
      << "skipped, got " << ibv_event_type_str(e.event_type);
  EXPECT_EQ(EAGAIN, errno);
  destroy_endpoint(a);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// IBTA 11.6.3.1 "Last WQE Reached": a QP that receives from an SRQ and enters ERR raises
// IBV_EVENT_QP_LAST_WQE_REACHED once (rxe: flush_recv_queue). Consumers sharing an SRQ wait
// for it before destroying the QP: uDAPL's dtestsrq hung in "Wait for EP async event" after
// its disconnect without it. The SRQ's WQEs stay posted (they are the SRQ's, not the QP's).
// A QP without an SRQ raises nothing.
TEST_F(AsyncEvents, SrqQpMovedToErrRaisesLastWqeReachedOnce) {
  ibv_srq_init_attr sa{};
  sa.attr = {8, 1, 0};
  ibv_srq* srq = ibv_create_srq(d.pd, &sa);
  ASSERT_NE(nullptr, srq) << strerror(errno);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  for (uint64_t i = 0; i < 2; ++i) {
    ibv_sge sg{buf.addr() + i * 256, 256, mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(0, ibv_post_srq_recv(srq, &wr, &bad));
  }
  ConnOptions with_srq;
  with_srq.srq = srq;
  Endpoint s, plain;
  ASSERT_TRUE(create_endpoint(d, with_srq, s));
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, plain));
  ASSERT_EQ(0, modify_to_init(s.qp, with_srq));
  ASSERT_EQ(0, modify_to_init(plain.qp, ConnOptions{}));

  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(0, ibv_modify_qp(plain.qp, &err, IBV_QP_STATE));
  ibv_async_event e{};
  EXPECT_FALSE(next_event(e, 100))
      << "a QP without an SRQ: nothing, got " << ibv_event_type_str(e.event_type);

  ASSERT_EQ(0, ibv_modify_qp(s.qp, &err, IBV_QP_STATE));
  ASSERT_TRUE(next_event(e)) << "LAST_WQE_REACHED expected";
  EXPECT_EQ(IBV_EVENT_QP_LAST_WQE_REACHED, e.event_type) << ibv_event_type_str(e.event_type);
  EXPECT_EQ(s.qp, e.element.qp);
  ibv_ack_async_event(&e);
  EXPECT_EQ(0, ibv_modify_qp(s.qp, &err, IBV_QP_STATE)) << "ERR to ERR";
  EXPECT_FALSE(next_event(e, 100))
      << "once per entry into ERR, got " << ibv_event_type_str(e.event_type);
  ibv_wc wc{};
  EXPECT_EQ(0, ibv_poll_cq(s.rcq, 1, &wc)) << "the SRQ's WQEs are not the QP's to flush";
  destroy_endpoint(s);
  destroy_endpoint(plain);
  EXPECT_EQ(0, ibv_destroy_srq(srq));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// The engine moves an SRQ QP to ERR (its responder refused a WRITE with a bad R_Key): first
// QP_FATAL, then LAST_WQE_REACHED, both naming the responder's QP (mlx5 and rxe's order).
TEST_F(AsyncEvents, RefusedRequestOnAnSrqQpRaisesQpFatalThenLastWqeReached) {
  ibv_srq_init_attr sa{};
  sa.attr = {8, 1, 0};
  ibv_srq* srq = ibv_create_srq(d.pd, &sa);
  ASSERT_NE(nullptr, srq) << strerror(errno);
  ConnOptions o, with_srq;
  with_srq.srq = srq;
  Endpoint a, b;
  ASSERT_TRUE(create_endpoint(d, o, a));
  ASSERT_TRUE(create_endpoint(d, with_srq, b));
  ASSERT_TRUE(connect_endpoint(a, o, d.gid, b.qpn, b.psn));
  ASSERT_TRUE(connect_endpoint(b, with_srq, d.gid, a.qpn, a.psn));
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_WRITE, 1, buf.data(), 8, mr->lkey, buf.addr(),
                         mr->rkey + 1000));
  ibv_wc wc = poll_one(a.scq);
  ASSERT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << describe(wc);
  ibv_async_event e{};
  ASSERT_TRUE(next_event(e)) << "QP_FATAL expected";
  EXPECT_EQ(IBV_EVENT_QP_FATAL, e.event_type) << ibv_event_type_str(e.event_type);
  EXPECT_EQ(b.qp, e.element.qp);
  ibv_ack_async_event(&e);
  ASSERT_TRUE(next_event(e)) << "LAST_WQE_REACHED expected";
  EXPECT_EQ(IBV_EVENT_QP_LAST_WQE_REACHED, e.event_type) << ibv_event_type_str(e.event_type);
  EXPECT_EQ(b.qp, e.element.qp);
  ibv_ack_async_event(&e);
  EXPECT_FALSE(next_event(e, 100)) << "nothing more, got " << ibv_event_type_str(e.event_type);
  destroy_endpoint(a);
  destroy_endpoint(b);
  EXPECT_EQ(0, ibv_destroy_srq(srq));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

}  // namespace
}  // namespace softrdma::verbs_test
