// Single-process tests of the verbs added with the whole-surface work (issue 11): the
// extended post API's creation and error paths, memory windows' argument and bind errors,
// ibv_rereg_mr's return codes and errno (as libibverbs and the kernel's ib_uverbs_rereg_mr
// give them), and what the device advertises for on-demand paging, with ibv_advise_mr.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

class ExtendedApi : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(open_device(d)); }
  void TearDown() override { close_device(d); }

  /// A QP of `type` (RC unless given) created by ibv_create_qp_ex with `ops` (nullptr and
  /// errno on failure).
  ibv_qp* create_ex(uint64_t ops, ibv_cq* cq, uint32_t max_inline = 64,
                    ibv_qp_type type = IBV_QPT_RC) {
    ibv_qp_init_attr_ex a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = type;
    a.cap = {16, 16, 2, 2, max_inline};
    a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.pd = d.pd;
    a.send_ops_flags = ops;
    return ibv_create_qp_ex(d.ctx, &a);
  }

  Device d;
};

// ---- ibv_create_qp_ex / ibv_qp_to_qp_ex / ibv_wr_* -------------------------------------

TEST_F(ExtendedApi, SendOpsFlagsTheDeviceCannotPostAreEopnotsupp) {
  ibv_cq* cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(nullptr, cq);
  for (uint64_t ops :
       {uint64_t{IBV_QP_EX_WITH_TSO}, uint64_t{IBV_QP_EX_WITH_SEND | (1ull << 40)}}) {
    errno = 0;
    EXPECT_EQ(nullptr, create_ex(ops, cq)) << std::hex << ops;
    EXPECT_EQ(EOPNOTSUPP, errno) << std::hex << ops;
  }
  // RDMA ATOMIC WRITE: RC only (as rxe); UC and UD have no opcode for it.
  for (ibv_qp_type t : {IBV_QPT_UC, IBV_QPT_UD}) {
    errno = 0;
    EXPECT_EQ(nullptr, create_ex(IBV_QP_EX_WITH_ATOMIC_WRITE, cq, 0, t)) << t;
    EXPECT_EQ(EOPNOTSUPP, errno) << t;
  }
  ibv_qp* aw = create_ex(IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE, cq);
  ASSERT_NE(nullptr, aw) << strerror(errno);
  ASSERT_NE(nullptr, ibv_qp_to_qp_ex(aw)->wr_atomic_write);
  EXPECT_EQ(0, ibv_destroy_qp(aw));
  ibv_qp* qp = create_ex(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ, cq);
  ASSERT_NE(nullptr, qp) << strerror(errno);
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(qp);
  ASSERT_NE(nullptr, qx);
  EXPECT_EQ(qp, &qx->qp_base);
  EXPECT_NE(nullptr, qx->wr_send);
  EXPECT_NE(nullptr, qx->wr_complete);
  EXPECT_EQ(0, ibv_destroy_qp(qp));
  // A QP created without send_ops_flags has no ibv_qp_ex (as libibverbs: VERBS_QP_EX unset).
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {4, 4, 1, 1, 0};
  ibv_qp* plain = ibv_create_qp(d.pd, &ia);
  ASSERT_NE(nullptr, plain);
  EXPECT_EQ(nullptr, ibv_qp_to_qp_ex(plain));
  EXPECT_EQ(0, ibv_destroy_qp(plain));
  EXPECT_EQ(0, ibv_destroy_cq(cq));
}

// Errors found while building are returned by ibv_wr_complete, which then posts nothing;
// ibv_wr_abort discards; the post path's own errors (QP in RESET) come back as they would
// from ibv_post_send.
TEST_F(ExtendedApi, WrCompleteReportsBuildErrorsAndPostsNothing) {
  Endpoint a, b;
  ConnOptions o;
  o.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
  o.max_inline_data = 64;
  o.max_send_sge = 2;
  ASSERT_TRUE(connect_pair(d, o, a, b));
  Buffer buf(8192);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(a.qp);
  ASSERT_NE(nullptr, qx);
  qx->wr_flags = IBV_SEND_SIGNALED;

  ibv_wr_start(qx);
  ibv_wr_send(qx);
  ibv_wr_set_inline_data(qx, buf.data(), 65);  // over max_inline_data
  EXPECT_EQ(ENOSPC, ibv_wr_complete(qx));

  ibv_wr_start(qx);
  ibv_wr_set_sge(qx, mr->lkey, buf.addr(), 8);  // no WR opened
  EXPECT_EQ(EINVAL, ibv_wr_complete(qx));

  ibv_wr_start(qx);
  ibv_wr_rdma_read(qx, mr->rkey, buf.addr());  // not in send_ops_flags
  ibv_wr_set_sge(qx, mr->lkey, buf.addr(), 8);
  EXPECT_EQ(EOPNOTSUPP, ibv_wr_complete(qx));

  ibv_wr_start(qx);
  ibv_wr_send(qx);
  const ibv_sge three[3] = {
      {buf.addr(), 1, mr->lkey}, {buf.addr(), 1, mr->lkey}, {buf.addr(), 1, mr->lkey}};
  ibv_wr_set_sge_list(qx, 3, three);  // over max_send_sge
  EXPECT_EQ(EINVAL, ibv_wr_complete(qx));

  ibv_wr_start(qx);
  ibv_wr_rdma_write(qx, mr->rkey, buf.addr() + 4096);
  ibv_wr_set_sge(qx, mr->lkey, buf.addr(), 8);
  ibv_wr_abort(qx);
  EXPECT_TRUE(no_completion(a.scq, 20ms)) << "nothing was posted";

  // An empty batch posts nothing and succeeds; a good one completes.
  ibv_wr_start(qx);
  EXPECT_EQ(0, ibv_wr_complete(qx));
  ibv_wr_start(qx);
  qx->wr_id = 42;
  ibv_wr_rdma_write(qx, mr->rkey, buf.addr() + 4096);
  ibv_wr_set_sge(qx, mr->lkey, buf.addr(), 8);
  EXPECT_EQ(0, ibv_wr_complete(qx));
  poll_success(a.scq, 42, IBV_WC_RDMA_WRITE);

  // In RESET the post itself is refused.
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(0, ibv_modify_qp(a.qp, &reset, IBV_QP_STATE));
  ibv_wr_start(qx);
  ibv_wr_send(qx);
  ibv_wr_set_sge(qx, mr->lkey, buf.addr(), 8);
  EXPECT_EQ(EINVAL, ibv_wr_complete(qx));
  destroy_endpoint(a);
  destroy_endpoint(b);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// A QP moved to RESET leaves nothing of its own in its CQs: the flushed completions of its
// ERR state, not polled yet, are gone (as mlx5 cleans the CQ on RESET; pyverbs'
// test_mr_rereg_pd reuses a QP that way) — other QPs' completions in the same CQ stay.
TEST_F(ExtendedApi, ResetDiscardsTheQpsUnpolledCompletions) {
  ibv_cq* cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(nullptr, cq);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {4, 4, 1, 1, 0};
  ibv_qp* q1 = ibv_create_qp(d.pd, &ia);
  ibv_qp* q2 = ibv_create_qp(d.pd, &ia);
  ASSERT_NE(nullptr, q1);
  ASSERT_NE(nullptr, q2);
  ConnOptions o;
  for (ibv_qp* q : {q1, q2}) {
    ASSERT_EQ(0, modify_to_init(q, o));
    ASSERT_EQ(0, post_recv(q, q == q1 ? 1 : 2, nullptr, 0, 0));
    ibv_qp_attr err{};
    err.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(0, ibv_modify_qp(q, &err, IBV_QP_STATE));  // flushes the receive into cq
  }
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(0, ibv_modify_qp(q1, &reset, IBV_QP_STATE));
  const ibv_wc wc = poll_one(cq);
  EXPECT_EQ(2u, wc.wr_id) << "q2's completion stays";
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status);
  EXPECT_TRUE(no_completion(cq, 10ms)) << "q1's is gone";
  EXPECT_EQ(0, ibv_destroy_qp(q1));
  EXPECT_EQ(0, ibv_destroy_qp(q2));
  EXPECT_EQ(0, ibv_destroy_cq(cq));
}

// ---- memory windows --------------------------------------------------------------------

TEST_F(ExtendedApi, DeviceAdvertisesMemoryWindows) {
  EXPECT_GT(d.attr.max_mw, 0);
  EXPECT_TRUE(d.attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
  EXPECT_TRUE(d.attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
}

TEST_F(ExtendedApi, AllocMwOfAnUnknownTypeIsEinval) {
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_mw(d.pd, static_cast<ibv_mw_type>(3)));
  EXPECT_EQ(EINVAL, errno);
  ibv_mw* mw = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
  ASSERT_NE(nullptr, mw);
  EXPECT_EQ(d.pd, mw->pd);
  EXPECT_EQ(d.ctx, mw->context);
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(d.pd)) << "the window holds its PD";
  EXPECT_EQ(0, ibv_dealloc_mw(mw));
}

// Binds the checks refuse complete with IBV_WC_MW_BIND_ERR and move the QP to ERR (rxe's
// do_local_ops): an MR without IBV_ACCESS_MW_BIND (C10-73); a type 2 window bound twice
// without being invalidated (o10-37.2.30); LOCAL_INV of a type 1 window is a local QP
// operation error (o10-37.2.26). ibv_bind_mw's own checks answer at once.
TEST_F(ExtendedApi, RefusedBindsAndInvalidatesCompleteInError) {
  Buffer buf(8192);
  ibv_mr* plain = ibv_reg_mr(d.pd, buf.data(), 4096, kAllAccess);
  ibv_mr* bindable = ibv_reg_mr(d.pd, buf.data() + 4096, 4096, kAllAccess | IBV_ACCESS_MW_BIND);
  ASSERT_NE(nullptr, plain);
  ASSERT_NE(nullptr, bindable);
  auto expect_error = [&](auto post, ibv_wc_status want, ibv_wc_opcode op, const char* what) {
    Endpoint a, b;
    ASSERT_TRUE(connect_pair(d, ConnOptions{}, a, b)) << what;
    post(a.qp);
    const ibv_wc wc = poll_one(a.scq);
    EXPECT_EQ(want, wc.status) << what << ": " << describe(wc);
    EXPECT_EQ(op, wc.opcode) << what;
    EXPECT_EQ(IBV_QPS_ERR, qp_state(a.qp)) << what;
    destroy_endpoint(a);
    destroy_endpoint(b);
  };
  ibv_mw* w1 = ibv_alloc_mw(d.pd, IBV_MW_TYPE_1);
  ibv_mw* w2 = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
  ASSERT_NE(nullptr, w1);
  ASSERT_NE(nullptr, w2);
  expect_error(
      [&](ibv_qp* qp) {
        ibv_mw_bind mb{};
        mb.wr_id = 1;
        mb.send_flags = IBV_SEND_SIGNALED;
        mb.bind_info = {plain, buf.addr(), 64, IBV_ACCESS_REMOTE_WRITE};
        EXPECT_EQ(0, ibv_bind_mw(qp, w1, &mb));
      },
      IBV_WC_MW_BIND_ERR, IBV_WC_BIND_MW, "MR without MW_BIND");
  auto bind2 = [&](ibv_qp* qp, uint64_t id) {
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = w2;
    wr.bind_mw.rkey = ibv_inc_rkey(w2->rkey);
    wr.bind_mw.bind_info = {bindable, buf.addr() + 4096, 64, IBV_ACCESS_REMOTE_READ};
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(0, ibv_post_send(qp, &wr, &bad));
  };
  expect_error(
      [&](ibv_qp* qp) {
        bind2(qp, 1);
        poll_success(qp->send_cq, 1, IBV_WC_BIND_MW);
        bind2(qp, 2);
      },
      IBV_WC_MW_BIND_ERR, IBV_WC_BIND_MW, "type 2 window bound twice");
  expect_error(
      [&](ibv_qp* qp) {
        ibv_send_wr wr{};
        wr.wr_id = 3;
        wr.opcode = IBV_WR_LOCAL_INV;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.invalidate_rkey = w1->rkey;
        ibv_send_wr* bad = nullptr;
        EXPECT_EQ(0, ibv_post_send(qp, &wr, &bad));
      },
      IBV_WC_LOC_QP_OP_ERR, IBV_WC_LOCAL_INV, "LOCAL_INV of a type 1 window");
  // libibverbs' inline checks and the provider's.
  Endpoint a, b;
  ASSERT_TRUE(connect_pair(d, ConnOptions{}, a, b));
  ibv_mw_bind mb{};
  mb.bind_info = {nullptr, buf.addr(), 64, 0};
  EXPECT_EQ(EINVAL, ibv_bind_mw(a.qp, w1, &mb)) << "no MR but a range";
  mb.bind_info = {bindable, buf.addr() + 4096, 64, IBV_ACCESS_ZERO_BASED};
  EXPECT_EQ(EINVAL, ibv_bind_mw(a.qp, w1, &mb)) << "zero-based type 1";
  EXPECT_EQ(EINVAL, ibv_bind_mw(a.qp, w2, &mb)) << "ibv_bind_mw is for type 1";
  destroy_endpoint(a);
  destroy_endpoint(b);
  EXPECT_EQ(EINVAL, ibv_dereg_mr(bindable)) << "w2 is still bound to it";
  EXPECT_EQ(0, ibv_dealloc_mw(w2));
  EXPECT_EQ(0, ibv_dealloc_mw(w1));
  EXPECT_EQ(0, ibv_dereg_mr(bindable));
  EXPECT_EQ(0, ibv_dereg_mr(plain));
}

// ---- ibv_rereg_mr ----------------------------------------------------------------------

TEST_F(ExtendedApi, ReregMrErrorsAsLibibverbsAndTheKernel) {
  Buffer buf(3 * 4096);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), 4096, kAllAccess | IBV_ACCESS_MW_BIND);
  ASSERT_NE(nullptr, mr);
  auto rereg = [&](int flags, ibv_pd* pd, void* addr, size_t len, int access, int want_rc,
                   int want_errno, const char* what) {
    errno = 0;
    EXPECT_EQ(want_rc, ibv_rereg_mr(mr, flags, pd, addr, len, access)) << what;
    if (want_rc) {
      EXPECT_EQ(want_errno, errno) << what;
    }
  };
  rereg(0, nullptr, nullptr, 0, 0, IBV_REREG_MR_ERR_INPUT, EINVAL, "no flag");
  rereg(8, nullptr, nullptr, 0, 0, IBV_REREG_MR_ERR_INPUT, EINVAL, "unknown flag");
  rereg(IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, 4096, 0, IBV_REREG_MR_ERR_INPUT, EINVAL,
        "translation without an address");
  rereg(IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, buf.data(), 0, 0, IBV_REREG_MR_ERR_INPUT, EINVAL,
        "translation without a length");
  rereg(IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE,
        IBV_REREG_MR_ERR_CMD, EINVAL, "remote write without local write");
  rereg(IBV_REREG_MR_CHANGE_PD, nullptr, nullptr, 0, 0, IBV_REREG_MR_ERR_CMD, EINVAL, "no PD");
  rereg(IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, reinterpret_cast<void*>(0x10), 4096, 0,
        IBV_REREG_MR_ERR_CMD, EFAULT, "an unmapped range");
  ibv_mw* mw = ibv_alloc_mw(d.pd, IBV_MW_TYPE_1);
  ASSERT_NE(nullptr, mw);
  {
    Endpoint a, b;
    ASSERT_TRUE(connect_pair(d, ConnOptions{}, a, b));
    ibv_mw_bind mb{};
    mb.wr_id = 1;
    mb.send_flags = IBV_SEND_SIGNALED;
    mb.bind_info = {mr, buf.addr(), 64, IBV_ACCESS_REMOTE_READ};
    ASSERT_EQ(0, ibv_bind_mw(a.qp, mw, &mb));
    poll_success(a.scq, 1, IBV_WC_BIND_MW);
    rereg(IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, kAllAccess, IBV_REREG_MR_ERR_CMD, EBUSY,
          "a window is bound");
    destroy_endpoint(a);
    destroy_endpoint(b);
  }
  EXPECT_EQ(0, ibv_dealloc_mw(mw));
  // All three at once, then the fields libibverbs updates.
  ibv_pd* other = ibv_alloc_pd(d.ctx);
  ASSERT_NE(nullptr, other);
  const uint32_t lkey = mr->lkey;
  EXPECT_EQ(0, ibv_rereg_mr(mr,
                            IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD |
                                IBV_REREG_MR_CHANGE_ACCESS,
                            other, buf.data() + 4096, 8192, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(buf.data() + 4096, mr->addr);
  EXPECT_EQ(8192u, mr->length);
  EXPECT_EQ(other, mr->pd);
  EXPECT_EQ(lkey, mr->lkey);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  EXPECT_EQ(0, ibv_dealloc_pd(other));
}

// ---- on-demand paging ------------------------------------------------------------------

TEST_F(ExtendedApi, OnDemandPagingIsAdvertisedForEveryTransport) {
  ibv_device_attr_ex ax{};
  ASSERT_EQ(0, ibv_query_device_ex(d.ctx, nullptr, &ax));
  EXPECT_EQ(uint64_t{IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT}, ax.odp_caps.general_caps);
  const uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                      IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  EXPECT_EQ(rc, ax.odp_caps.per_transport_caps.rc_odp_caps);
  EXPECT_TRUE(ax.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND);
  EXPECT_EQ(rc, ax.xrc_odp_caps);
}

TEST_F(ExtendedApi, AdviseMrPrefetchesOnDemandMrsOnly) {
  Buffer buf(16384);
  ibv_mr* odp = ibv_reg_mr(d.pd, buf.data(), 8192, kAllAccess | IBV_ACCESS_ON_DEMAND);
  ibv_mr* pinned = ibv_reg_mr(d.pd, buf.data() + 8192, 8192, kAllAccess);
  ASSERT_NE(nullptr, odp);
  ASSERT_NE(nullptr, pinned);
  ibv_sge sge{buf.addr(), 8192, odp->lkey};
  EXPECT_EQ(0, ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
                             &sge, 1));
  EXPECT_EQ(0, ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &sge, 1));
  EXPECT_EQ(EOPNOTSUPP, ibv_advise_mr(d.pd, static_cast<ibv_advise_mr_advice>(7), 0, &sge, 1));
  EXPECT_EQ(EINVAL, ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0));
  ibv_sge outside{buf.addr() + 4096, 8192, odp->lkey};
  EXPECT_EQ(EINVAL, ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &outside, 1));
  ibv_sge not_odp{buf.addr() + 8192, 64, pinned->lkey};
  EXPECT_EQ(EINVAL, ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &not_odp, 1));
  EXPECT_EQ(0, ibv_dereg_mr(pinned));
  EXPECT_EQ(0, ibv_dereg_mr(odp));
  // The implicit ODP MR: NULL, SIZE_MAX.
  ibv_mr* implicit =
      ibv_reg_mr(d.pd, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(nullptr, implicit) << strerror(errno);
  EXPECT_EQ(0, ibv_dereg_mr(implicit));
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(d.pd, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(EINVAL, errno) << "only an on-demand MR may be implicit";
}

}  // namespace
}  // namespace softrdma::verbs_test
