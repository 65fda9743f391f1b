// RDMA ATOMIC WRITE (IBTA vol 1 rel. 1.5; Linux rxe since 6.2) between two processes: the 8
// bytes land at the target whole (ibv_wr_atomic_write through ibv_create_qp_ex, and
// IBV_WR_ATOMIC_WRITE through ibv_post_send with an SGE), completions carry
// IBV_WC_ATOMIC_WRITE; the errors real devices give — a misaligned address NAKed as an
// invalid request (IBV_WC_REM_INV_REQ_ERR), an MR without REMOTE_WRITE as a remote access
// error (IBV_WC_REM_ACCESS_ERR) — leave the target's memory untouched; under injected loss
// every ATOMIC WRITE is executed exactly once (duplicates re-ACKed, never re-executed).
// Run on both packet paths (the suite runs once more with SOFTRDMA_TRANSPORT=udp).
#include <cstring>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

ConnOptions aw_conn() {
  ConnOptions c;
  c.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE;
  return c;
}

ibv_qp_ex* qp_ex(Link& l) {
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(l.ep.qp);
  if (!qx) fail_fatal("ibv_qp_to_qp_ex returned NULL for a QP created with send_ops_flags");
  return qx;
}

constexpr uint64_t kValue1 = 0x0123456789abcdefull;
constexpr uint64_t kValue2 = 0xfedcba9876543210ull;

// Two ATOMIC WRITEs in one ibv_wr_start … ibv_wr_complete batch (the value buffer reused at
// once: it is copied when set), then one by ibv_post_send from a registered buffer; the
// target finds exactly those 24 bytes and its guard bytes around them untouched.
TEST(AtomicWrite, EightBytesLandWhole) {
  run_pair(
      aw_conn(),
      [](Role& r) {
        auto& l = r.link();
        r.barrier();  // the target's buffer is set
        ibv_qp_ex* qx = qp_ex(l);
        uint64_t v = kValue1;
        ibv_wr_start(qx);
        qx->wr_id = 1;
        qx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_atomic_write(qx, l.remote.rkey, l.remote.addr + 64, &v);
        v = kValue2;
        qx->wr_id = 2;
        ibv_wr_atomic_write(qx, l.remote.rkey, l.remote.addr + 72, &v);
        v = 0;
        ASSERT_EQ(0, ibv_wr_complete(qx));
        poll_success(l.ep.scq, 1, IBV_WC_ATOMIC_WRITE);
        poll_success(l.ep.scq, 2, IBV_WC_ATOMIC_WRITE);
        auto* src = reinterpret_cast<uint64_t*>(r.buf());
        *src = 0x1111222233334444ull;
        ASSERT_EQ(0, SendWr(IBV_WR_ATOMIC_WRITE, 3)
                         .add_sge(src, 8, r.lkey())
                         .remote(l.remote.addr + 80, l.remote.rkey)
                         .post(l.ep.qp));
        poll_success(l.ep.scq, 3, IBV_WC_ATOMIC_WRITE);
        r.send_value(1, uint32_t{1});
      },
      [](Role& r) {
        std::memset(r.buf(), kGuard, 4096);
        r.barrier();
        r.recv_value<uint32_t>(0);
        const auto* w = reinterpret_cast<const uint64_t*>(r.buf());
        EXPECT_EQ(kValue1, __atomic_load_n(&w[8], __ATOMIC_ACQUIRE));
        EXPECT_EQ(kValue2, __atomic_load_n(&w[9], __ATOMIC_ACQUIRE));
        EXPECT_EQ(0x1111222233334444ull, __atomic_load_n(&w[10], __ATOMIC_ACQUIRE));
        EXPECT_TRUE(AllBytesAre(r.buf(), 64, kGuard));
        EXPECT_TRUE(AllBytesAre(r.buf() + 88, 4096 - 88, kGuard));
        EXPECT_EQ(3u, r.counters()["atomic_write_executed"]);
      });
}

// One refused ATOMIC WRITE: the requester's completion has `status` (the QP then flushes),
// the target's memory is unchanged. `offset` is the target address's offset in its buffer.
void refused(Role& r, uint64_t offset, ibv_wc_status status) {
  auto& l = r.link();
  r.barrier();
  ibv_qp_ex* qx = qp_ex(l);
  const uint64_t v = kValue1;
  ibv_wr_start(qx);
  qx->wr_id = 7;
  qx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(qx, l.remote.rkey, l.remote.addr + offset, &v);
  ASSERT_EQ(0, ibv_wr_complete(qx));
  const ibv_wc wc = poll_one(l.ep.scq, 10s);
  EXPECT_EQ(7u, wc.wr_id);
  EXPECT_EQ(status, wc.status) << describe(wc);
  r.send_value(1, uint32_t{1});
}

void target_unchanged(Role& r) {
  std::memset(r.buf(), kGuard, 4096);
  r.barrier();
  r.recv_value<uint32_t>(0);
  EXPECT_TRUE(AllBytesAre(r.buf(), 4096, kGuard));
  EXPECT_EQ(0u, r.counters()["atomic_write_executed"]);
}

// rxe's responder: an address that is not 8-byte aligned is RESPST_ERR_MISALIGNED_ATOMIC,
// NAK invalid request (IBTA 9.7.5.2.3) → IBV_WC_REM_INV_REQ_ERR at the requester.
TEST(AtomicWrite, MisalignedAddressIsRemoteInvalidRequest) {
  run_pair(
      aw_conn(), [](Role& r) { refused(r, 68, IBV_WC_REM_INV_REQ_ERR); }, target_unchanged);
}

// The target's MR grants remote READ and atomics but not REMOTE_WRITE, the right ATOMIC
// WRITE needs (rxe checks IB_ACCESS_REMOTE_WRITE): NAK remote access error.
TEST(AtomicWrite, MrWithoutRemoteWriteIsRemoteAccessError) {
  Spec s;
  s.conn = aw_conn();
  s.roles.resize(2);
  s.links = {{0, 1}};
  s.roles[0].fn = [](Role& r) { refused(r, 64, IBV_WC_REM_ACCESS_ERR); };
  s.roles[1].fn = target_unchanged;
  s.roles[1].mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  run_roles(s);
}

// Under injected loss in both directions (lost requests are resent; lost ACKs make the
// requester resend what the target executed already, a duplicate the target re-ACKs), a
// run of ATOMIC WRITEs, each to its own word, ends with every word written and each request
// executed exactly once (atomic_write_executed), whatever was resent.
TEST(AtomicWrite, ExactlyOnceUnderLoss) {
  constexpr int kWrites = 200;
  constexpr int kWindow = 8;
  Spec s;
  s.conn = aw_conn();
  s.conn.timeout = 12;  // 16.8 ms
  s.conn.max_rd_atomic = kWindow;
  s.roles.resize(2);
  s.links = {{0, 1}};
  for (auto& role : s.roles) role.env = {{"SOFTRDMA_NETEM", "loss=10%,seed=11"}};
  s.roles[0].fn = [](Role& r) {
    auto& l = r.link();
    r.barrier();
    ibv_qp_ex* qx = qp_ex(l);
    int posted = 0, done = 0;
    while (done < kWrites) {
      while (posted < kWrites && posted - done < kWindow) {
        const uint64_t v = 0xa5a5000000000000ull | uint64_t(posted);
        ibv_wr_start(qx);
        qx->wr_id = uint64_t(posted);
        qx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_atomic_write(qx, l.remote.rkey, l.remote.addr + 8 * uint64_t(posted), &v);
        ASSERT_EQ(0, ibv_wr_complete(qx));
        ++posted;
      }
      poll_success(l.ep.scq, uint64_t(done), IBV_WC_ATOMIC_WRITE, 30s);
      ++done;
    }
    r.send_value(1, uint32_t{1});
  };
  s.roles[1].fn = [](Role& r) {
    std::memset(r.buf(), 0, 8 * kWrites);
    const Counters before = r.counters();
    r.barrier();
    r.recv_value<uint32_t>(0);
    const auto* w = reinterpret_cast<const uint64_t*>(r.buf());
    int wrong = 0;
    for (int i = 0; i < kWrites; ++i) wrong += w[i] != (0xa5a5000000000000ull | uint64_t(i));
    EXPECT_EQ(0, wrong);
    const Counters after = r.counters();
    EXPECT_EQ(uint64_t(kWrites), after["atomic_write_executed"] - before["atomic_write_executed"]);
    printf("[ target] duplicate_request=+%lu emulated_drops=+%lu\n",
           (unsigned long)(after["duplicate_request"] - before["duplicate_request"]),
           (unsigned long)(after["emulated_drops"] - before["emulated_drops"]));
  };
  s.deadline = 120s;
  run_roles(s);
}

}  // namespace
}  // namespace softrdma::verbs_test
