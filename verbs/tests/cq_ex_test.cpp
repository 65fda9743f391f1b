// The extended CQ (ibv_create_cq_ex, man ibv_create_cq_ex(3)): which wc_flags and create
// flags are accepted, and ibv_start_poll / ibv_next_poll / ibv_end_poll with the
// ibv_wc_read_* accessors over real traffic between two QPs of one device, including
// completion timestamps against ibv_query_rt_values_ex and the wall clock.
#include <arpa/inet.h>
#include <time.h>

#include <cstring>
#include <thread>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

uint64_t now_ns(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return uint64_t(t.tv_sec) * 1000000000u + uint64_t(t.tv_nsec);
}

class CqEx : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(open_device(d)); }
  void TearDown() override { close_device(d); }

  ibv_cq_ex* create(uint64_t wc_flags, uint32_t cqe = 64) {
    ibv_cq_init_attr_ex a{};
    a.cqe = cqe;
    a.wc_flags = wc_flags;
    return ibv_create_cq_ex(d.ctx, &a);
  }

  /// An RC QP on the given extended CQs, connected to `peer` (or to itself when null) later.
  bool endpoint(ibv_cq_ex* scq, ibv_cq_ex* rcq, Endpoint& e) {
    e.scq = ibv_cq_ex_to_cq(scq);
    e.rcq = ibv_cq_ex_to_cq(rcq);
    ibv_qp_init_attr ia{};
    ia.send_cq = e.scq;
    ia.recv_cq = e.rcq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {64, 64, 1, 1, 0};
    e.qp = ibv_create_qp(d.pd, &ia);
    if (!e.qp) return false;
    e.qpn = e.qp->qp_num;
    e.psn = 100;
    return true;
  }

  /// Starts a poll cycle, retrying while the CQ is empty (bounded by `limit`).
  int start(ibv_cq_ex* cq, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    ibv_poll_cq_attr pa{};
    int rc;
    while ((rc = ibv_start_poll(cq, &pa)) == ENOENT && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    return rc;
  }

  Device d;
};

TEST_F(CqEx, UnsupportedWcFlagsAndCreateFlagsAreEopnotsupp) {
  for (uint64_t f : {uint64_t{IBV_WC_EX_WITH_CVLAN}, uint64_t{IBV_WC_EX_WITH_FLOW_TAG},
                     uint64_t{IBV_WC_EX_WITH_TM_INFO}, uint64_t{1} << 40}) {
    errno = 0;
    EXPECT_EQ(nullptr, create(uint64_t{IBV_WC_STANDARD_FLAGS} | f)) << "wc_flags " << f;
    EXPECT_EQ(EOPNOTSUPP, errno) << "wc_flags " << f;
  }
  ibv_cq_init_attr_ex a{};
  a.cqe = 8;
  a.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  a.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq_ex(d.ctx, &a));
  EXPECT_EQ(EOPNOTSUPP, errno);
  // IBV_CQ_INIT_ATTR_MASK_PD needs a parent domain (parent_domain_test.cpp has the rest).
  a.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq_ex(d.ctx, &a)) << "no parent domain";
  EXPECT_EQ(EINVAL, errno);
  a = ibv_cq_init_attr_ex{};
  a.cqe = d.attr.max_cqe + 1u;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq_ex(d.ctx, &a));
  EXPECT_EQ(EINVAL, errno);
  a.cqe = 8;
  a.comp_vector = 1;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq_ex(d.ctx, &a)) << "only one completion vector";
  EXPECT_EQ(EINVAL, errno);
}

TEST_F(CqEx, AccessorsArePresentOnlyForRequestedFlags) {
  ibv_cq_ex* plain = create(IBV_WC_STANDARD_FLAGS);
  ASSERT_NE(nullptr, plain) << strerror(errno);
  EXPECT_NE(nullptr, plain->start_poll);
  EXPECT_NE(nullptr, plain->read_byte_len);
  EXPECT_EQ(nullptr, plain->read_completion_ts);
  EXPECT_EQ(nullptr, plain->read_completion_wallclock_ns);
  ibv_poll_cq_attr pa{};
  EXPECT_EQ(ENOENT, ibv_start_poll(plain, &pa)) << "an empty CQ";
  pa.comp_mask = 1;
  EXPECT_EQ(EINVAL, ibv_start_poll(plain, &pa)) << "unknown poll attribute";
  ibv_cq_ex* stamped =
      create(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
  ASSERT_NE(nullptr, stamped) << strerror(errno);
  EXPECT_NE(nullptr, stamped->read_completion_ts);
  EXPECT_NE(nullptr, stamped->read_completion_wallclock_ns);
  EXPECT_EQ(0, ibv_destroy_cq(ibv_cq_ex_to_cq(plain)));
  EXPECT_EQ(0, ibv_destroy_cq(ibv_cq_ex_to_cq(stamped)));

  ibv_device_attr_ex ex{};
  ASSERT_EQ(0, ibv_query_device_ex(d.ctx, nullptr, &ex));
  EXPECT_EQ(1000000u, ex.hca_core_clock) << "kHz: timestamps count ns";
  EXPECT_NE(0u, ex.completion_timestamp_mask);
}

TEST_F(CqEx, StartNextEndPollReadsEveryField) {
  const uint64_t flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                         IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  ibv_cq_ex* scq = create(flags);
  ibv_cq_ex* rcq = create(flags);
  ASSERT_NE(nullptr, scq) << strerror(errno);
  ASSERT_NE(nullptr, rcq) << strerror(errno);
  Endpoint a, b;
  ASSERT_TRUE(endpoint(scq, rcq, a)) << strerror(errno);
  // b uses plain CQs: both kinds of CQ live side by side.
  ConnOptions o;
  o.psn = 100;
  ASSERT_TRUE(create_endpoint(d, o, b));
  ASSERT_TRUE(connect_endpoint(a, o, d.gid, b.qpn, b.psn));
  ASSERT_TRUE(connect_endpoint(b, o, d.gid, a.qpn, a.psn));

  Buffer ba(65536), bb(65536);
  ibv_mr* ma = ibv_reg_mr(d.pd, ba.data(), ba.size(), kAllAccess);
  ibv_mr* mb = ibv_reg_mr(d.pd, bb.data(), bb.size(), kAllAccess);
  ASSERT_NE(nullptr, ma);
  ASSERT_NE(nullptr, mb);

  ibv_values_ex rt{};
  rt.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  ASSERT_EQ(0, ibv_query_rt_values_ex(d.ctx, &rt));
  const uint64_t raw_before = uint64_t(rt.raw_clock.tv_sec) * 1000000000u + rt.raw_clock.tv_nsec;
  const uint64_t wall_before = now_ns(CLOCK_REALTIME);

  // Three completions on a's receive CQ: SEND with immediate, plain SEND, WRITE with imm.
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_EQ(0, post_recv(a.qp, id, ba.data(), 4096, ma->lkey));
  ASSERT_EQ(
      0, post_send(b.qp, IBV_WR_SEND_WITH_IMM, 11, bb.data(), 300, mb->lkey, 0, 0, htonl(0xabcd)));
  ASSERT_EQ(0, post_send(b.qp, IBV_WR_SEND, 12, bb.data(), 1234, mb->lkey));
  ASSERT_EQ(0, post_send(b.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 13, bb.data(), 77, mb->lkey,
                         ba.addr() + 8192, ma->rkey, htonl(7)));
  poll_n(b.scq, 3);

  ASSERT_EQ(0, start(rcq));
  EXPECT_EQ(1u, rcq->wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, rcq->status);
  EXPECT_EQ(IBV_WC_RECV, ibv_wc_read_opcode(rcq));
  EXPECT_EQ(300u, ibv_wc_read_byte_len(rcq));
  EXPECT_EQ(htonl(0xabcd), ibv_wc_read_imm_data(rcq));
  EXPECT_TRUE(ibv_wc_read_wc_flags(rcq) & IBV_WC_WITH_IMM);
  EXPECT_EQ(a.qpn, ibv_wc_read_qp_num(rcq));
  EXPECT_EQ(b.qpn, ibv_wc_read_src_qp(rcq));
  EXPECT_EQ(0u, ibv_wc_read_vendor_err(rcq));
  EXPECT_EQ(0u, ibv_wc_read_slid(rcq));
  EXPECT_EQ(0u, ibv_wc_read_sl(rcq));
  EXPECT_EQ(0u, ibv_wc_read_dlid_path_bits(rcq));
  const uint64_t ts1 = ibv_wc_read_completion_ts(rcq);
  const uint64_t wall1 = ibv_wc_read_completion_wallclock_ns(rcq);
  EXPECT_GE(ts1, raw_before);
  EXPECT_GE(wall1, wall_before);
  EXPECT_LE(wall1, now_ns(CLOCK_REALTIME));

  // The other two arrive in order through next_poll (bounded retries while in flight).
  int rc = ENOENT;
  for (int i = 0; i < 100000 && rc == ENOENT; ++i) rc = ibv_next_poll(rcq);
  ASSERT_EQ(0, rc);
  EXPECT_EQ(2u, rcq->wr_id);
  EXPECT_EQ(IBV_WC_RECV, ibv_wc_read_opcode(rcq));
  EXPECT_EQ(1234u, ibv_wc_read_byte_len(rcq));
  EXPECT_FALSE(ibv_wc_read_wc_flags(rcq) & IBV_WC_WITH_IMM);
  EXPECT_GE(ibv_wc_read_completion_ts(rcq), ts1);
  rc = ENOENT;
  for (int i = 0; i < 100000 && rc == ENOENT; ++i) rc = ibv_next_poll(rcq);
  ASSERT_EQ(0, rc);
  EXPECT_EQ(3u, rcq->wr_id);
  EXPECT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, ibv_wc_read_opcode(rcq));
  EXPECT_EQ(htonl(7), ibv_wc_read_imm_data(rcq));
  EXPECT_EQ(ENOENT, ibv_next_poll(rcq)) << "nothing more";
  ibv_end_poll(rcq);
  EXPECT_EQ(ENOENT, ibv_start_poll(rcq, nullptr)) << "the CQ is drained";

  // a's send CQ through the extended API, and the same CQ through plain ibv_poll_cq.
  ASSERT_EQ(0,
            post_send(a.qp, IBV_WR_RDMA_READ, 21, ba.data(), 500, ma->lkey, bb.addr(), mb->rkey));
  ASSERT_EQ(0, start(scq));
  EXPECT_EQ(21u, scq->wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, scq->status);
  EXPECT_EQ(IBV_WC_RDMA_READ, ibv_wc_read_opcode(scq));
  EXPECT_EQ(a.qpn, ibv_wc_read_qp_num(scq));
  ibv_end_poll(scq);
  ASSERT_EQ(0,
            post_send(a.qp, IBV_WR_RDMA_WRITE, 22, ba.data(), 10, ma->lkey, bb.addr(), mb->rkey));
  EXPECT_EQ(IBV_WC_RDMA_WRITE, poll_success(a.scq, 22, IBV_WC_RDMA_WRITE).opcode);

  destroy_endpoint(a);
  destroy_endpoint(b);
  EXPECT_EQ(0, ibv_dereg_mr(ma));
  EXPECT_EQ(0, ibv_dereg_mr(mb));
}

// A CQ overrun is reported by start_poll as an error, not as an empty CQ.
TEST_F(CqEx, OverrunIsAnErrorNotEmpty) {
  ibv_cq_ex* scq = create(IBV_WC_STANDARD_FLAGS, 2);
  ibv_cq_ex* rcq = create(IBV_WC_STANDARD_FLAGS, 2);
  ASSERT_NE(nullptr, scq);
  ASSERT_NE(nullptr, rcq);
  Endpoint a;
  ASSERT_TRUE(endpoint(scq, rcq, a));
  ConnOptions o;
  o.psn = 100;
  ASSERT_TRUE(connect_endpoint(a, o, d.gid, a.qpn, a.psn)) << "connected to itself";
  Buffer buf(4096);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  for (uint64_t id = 1; id <= 3; ++id)
    ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_WRITE, id, buf.data(), 8, mr->lkey, buf.addr() + 1024,
                           mr->rkey));
  // Nothing is polled until all three have had ample time to complete (loopback: µs).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int rc = ENOENT;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((rc = ibv_start_poll(scq, nullptr)) == ENOENT && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (rc == 0) ibv_end_poll(scq);
  EXPECT_EQ(EOVERFLOW, rc) << "three completions in a CQ of two, none polled";
  destroy_endpoint(a);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

}  // namespace
}  // namespace softrdma::verbs_test
