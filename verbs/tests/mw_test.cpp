// Memory windows between two processes (IBTA vol 1, 10.6.7): the target binds a window over
// part of its MR and hands its R_Key to the initiator, whose remote accesses through that key
// succeed inside the window's range and rights and fail with IBV_WC_REM_ACCESS_ERR outside
// them, after a type 1 window is unbound (bind of length 0), after a type 2 window is
// invalidated locally (IBV_WR_LOCAL_INV) or by the initiator's SEND with invalidate.
// Binds are posted through ibv_bind_mw (type 1), ibv_post_send and ibv_wr_bind_mw (type 2).
#include <cstring>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr uint64_t kSeed = 0x3333;
constexpr uint32_t kWinOff = 4096;  // the window: [buf + 4096, buf + 8192)
constexpr uint32_t kWinLen = 4096;

/// What the target tells the initiator: the window's R_Key and start address.
struct WindowInfo {
  uint32_t rkey;
  uint64_t addr;
};

/// Two roles; the target's (role 1) MR allows binding windows. Role 0 initiates.
void run_mw_pair(std::function<void(Role&)> initiator, std::function<void(Role&)> target,
                 ConnOptions conn = {}) {
  Spec s;
  s.roles.resize(2);
  s.roles[0].fn = std::move(initiator);
  s.roles[1].fn = std::move(target);
  s.roles[1].mr_access = kAllAccess | IBV_ACCESS_MW_BIND;
  s.links = {{0, 1}};
  s.conn = conn;
  s.deadline = 60s;
  run_roles(s);
}

/// Posts a WRITE of `len` pattern bytes from the initiator's buffer and returns its status.
ibv_wc_status write_through(Role& r, uint32_t rkey, uint64_t addr, uint32_t len, uint64_t id) {
  auto& l = r.link();
  if (post_send(l.ep.qp, IBV_WR_RDMA_WRITE, id, r.buf(), len, r.lkey(), addr, rkey) != 0)
    fail_fatal("ibv_post_send refused the WRITE");
  const ibv_wc wc = poll_one(l.ep.scq);
  EXPECT_EQ(id, wc.wr_id) << describe(wc);
  return wc.status;
}

/// Binds a type 1 window over the target's [kWinOff, kWinOff + len) with `access` by
/// ibv_bind_mw and waits for the IBV_WC_BIND_MW completion. Returns the window's new R_Key.
uint32_t bind_type1(Role& r, ibv_mw* mw, uint64_t len, unsigned access) {
  auto& l = r.link();
  ibv_mw_bind b{};
  b.wr_id = 500;
  b.send_flags = IBV_SEND_SIGNALED;
  b.bind_info = {r.mr(), reinterpret_cast<uintptr_t>(r.buf() + kWinOff), len, access};
  const uint32_t before = mw->rkey;
  EXPECT_EQ(0, ibv_bind_mw(l.ep.qp, mw, &b));
  EXPECT_NE(before, mw->rkey) << "a bind moves the window to the next R_Key";
  EXPECT_EQ(before >> 8, mw->rkey >> 8) << "… of the same index";
  poll_success(l.ep.scq, 500, IBV_WC_BIND_MW);
  return mw->rkey;
}

/// Binds a type 2 window by an IBV_WR_BIND_MW work request and returns its R_Key.
uint32_t bind_type2(Role& r, ibv_mw* mw, unsigned access) {
  auto& l = r.link();
  ibv_send_wr wr{};
  wr.wr_id = 600;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = {r.mr(), reinterpret_cast<uintptr_t>(r.buf() + kWinOff), kWinLen, access};
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(0, ibv_post_send(l.ep.qp, &wr, &bad));
  poll_success(l.ep.scq, 600, IBV_WC_BIND_MW);
  return wr.bind_mw.rkey;
}

// Type 1: WRITE and READ inside the window succeed and land in the MR; a WRITE one byte past
// the window's end (still inside the MR) is a remote access error.
TEST(MemoryWindows, Type1GrantsItsRangeOnly) {
  run_mw_pair(
      [](Role& r) {
        fill_pattern(r.buf(), kWinLen, kSeed);
        const auto w = r.recv_value<WindowInfo>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_through(r, w.rkey, w.addr, kWinLen, 1));
        auto& l = r.link();
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, 2, r.buf() + 65536, 100, r.lkey(),
                               w.addr + 10, w.rkey));
        poll_success(l.ep.scq, 2, IBV_WC_RDMA_READ);
        EXPECT_TRUE(HasPattern(r.buf() + 65536, 100, kSeed, 10));
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_through(r, w.rkey, w.addr + kWinLen, 1, 3));
        r.send_value(1, uint32_t{1});
      },
      [](Role& r) {
        memset(r.buf(), kGuard, 3 * kWinLen);
        ibv_mw* mw = ibv_alloc_mw(r.dev().pd, IBV_MW_TYPE_1);
        ASSERT_NE(nullptr, mw) << strerror(errno);
        EXPECT_EQ(IBV_MW_TYPE_1, mw->type);
        const uint32_t rkey =
            bind_type1(r, mw, kWinLen, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
        r.send_value(0, WindowInfo{rkey, reinterpret_cast<uintptr_t>(r.buf() + kWinOff)});
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 3 * kWinLen, kWinOff, kWinLen, kSeed));
        EXPECT_EQ(EINVAL, ibv_dereg_mr(r.mr())) << "an MR with a bound window stays";
        EXPECT_EQ(0, ibv_dealloc_mw(mw));
      });
}

// A window grants only its own rights (here READ): a WRITE through it fails although the MR
// and the QP allow writes.
TEST(MemoryWindows, Type1GrantsItsRightsOnly) {
  run_mw_pair(
      [](Role& r) {
        const auto w = r.recv_value<WindowInfo>(1);
        auto& l = r.link();
        ASSERT_EQ(0,
                  post_send(l.ep.qp, IBV_WR_RDMA_READ, 1, r.buf(), 64, r.lkey(), w.addr, w.rkey));
        poll_success(l.ep.scq, 1, IBV_WC_RDMA_READ);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_through(r, w.rkey, w.addr, 8, 2));
        r.barrier();
      },
      [](Role& r) {
        ibv_mw* mw = ibv_alloc_mw(r.dev().pd, IBV_MW_TYPE_1);
        ASSERT_NE(nullptr, mw);
        const uint32_t rkey = bind_type1(r, mw, kWinLen, IBV_ACCESS_REMOTE_READ);
        r.send_value(0, WindowInfo{rkey, reinterpret_cast<uintptr_t>(r.buf() + kWinOff)});
        r.barrier();  // the initiator is done
        EXPECT_EQ(0, ibv_dealloc_mw(mw));
      });
}

// Binding a type 1 window with length 0 unbinds it: its (new) R_Key grants nothing.
TEST(MemoryWindows, Type1BoundWithLengthZeroGrantsNothing) {
  run_mw_pair(
      [](Role& r) {
        auto w = r.recv_value<WindowInfo>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_through(r, w.rkey, w.addr, 16, 1));
        r.send_value(1, uint32_t{1});
        w = r.recv_value<WindowInfo>(1);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_through(r, w.rkey, w.addr, 16, 2));
        r.barrier();
      },
      [](Role& r) {
        ibv_mw* mw = ibv_alloc_mw(r.dev().pd, IBV_MW_TYPE_1);
        ASSERT_NE(nullptr, mw);
        const uint64_t addr = reinterpret_cast<uintptr_t>(r.buf() + kWinOff);
        r.send_value(0, WindowInfo{bind_type1(r, mw, kWinLen, IBV_ACCESS_REMOTE_WRITE), addr});
        r.recv_value<uint32_t>(0);
        r.send_value(0, WindowInfo{bind_type1(r, mw, 0, 0), addr});
        r.barrier();  // the initiator is done
        EXPECT_EQ(0, ibv_dealloc_mw(mw));
      });
}

// Type 2, bound by ibv_post_send: valid until the target invalidates it with LOCAL_INV.
TEST(MemoryWindows, Type2InvalidatedLocally) {
  run_mw_pair(
      [](Role& r) {
        fill_pattern(r.buf(), 64, kSeed);
        const auto w = r.recv_value<WindowInfo>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_through(r, w.rkey, w.addr + 64, 64, 1));
        r.send_value(1, uint32_t{1});
        r.recv_value<uint32_t>(1);  // invalidated
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_through(r, w.rkey, w.addr, 8, 2));
        r.barrier();
      },
      [](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 3 * kWinLen);
        ibv_mw* mw = ibv_alloc_mw(r.dev().pd, IBV_MW_TYPE_2);
        ASSERT_NE(nullptr, mw) << strerror(errno);
        const uint32_t rkey = bind_type2(r, mw, IBV_ACCESS_REMOTE_WRITE);
        r.send_value(0, WindowInfo{rkey, reinterpret_cast<uintptr_t>(r.buf() + kWinOff)});
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 3 * kWinLen, kWinOff + 64, 64, kSeed));
        ibv_send_wr wr{};
        wr.wr_id = 700;
        wr.opcode = IBV_WR_LOCAL_INV;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.invalidate_rkey = rkey;
        ibv_send_wr* bad = nullptr;
        ASSERT_EQ(0, ibv_post_send(l.ep.qp, &wr, &bad));
        poll_success(l.ep.scq, 700, IBV_WC_LOCAL_INV);
        r.send_value(0, uint32_t{1});
        r.barrier();  // the initiator is done
        EXPECT_EQ(0, ibv_dealloc_mw(mw));
      });
}

// Type 2, bound by ibv_wr_bind_mw: the initiator's SEND with invalidate (ibv_wr_send_inv)
// invalidates it; the target's receive completion says which R_Key (IBV_WC_WITH_INV).
TEST(MemoryWindows, Type2InvalidatedBySendWithInvalidate) {
  ConnOptions conn;
  conn.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV |
                        IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_RDMA_WRITE;
  run_mw_pair(
      [](Role& r) {
        auto& l = r.link();
        const auto w = r.recv_value<WindowInfo>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_through(r, w.rkey, w.addr, 32, 1));
        ibv_qp_ex* qx = ibv_qp_to_qp_ex(l.ep.qp);
        ASSERT_NE(nullptr, qx);
        ibv_wr_start(qx);
        qx->wr_id = 2;
        qx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send_inv(qx, w.rkey);
        ibv_wr_set_sge(qx, r.lkey(), reinterpret_cast<uintptr_t>(r.buf()), 10);
        ASSERT_EQ(0, ibv_wr_complete(qx));
        poll_success(l.ep.scq, 2, IBV_WC_SEND);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_through(r, w.rkey, w.addr, 8, 3));
        r.barrier();
      },
      [](Role& r) {
        auto& l = r.link();
        ibv_mw* mw = ibv_alloc_mw(r.dev().pd, IBV_MW_TYPE_2);
        ASSERT_NE(nullptr, mw);
        ASSERT_EQ(0, post_recv(l.ep.qp, 9, r.buf() + 65536, 64, r.lkey()));
        ibv_qp_ex* qx = ibv_qp_to_qp_ex(l.ep.qp);
        ASSERT_NE(nullptr, qx);
        const uint32_t rkey = ibv_inc_rkey(mw->rkey);
        const ibv_mw_bind_info info{r.mr(), reinterpret_cast<uintptr_t>(r.buf() + kWinOff), kWinLen,
                                    IBV_ACCESS_REMOTE_WRITE};
        ibv_wr_start(qx);
        qx->wr_id = 800;
        qx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_bind_mw(qx, mw, rkey, &info);
        ASSERT_EQ(0, ibv_wr_complete(qx));
        poll_success(l.ep.scq, 800, IBV_WC_BIND_MW);
        r.send_value(0, WindowInfo{rkey, info.addr});
        const ibv_wc wc = poll_success(l.ep.rcq, 9, IBV_WC_RECV);
        EXPECT_EQ(10u, wc.byte_len);
        EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_INV) << describe(wc);
        EXPECT_EQ(rkey, wc.invalidated_rkey);
        r.barrier();  // the initiator is done
        EXPECT_EQ(0, ibv_dealloc_mw(mw));
      },
      conn);
}

// Deallocating a bound window revokes it (pyverbs test_mw_type2_invalidate_dealloc).
TEST(MemoryWindows, DeallocatedWindowGrantsNothing) {
  run_mw_pair(
      [](Role& r) {
        const auto w = r.recv_value<WindowInfo>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_through(r, w.rkey, w.addr, 8, 1));
        r.send_value(1, uint32_t{1});
        r.recv_value<uint32_t>(1);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_through(r, w.rkey, w.addr, 8, 2));
        r.barrier();
      },
      [](Role& r) {
        ibv_mw* mw = ibv_alloc_mw(r.dev().pd, IBV_MW_TYPE_2);
        ASSERT_NE(nullptr, mw);
        const uint32_t rkey = bind_type2(r, mw, IBV_ACCESS_REMOTE_WRITE);
        r.send_value(0, WindowInfo{rkey, reinterpret_cast<uintptr_t>(r.buf() + kWinOff)});
        r.recv_value<uint32_t>(0);
        EXPECT_EQ(0, ibv_dealloc_mw(mw));
        r.send_value(0, uint32_t{1});
        r.barrier();  // the initiator is done
      });
}

}  // namespace
}  // namespace softrdma::verbs_test
