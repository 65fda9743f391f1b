// Argument checks of the UD / SRQ / XRC verbs and the QP1 hook, in one process: the errno
// each refusal gives (rxe's, the kernel's where rxe has none — see each test).
#include <fcntl.h>
#include <unistd.h>

#include "verbs/softrdma_private.h"
#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

class QpTypesApi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(open_device(d));
    cq = ibv_create_cq(d.ctx, 64, nullptr, nullptr, 0);
    ASSERT_NE(nullptr, cq);
  }
  void TearDown() override {
    ibv_destroy_cq(cq);
    close_device(d);
  }
  ibv_qp* qp(ibv_qp_type t, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.srq = srq;
    ia.qp_type = t;
    ia.cap = {8, srq ? 0u : 8u, 1, 1, 0};
    return ibv_create_qp(d.pd, &ia);
  }
  ibv_srq* srq(uint32_t max_wr, uint32_t max_sge = 1) {
    ibv_srq_init_attr a{};
    a.attr = {max_wr, max_sge, 0};
    return ibv_create_srq(d.pd, &a);
  }
  static int post_srq(ibv_srq* s, uint64_t id, int num_sge = 1) {
    static char buf[64];
    ibv_sge sg[4] = {};
    for (auto& x : sg) x = {reinterpret_cast<uintptr_t>(buf), 8, 0};
    ibv_recv_wr wr{};
    wr.wr_id = id;
    wr.sg_list = sg;
    wr.num_sge = num_sge;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_srq_recv(s, &wr, &bad);
  }

  Device d;
  ibv_cq* cq = nullptr;
};

// ibv_create_ah: as rxe with the core's checks (rxe_av_chk_attr, ib_resolve_eth_dmac),
// EINVAL for a bad port, no GRH (RoCE routes by IP), an sgid_index past the table; and for
// a destination GID that is not IPv4-mapped (softrdma devices are IPv4 addresses).
TEST_F(QpTypesApi, CreateAhChecksItsAttributes) {
  ibv_ah_attr good{};
  good.is_global = 1;
  good.grh.dgid = d.gid;
  good.port_num = 1;
  ibv_ah* ah = ibv_create_ah(d.pd, &good);
  ASSERT_NE(nullptr, ah) << strerror(errno);
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(d.pd)) << "the AH holds the PD";
  EXPECT_EQ(0, ibv_destroy_ah(ah));
  auto refused = [&](ibv_ah_attr a, const char* what) {
    errno = 0;
    ibv_ah* x = ibv_create_ah(d.pd, &a);
    EXPECT_EQ(nullptr, x) << what;
    EXPECT_EQ(EINVAL, errno) << what;
    if (x) ibv_destroy_ah(x);
  };
  ibv_ah_attr a = good;
  a.port_num = 2;
  refused(a, "port 2");
  a = good;
  a.port_num = 0;
  refused(a, "port 0");
  a = good;
  a.is_global = 0;
  refused(a, "no GRH");
  a = good;
  a.grh.sgid_index = 1;
  refused(a, "sgid_index 1");
  a = good;
  a.grh.dgid.raw[10] = 0;  // no longer ::ffff:a.b.c.d
  refused(a, "dgid not IPv4-mapped");
}

TEST_F(QpTypesApi, UdPostNeedsAnAhAndTakesSendsOnly) {
  ibv_qp* q = qp(IBV_QPT_UD);
  ASSERT_NE(nullptr, q) << strerror(errno);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 5;
  ASSERT_EQ(EINVAL, ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT))
      << "a UD QP needs its Q_Key at INIT";
  ASSERT_EQ(0, ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
  a.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(0, ibv_modify_qp(q, &a, IBV_QP_STATE));
  a.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(0, ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN));
  ibv_qp_attr got{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(0, ibv_query_qp(q, &got, IBV_QP_QKEY, &init));
  EXPECT_EQ(5u, got.qkey);
  EXPECT_EQ(IBV_QPT_UD, init.qp_type);
  char buf[8];
  ibv_sge s{reinterpret_cast<uintptr_t>(buf), 8, 0};
  ibv_send_wr wr{};
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_send(q, &wr, &bad)) << "no AH";
  wr.opcode = IBV_WR_RDMA_WRITE;
  EXPECT_EQ(EINVAL, ibv_post_send(q, &wr, &bad)) << "UD has no RDMA WRITE";
  EXPECT_EQ(0, ibv_destroy_qp(q));
}

// SRQ: the ranges of rxe_srq_chk_attr (EINVAL), ENOMEM past max_wr (rxe_post_one_recv),
// resize and limit through ibv_modify_srq, EBUSY while a QP uses it.
TEST_F(QpTypesApi, SrqLimitsOverflowAndBusy) {
  errno = 0;
  EXPECT_EQ(nullptr, srq(0));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(nullptr, srq(uint32_t(d.attr.max_srq_wr) + 1));
  EXPECT_EQ(nullptr, srq(4, uint32_t(d.attr.max_srq_sge) + 1));
  ibv_srq* s = srq(2);
  ASSERT_NE(nullptr, s) << strerror(errno);
  EXPECT_EQ(0, post_srq(s, 1));
  EXPECT_EQ(EINVAL, post_srq(s, 2, 2)) << "more SGEs than max_sge";
  EXPECT_EQ(0, post_srq(s, 2));
  EXPECT_EQ(ENOMEM, post_srq(s, 3)) << "past max_wr";
  ibv_srq_attr a{};
  a.max_wr = 4;
  EXPECT_EQ(0, ibv_modify_srq(s, &a, IBV_SRQ_MAX_WR)) << "resize";
  EXPECT_EQ(0, post_srq(s, 3));
  a.max_wr = 1;
  EXPECT_EQ(EINVAL, ibv_modify_srq(s, &a, IBV_SRQ_MAX_WR)) << "below the WQEs posted";
  a.srq_limit = 5;
  EXPECT_EQ(EINVAL, ibv_modify_srq(s, &a, IBV_SRQ_LIMIT)) << "limit over max_wr";
  a.srq_limit = 2;
  EXPECT_EQ(0, ibv_modify_srq(s, &a, IBV_SRQ_LIMIT));
  ibv_srq_attr q{};
  ASSERT_EQ(0, ibv_query_srq(s, &q));
  EXPECT_EQ(4u, q.max_wr);
  EXPECT_EQ(1u, q.max_sge);
  EXPECT_EQ(2u, q.srq_limit);
  uint32_t n = 0;
  EXPECT_EQ(0, ibv_get_srq_num(s, &n));
  EXPECT_NE(0u, n);
  ibv_qp* user = qp(IBV_QPT_RC, s);
  ASSERT_NE(nullptr, user) << strerror(errno);
  EXPECT_EQ(s, user->srq);
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_recv(user, &wr, &bad)) << "its receives go to the SRQ";
  EXPECT_EQ(EBUSY, ibv_destroy_srq(s));
  EXPECT_EQ(0, ibv_destroy_qp(user));
  EXPECT_EQ(0, ibv_destroy_srq(s));
}

TEST_F(QpTypesApi, SrqExChecksTypeAndXrcAttributes) {
  ibv_srq_init_attr_ex a{};
  a.attr = {4, 1, 0};
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ;
  a.srq_type = IBV_SRQT_XRC;
  a.pd = d.pd;
  a.cq = cq;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_srq_ex(d.ctx, &a)) << "an XRC SRQ without a domain";
  EXPECT_EQ(EINVAL, errno);
  a.srq_type = IBV_SRQT_TM;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_srq_ex(d.ctx, &a));
  EXPECT_EQ(EOPNOTSUPP, errno) << "tag matching";
  a.srq_type = IBV_SRQT_BASIC;
  ibv_srq* s = ibv_create_srq_ex(d.ctx, &a);
  ASSERT_NE(nullptr, s) << strerror(errno);
  EXPECT_EQ(0, ibv_destroy_srq(s));
}

// ibv_open_xrcd's fd / oflags rules are the kernel's (ib_uverbs_open_xrcd).
TEST_F(QpTypesApi, OpenXrcdFollowsTheFdRules) {
  char path[] = "/tmp/softrdma-xrcd-api-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ibv_xrcd_init_attr a{};
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  a.fd = fd;
  a.oflags = 0;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_open_xrcd(d.ctx, &a));
  EXPECT_EQ(EAGAIN, errno) << "no domain on that file yet, and no O_CREAT";
  a.oflags = O_CREAT;
  ibv_xrcd* x = ibv_open_xrcd(d.ctx, &a);
  ASSERT_NE(nullptr, x) << strerror(errno);
  a.oflags = O_CREAT | O_EXCL;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_open_xrcd(d.ctx, &a));
  EXPECT_EQ(EINVAL, errno) << "O_EXCL on a file that has a domain";
  a.oflags = 0;
  ibv_xrcd* y = ibv_open_xrcd(d.ctx, &a);
  ASSERT_NE(nullptr, y) << "the existing domain, without O_CREAT";
  a.fd = 9999;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_open_xrcd(d.ctx, &a));
  EXPECT_EQ(EBADF, errno);
  a.fd = -1;
  ibv_xrcd* z = ibv_open_xrcd(d.ctx, &a);
  ASSERT_NE(nullptr, z) << "fd -1: an unshared domain";
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_open_xrcd(d.ctx, &a));
  EXPECT_EQ(EINVAL, errno) << "no oflags";
  // An XRC receive QP of x's domain is found through y, not through z.
  ibv_qp_init_attr_ex ia{};
  ia.qp_type = IBV_QPT_XRC_RECV;
  ia.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  ia.xrcd = x;
  ibv_qp* tgt = ibv_create_qp_ex(d.ctx, &ia);
  ASSERT_NE(nullptr, tgt) << strerror(errno);
  EXPECT_EQ(IBV_QPT_XRC_RECV, tgt->qp_type);
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.qp_num = tgt->qp_num;
  oa.qp_type = IBV_QPT_XRC_RECV;
  oa.xrcd = z;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_open_qp(d.ctx, &oa));
  EXPECT_EQ(EINVAL, errno) << "another domain";
  oa.xrcd = y;
  ibv_qp* opened = ibv_open_qp(d.ctx, &oa);
  ASSERT_NE(nullptr, opened) << strerror(errno);
  ibv_recv_wr rw{};
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_recv(tgt, &rw, &rbad)) << "an XRC receive QP has no RQ";
  EXPECT_EQ(0, ibv_destroy_qp(tgt));
  EXPECT_EQ(0, ibv_close_xrcd(z));
  EXPECT_EQ(0, ibv_close_xrcd(x)) << "y still holds the domain";
  EXPECT_EQ(EBUSY, ibv_close_xrcd(y)) << "the last handle of a domain an opened QP still uses";
  EXPECT_EQ(0, ibv_destroy_qp(opened));
  EXPECT_EQ(0, ibv_close_xrcd(y));
  close(fd);
}

// softrdma_create_qp1 (verbs/softrdma_private.h): QPN 1, once per device.
TEST_F(QpTypesApi, Qp1HookGivesQpn1Once) {
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap = {8, 8, 1, 1, 0};
  ibv_qp* gsi = softrdma_create_qp1(d.pd, &ia);
  ASSERT_NE(nullptr, gsi) << strerror(errno);
  EXPECT_EQ(1u, gsi->qp_num);
  EXPECT_EQ(IBV_QPT_UD, gsi->qp_type);
  errno = 0;
  EXPECT_EQ(nullptr, softrdma_create_qp1(d.pd, &ia));
  EXPECT_EQ(EBUSY, errno);
  ia.qp_type = IBV_QPT_RC;
  errno = 0;
  EXPECT_EQ(nullptr, softrdma_create_qp1(d.pd, &ia));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(0, ibv_destroy_qp(gsi));
  ia.qp_type = IBV_QPT_UD;
  gsi = softrdma_create_qp1(d.pd, &ia);
  ASSERT_NE(nullptr, gsi) << "after destroy, QP1 can be created again";
  EXPECT_EQ(0, ibv_destroy_qp(gsi));
}

TEST_F(QpTypesApi, DeviceAdvertisesSrqAndXrc) {
  EXPECT_GT(d.attr.max_srq, 0);
  EXPECT_GT(d.attr.max_srq_wr, 0);
  EXPECT_GT(d.attr.max_ah, 0);
  EXPECT_TRUE(d.attr.device_cap_flags & IBV_DEVICE_XRC);
  EXPECT_TRUE(d.attr.device_cap_flags & IBV_DEVICE_SRQ_RESIZE);
}

}  // namespace
}  // namespace softrdma::verbs_test
