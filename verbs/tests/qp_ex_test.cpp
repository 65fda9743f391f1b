// The extended post API between two processes: QPs created by ibv_create_qp_ex with
// send_ops_flags, work requests built with ibv_wr_* between ibv_wr_start and ibv_wr_complete
// — SEND, SEND with immediate, inline data (one buffer and a list), SGE lists, RDMA WRITE,
// WRITE with immediate, RDMA READ, COMPARE & SWAP, FETCH & ADD — several in one batch, data
// verified byte for byte. (BIND_MW, LOCAL_INV and SEND with invalidate: mw_test.cpp.)
#include <arpa/inet.h>

#include <cstring>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr uint64_t kSeed = 0x9e11;
constexpr uint64_t kSeed2 = 0x7ead;

constexpr uint64_t kAllOps = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                             IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                             IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                             IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV |
                             IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV;

ConnOptions ex_conn() {
  ConnOptions c;
  c.send_ops_flags = kAllOps;
  c.max_inline_data = 128;
  return c;
}

ibv_qp_ex* qp_ex(Link& l) {
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(l.ep.qp);
  if (!qx) fail_fatal("ibv_qp_to_qp_ex returned NULL for a QP created with send_ops_flags");
  return qx;
}

// Four SENDs in one batch: an SGE, an SGE list with immediate, inline data (copied when set:
// the buffer is overwritten before ibv_wr_complete), and an inline list.
TEST(WrApi, SendsOfEveryKindInOneBatch) {
  run_pair(
      ex_conn(),
      [](Role& r) {
        fill_pattern(r.buf(), 8192, kSeed);
        r.barrier();  // receives posted
        auto& l = r.link();
        ibv_qp_ex* qx = qp_ex(l);
        uint8_t inl[100];
        std::memcpy(inl, r.buf() + 4000, sizeof inl);
        ibv_wr_start(qx);
        qx->wr_id = 1;
        qx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(qx);
        ibv_wr_set_sge(qx, r.lkey(), reinterpret_cast<uintptr_t>(r.buf()), 3000);
        qx->wr_id = 2;
        ibv_wr_send_imm(qx, htonl(0xabcd0123));
        const ibv_sge list[2] = {{reinterpret_cast<uintptr_t>(r.buf() + 3000), 100, r.lkey()},
                                 {reinterpret_cast<uintptr_t>(r.buf() + 3100), 200, r.lkey()}};
        ibv_wr_set_sge_list(qx, 2, list);
        qx->wr_id = 3;
        ibv_wr_send(qx);
        ibv_wr_set_inline_data(qx, inl, sizeof inl);
        std::memset(inl, 0, sizeof inl);  // inline data was copied at set time
        qx->wr_id = 4;
        ibv_wr_send(qx);
        const ibv_data_buf bufs[2] = {{r.buf() + 5000, 50}, {r.buf() + 6000, 70}};
        ibv_wr_set_inline_data_list(qx, 2, bufs);
        ASSERT_EQ(0, ibv_wr_complete(qx));
        for (uint64_t id = 1; id <= 4; ++id) poll_success(l.ep.scq, id, IBV_WC_SEND);
      },
      [](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 65536);
        for (uint64_t i = 0; i < 4; ++i)
          ASSERT_EQ(0, post_recv(l.ep.qp, 10 + i, r.buf() + i * 8192, 4096, r.lkey()));
        r.barrier();
        ibv_wc wc = poll_success(l.ep.rcq, 10, IBV_WC_RECV);
        EXPECT_EQ(3000u, wc.byte_len);
        EXPECT_TRUE(HasPattern(r.buf(), 3000, kSeed));
        wc = poll_success(l.ep.rcq, 11, IBV_WC_RECV);
        EXPECT_TRUE(CarriesImm(wc, htonl(0xabcd0123)));
        EXPECT_EQ(300u, wc.byte_len);
        EXPECT_TRUE(HasPattern(r.buf() + 8192, 300, kSeed, 3000));
        wc = poll_success(l.ep.rcq, 12, IBV_WC_RECV);
        EXPECT_EQ(100u, wc.byte_len);
        EXPECT_TRUE(HasPattern(r.buf() + 2 * 8192, 100, kSeed, 4000));
        wc = poll_success(l.ep.rcq, 13, IBV_WC_RECV);
        EXPECT_EQ(120u, wc.byte_len);
        EXPECT_TRUE(HasPattern(r.buf() + 3 * 8192, 50, kSeed, 5000));
        EXPECT_TRUE(HasPattern(r.buf() + 3 * 8192 + 50, 70, kSeed, 6000));
        EXPECT_TRUE(AllBytesAre(r.buf() + 3 * 8192 + 120, 100, kGuard));
      });
}

// WRITE (SGE), WRITE with immediate (inline data) and READ in one batch; unsignaled WRs
// complete nothing of their own.
TEST(WrApi, WriteWriteWithImmediateAndRead) {
  run_pair(
      ex_conn(),
      [](Role& r) {
        auto& l = r.link();
        fill_pattern(r.buf(), 8192, kSeed);
        memset(r.buf() + 32768, kGuard, 8192);
        r.barrier();  // the target's receive is posted, its READ source filled
        ibv_qp_ex* qx = qp_ex(l);
        ibv_wr_start(qx);
        qx->wr_id = 1;
        qx->wr_flags = 0;  // unsignaled
        ibv_wr_rdma_write(qx, l.remote.rkey, l.remote.addr + 100);
        ibv_wr_set_sge(qx, r.lkey(), reinterpret_cast<uintptr_t>(r.buf()), 5000);
        qx->wr_id = 2;
        qx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_rdma_write_imm(qx, l.remote.rkey, l.remote.addr + 8192, htonl(77));
        ibv_wr_set_inline_data(qx, r.buf() + 5000, 64);
        qx->wr_id = 3;
        ibv_wr_rdma_read(qx, l.remote.rkey, l.remote.addr + 16384);
        ibv_wr_set_sge(qx, r.lkey(), reinterpret_cast<uintptr_t>(r.buf() + 32768), 3000);
        ASSERT_EQ(0, ibv_wr_complete(qx));
        poll_success(l.ep.scq, 2, IBV_WC_RDMA_WRITE);
        EXPECT_EQ(3000u, poll_success(l.ep.scq, 3, IBV_WC_RDMA_READ).byte_len);
        EXPECT_TRUE(no_completion(l.ep.scq, 20ms));
        EXPECT_TRUE(PatternBetweenGuards(r.buf() + 32768, 8192, 0, 3000, kSeed2));
        r.send_value(1, uint32_t{1});
      },
      [](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 16384);
        fill_pattern(r.buf() + 16384, 3000, kSeed2);
        ASSERT_EQ(0, post_recv(l.ep.qp, 9, nullptr, 0, 0));
        r.barrier();
        const ibv_wc wc = poll_success(l.ep.rcq, 9, IBV_WC_RECV_RDMA_WITH_IMM);
        EXPECT_TRUE(CarriesImm(wc, htonl(77)));
        EXPECT_EQ(64u, wc.byte_len);
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 8192, 100, 5000, kSeed));
        EXPECT_TRUE(PatternBetweenGuards(r.buf() + 8192, 8192, 0, 64, kSeed, 5000));
      });
}

TEST(WrApi, CompareSwapAndFetchAdd) {
  run_pair(
      ex_conn(),
      [](Role& r) {
        auto& l = r.link();
        auto* res = reinterpret_cast<uint64_t*>(r.buf());
        res[0] = res[1] = ~0ull;
        r.barrier();  // the target's words are set
        ibv_qp_ex* qx = qp_ex(l);
        ibv_wr_start(qx);
        qx->wr_id = 1;
        qx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_atomic_cmp_swp(qx, l.remote.rkey, l.remote.addr, 5, 77);
        ibv_wr_set_sge(qx, r.lkey(), reinterpret_cast<uintptr_t>(&res[0]), 8);
        qx->wr_id = 2;
        ibv_wr_atomic_fetch_add(qx, l.remote.rkey, l.remote.addr + 64, 11);
        ibv_wr_set_sge(qx, r.lkey(), reinterpret_cast<uintptr_t>(&res[1]), 8);
        qx->wr_id = 3;  // compare fails now: returns 77, swaps nothing
        ibv_wr_atomic_cmp_swp(qx, l.remote.rkey, l.remote.addr, 5, 99);
        ibv_wr_set_sge(qx, r.lkey(), reinterpret_cast<uintptr_t>(&res[2]), 8);
        ASSERT_EQ(0, ibv_wr_complete(qx));
        poll_success(l.ep.scq, 1, IBV_WC_COMP_SWAP);
        poll_success(l.ep.scq, 2, IBV_WC_FETCH_ADD);
        poll_success(l.ep.scq, 3, IBV_WC_COMP_SWAP);
        EXPECT_EQ(5u, res[0]);
        EXPECT_EQ(100u, res[1]);
        EXPECT_EQ(77u, res[2]);
        r.send_value(1, uint32_t{1});
      },
      [](Role& r) {
        auto* w = reinterpret_cast<uint64_t*>(r.buf());
        w[0] = 5;
        w[8] = 100;
        r.barrier();
        r.recv_value<uint32_t>(0);
        EXPECT_EQ(77u, __atomic_load_n(&w[0], __ATOMIC_ACQUIRE));
        EXPECT_EQ(111u, __atomic_load_n(&w[8], __ATOMIC_ACQUIRE));
      });
}

}  // namespace
}  // namespace softrdma::verbs_test
