// Device memory between two processes (ibv_alloc_dm(3), ibv_reg_dm_mr): the target
// registers part of its DM as a zero-based MR and hands out the R_Key; the initiator's RDMA
// WRITE, READ and atomics address the MR by offset from 0, and the target checks what landed
// with ibv_memcpy_from_dm, byte by byte (nothing outside the written range changes). The
// initiator also gathers from and scatters into a DM MR of its own (DM to DM).
#include <cstring>
#include <vector>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr unsigned kDmAccess = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE |
                               IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_REMOTE_ATOMIC;
constexpr size_t kDmSize = 64 * 1024;
constexpr uint64_t kMrOff = 8192;  // the target's MR: DM bytes [8192, 8192 + kMrLen)
constexpr size_t kMrLen = 32 * 1024;

/// A DM of kDmSize bytes with a zero-based MR over [kMrOff, kMrOff + kMrLen), freed with it.
struct DmRegion {
  ibv_dm* dm = nullptr;
  ibv_mr* mr = nullptr;
  explicit DmRegion(Role& r) {
    ibv_alloc_dm_attr a{kDmSize, 3, 0};
    dm = ibv_alloc_dm(r.dev().ctx, &a);
    if (!dm) fail_fatal(std::string("ibv_alloc_dm: ") + strerror(errno));
    mr = ibv_reg_dm_mr(r.dev().pd, dm, kMrOff, kMrLen, kDmAccess);
    if (!mr) fail_fatal(std::string("ibv_reg_dm_mr: ") + strerror(errno));
  }
  ~DmRegion() {
    EXPECT_EQ(0, ibv_dereg_mr(mr));
    EXPECT_EQ(0, ibv_free_dm(dm));
  }
  /// The whole DM as ibv_memcpy_from_dm reads it.
  std::vector<uint8_t> contents() const {
    std::vector<uint8_t> v(kDmSize);
    EXPECT_EQ(0, ibv_memcpy_from_dm(v.data(), dm, 0, kDmSize));
    return v;
  }
};

/// Role 1 owns a DM MR and sends its R_Key; role 0 runs `initiator` against it, then both
/// run their checks in the order the messages between them give.
void run_dm_pair(std::function<void(Role&)> initiator, std::function<void(Role&)> target) {
  run_pair(ConnOptions{}, std::move(initiator), std::move(target));
}

// RDMA WRITE of 20000 bytes (20 packets at MTU 1024) into the remote DM MR at MR offset 300,
// then a READ of a range the target wrote with ibv_memcpy_to_dm.
TEST(DmTraffic, WriteAndReadRemoteDmMr) {
  constexpr uint32_t kLen = 20000, kOff = 300;
  run_dm_pair(
      [](Role& r) {
        auto& l = r.link();
        const uint32_t rkey = r.recv_value<uint32_t>(1);
        fill_pattern(r.buf(), kLen, 0xD1);
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 1, r.buf(), kLen, r.lkey(), kOff, rkey));
        poll_success(l.ep.scq, 1, IBV_WC_RDMA_WRITE);
        r.send_value<int>(1, 1);
        ASSERT_EQ(2, r.recv_value<int>(1));  // the target wrote its pattern
        std::memset(r.buf(), kGuard, 2 * kLen);
        ASSERT_EQ(
            0, post_send(l.ep.qp, IBV_WR_RDMA_READ, 2, r.buf() + 100, kLen, r.lkey(), 1024, rkey));
        poll_success(l.ep.scq, 2, IBV_WC_RDMA_READ);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 2 * kLen, 100, kLen, 0xD2));
        r.send_value<int>(1, 3);
      },
      [](Role& r) {
        DmRegion d(r);
        r.send_value<uint32_t>(0, d.mr->rkey);
        ASSERT_EQ(1, r.recv_value<int>(0));
        std::vector<uint8_t> v = d.contents();
        EXPECT_TRUE(HasPattern(v.data() + kMrOff + kOff, kLen, 0xD1));
        EXPECT_TRUE(AllBytesAre(v.data(), kMrOff + kOff, 0)) << "before the WRITE";
        EXPECT_TRUE(AllBytesAre(v.data() + kMrOff + kOff + kLen, kDmSize - kMrOff - kOff - kLen, 0))
            << "after the WRITE";
        std::vector<uint8_t> p(kLen);
        fill_pattern(p.data(), kLen, 0xD2);
        ASSERT_EQ(0, ibv_memcpy_to_dm(d.dm, kMrOff + 1024, p.data(), kLen));
        r.send_value<int>(0, 2);
        ASSERT_EQ(3, r.recv_value<int>(0));  // keep the MR until the READ is done
      });
}

// Both ends in device memory: the initiator WRITEs from its own DM MR (local gather) into
// the target's DM MR and READs it back into another part of its DM MR (local scatter).
TEST(DmTraffic, DmToDm) {
  constexpr uint32_t kLen = 6000;
  run_dm_pair(
      [](Role& r) {
        auto& l = r.link();
        const uint32_t rkey = r.recv_value<uint32_t>(1);
        DmRegion mine(r);
        std::vector<uint8_t> p(kLen);
        fill_pattern(p.data(), kLen, 0xD3);
        ASSERT_EQ(0, ibv_memcpy_to_dm(mine.dm, kMrOff, p.data(), kLen));
        SendWr w(IBV_WR_RDMA_WRITE, 1);
        w.add_sge(nullptr, kLen, mine.mr->lkey).remote(4, rkey);
        ASSERT_EQ(0, w.post(l.ep.qp));
        poll_success(l.ep.scq, 1, IBV_WC_RDMA_WRITE);
        SendWr rd(IBV_WR_RDMA_READ, 2);
        rd.add_sge(reinterpret_cast<void*>(uintptr_t{16384}), kLen, mine.mr->lkey).remote(4, rkey);
        ASSERT_EQ(0, rd.post(l.ep.qp));
        poll_success(l.ep.scq, 2, IBV_WC_RDMA_READ);
        std::vector<uint8_t> v = mine.contents();
        EXPECT_TRUE(HasPattern(v.data() + kMrOff + 16384, kLen, 0xD3));
        r.send_value<int>(1, 1);
      },
      [](Role& r) {
        DmRegion d(r);
        r.send_value<uint32_t>(0, d.mr->rkey);
        ASSERT_EQ(1, r.recv_value<int>(0));
        std::vector<uint8_t> v = d.contents();
        EXPECT_TRUE(HasPattern(v.data() + kMrOff + 4, kLen, 0xD3));
        EXPECT_TRUE(AllBytesAre(v.data(), kMrOff + 4, 0));
      });
}

// Fetch-and-add and compare-and-swap on a word of the remote DM MR; an access past the MR's
// end completes with IBV_WC_REM_ACCESS_ERR.
TEST(DmTraffic, AtomicsAndBoundsOnRemoteDmMr) {
  run_dm_pair(
      [](Role& r) {
        auto& l = r.link();
        const uint32_t rkey = r.recv_value<uint32_t>(1);
        SendWr fa(IBV_WR_ATOMIC_FETCH_AND_ADD, 1);
        fa.add_sge(r.buf(), 8, r.lkey()).atomic(64, rkey, 5);
        ASSERT_EQ(0, fa.post(l.ep.qp));
        poll_success(l.ep.scq, 1, IBV_WC_FETCH_ADD);
        uint64_t v = 0;
        std::memcpy(&v, r.buf(), 8);
        EXPECT_EQ(100u, v);
        SendWr cs(IBV_WR_ATOMIC_CMP_AND_SWP, 2);
        cs.add_sge(r.buf() + 8, 8, r.lkey()).atomic(64, rkey, 105, 7);
        ASSERT_EQ(0, cs.post(l.ep.qp));
        poll_success(l.ep.scq, 2, IBV_WC_COMP_SWAP);
        std::memcpy(&v, r.buf() + 8, 8);
        EXPECT_EQ(105u, v);
        r.send_value<int>(1, 1);
        ASSERT_EQ(2, r.recv_value<int>(1));
        ASSERT_EQ(
            0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 3, r.buf(), 64, r.lkey(), kMrLen - 32, rkey));
        const ibv_wc wc = poll_one(l.ep.scq);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << describe(wc);
        r.send_value<int>(1, 3);
      },
      [](Role& r) {
        DmRegion d(r);
        const uint64_t init = 100;
        ASSERT_EQ(0, ibv_memcpy_to_dm(d.dm, kMrOff + 64, &init, 8));
        r.send_value<uint32_t>(0, d.mr->rkey);
        ASSERT_EQ(1, r.recv_value<int>(0));
        uint64_t v = 0;
        ASSERT_EQ(0, ibv_memcpy_from_dm(&v, d.dm, kMrOff + 64, 8));
        EXPECT_EQ(7u, v);
        r.send_value<int>(0, 2);
        ASSERT_EQ(3, r.recv_value<int>(0));
        std::vector<uint8_t> all = d.contents();
        EXPECT_TRUE(AllBytesAre(all.data() + kMrOff + kMrLen - 32, 32, 0))
            << "the refused WRITE wrote nothing";
      });
}

}  // namespace
}  // namespace softrdma::verbs_test
