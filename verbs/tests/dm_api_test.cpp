// Device memory through the verbs API, in one process (ibv_alloc_dm(3), ibv_reg_dm_mr):
// allocation and its limit (max_dm_size, SOFTRDMA_DM_SIZE), ibv_memcpy_to_dm /
// ibv_memcpy_from_dm and their bounds, zero-based DM MRs and their argument checks, the
// EBUSY rules (a DM with MRs, a PD with DM MRs), and RDMA WRITE / READ / atomics into and
// out of DM MRs between two QPs of one device, checked byte by byte. Errors as rdma-core
// 44's libibverbs, kernel and mlx5 provider give them (docs/verbs.md, "Device memory").
#include <cstdlib>
#include <cstring>
#include <vector>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr uint64_t kDefaultDmSize = 256 * 1024;  // SOFTRDMA_DM_SIZE's default
constexpr unsigned kDmRw = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE |
                           IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                           IBV_ACCESS_REMOTE_ATOMIC;

class Dm : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(open_device(d)); }
  void TearDown() override {
    for (ibv_mr* mr : mrs) ibv_dereg_mr(mr);
    for (ibv_dm* dm : dms) ibv_free_dm(dm);
    close_device(d);
  }
  /// ibv_alloc_dm of `length` bytes; NULL (errno set) on failure. Freed at TearDown.
  ibv_dm* alloc(size_t length, uint32_t log_align = 0, uint32_t comp_mask = 0) {
    ibv_alloc_dm_attr a{length, log_align, comp_mask};
    ibv_dm* dm = ibv_alloc_dm(d.ctx, &a);
    if (dm) dms.push_back(dm);
    return dm;
  }
  /// Frees a DM alloc() returned before TearDown; returns ibv_free_dm's result.
  int free_now(ibv_dm* dm) {
    const int rc = ibv_free_dm(dm);
    if (rc == 0) std::erase(dms, dm);
    return rc;
  }
  ibv_mr* reg(ibv_dm* dm, uint64_t offset, size_t length, unsigned access = kDmRw) {
    ibv_mr* mr = ibv_reg_dm_mr(d.pd, dm, offset, length, access);
    if (mr) mrs.push_back(mr);
    return mr;
  }
  int dereg_now(ibv_mr* mr) {
    const int rc = ibv_dereg_mr(mr);
    if (rc == 0) std::erase(mrs, mr);
    return rc;
  }
  /// The whole of `dm` (`length` bytes, a multiple of 4) as ibv_memcpy_from_dm reads it.
  std::vector<uint8_t> contents(ibv_dm* dm, size_t length) {
    std::vector<uint8_t> v(length);
    EXPECT_EQ(0, ibv_memcpy_from_dm(v.data(), dm, 0, length));
    return v;
  }

  Device d;
  std::vector<ibv_dm*> dms;
  std::vector<ibv_mr*> mrs;
};

TEST_F(Dm, QueryDeviceExReportsMaxDmSize) {
  ibv_device_attr_ex ax{};
  ASSERT_EQ(0, ibv_query_device_ex(d.ctx, nullptr, &ax));
  EXPECT_EQ(kDefaultDmSize, ax.max_dm_size);
}

TEST_F(Dm, AllocAndFree) {
  ibv_dm* dm = alloc(4);
  ASSERT_NE(nullptr, dm) << strerror(errno);
  EXPECT_EQ(d.ctx, dm->context);
  EXPECT_EQ(uint32_t{IBV_DM_MASK_HANDLE}, dm->comp_mask);
  ibv_dm* other = alloc(kDefaultDmSize / 2, 6);
  ASSERT_NE(nullptr, other) << strerror(errno);
  EXPECT_NE(dm->handle, other->handle);
  EXPECT_EQ(0, free_now(dm));
  EXPECT_EQ(0, free_now(other));
}

TEST_F(Dm, AllocArgumentErrors) {
  errno = 0;
  EXPECT_EQ(nullptr, alloc(64, 0, 1));
  EXPECT_EQ(EINVAL, errno) << "no comp_mask bit is defined";
  errno = 0;
  EXPECT_EQ(nullptr, alloc(0));
  EXPECT_EQ(EINVAL, errno) << "length 0";
  errno = 0;
  EXPECT_EQ(nullptr, alloc(kDefaultDmSize + 1));
  EXPECT_EQ(EINVAL, errno) << "above max_dm_size (mlx5_alloc_dm)";
  errno = 0;
  EXPECT_EQ(nullptr, alloc(64, 13));
  EXPECT_EQ(EINVAL, errno) << "alignment above a page";
  EXPECT_NE(nullptr, alloc(kDefaultDmSize, 12)) << "the whole of it, page-aligned";
}

// Allocations count against max_dm_size in 64-byte units; a full device answers ENOMEM
// until memory is freed.
TEST_F(Dm, AllocationsStopAtMaxDmSize) {
  std::vector<ibv_dm*> got;
  for (int i = 0; i < 4; ++i) {
    ibv_dm* dm = alloc(kDefaultDmSize / 4);
    ASSERT_NE(nullptr, dm) << i << ": " << strerror(errno);
    got.push_back(dm);
  }
  errno = 0;
  EXPECT_EQ(nullptr, alloc(4));
  EXPECT_EQ(ENOMEM, errno) << "the device memory is all allocated";
  ASSERT_EQ(0, free_now(got[1]));
  ibv_dm* small = alloc(60);  // one 64-byte unit
  ASSERT_NE(nullptr, small) << strerror(errno);
  errno = 0;
  EXPECT_EQ(nullptr, alloc(kDefaultDmSize / 4 - 60));
  EXPECT_EQ(ENOMEM, errno) << "the 60-byte allocation took 64 bytes";
  EXPECT_NE(nullptr, alloc(kDefaultDmSize / 4 - 64));
}

/// SOFTRDMA_DM_SIZE=value for the scope (read when a device opens).
struct DmSizeEnv {
  explicit DmSizeEnv(const char* value) { setenv("SOFTRDMA_DM_SIZE", value, 1); }
  ~DmSizeEnv() { unsetenv("SOFTRDMA_DM_SIZE"); }
};

// The device's memory comes from SOFTRDMA_DM_SIZE when the device opens; 0 turns it off.
TEST(DmEnvironment, SizeFromSoftrdmaDmSize) {
  for (const char* value : {"4k", "0"}) {
    Device d;
    {
      DmSizeEnv env(value);
      ASSERT_TRUE(open_device(d)) << value;
    }
    ibv_device_attr_ex ax{};
    ASSERT_EQ(0, ibv_query_device_ex(d.ctx, nullptr, &ax));
    ibv_alloc_dm_attr a{4096, 0, 0};
    errno = 0;
    ibv_dm* dm = ibv_alloc_dm(d.ctx, &a);
    if (std::strcmp(value, "4k") == 0) {
      EXPECT_EQ(4096u, ax.max_dm_size);
      EXPECT_NE(nullptr, dm) << strerror(errno);
      ibv_alloc_dm_attr one{4, 0, 0};
      errno = 0;
      EXPECT_EQ(nullptr, ibv_alloc_dm(d.ctx, &one));
      EXPECT_EQ(ENOMEM, errno);
    } else {
      EXPECT_EQ(0u, ax.max_dm_size) << "no device memory";
      EXPECT_EQ(nullptr, dm);
      EXPECT_EQ(EINVAL, errno);
    }
    if (dm) {
      EXPECT_EQ(0, ibv_free_dm(dm));
    }
    close_device(d);
  }
  // A value out of range refuses to open the device, as every SOFTRDMA_* variable does.
  DmSizeEnv env("2g");
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; list && i < n; ++i)
    if (std::strcmp(ibv_get_device_name(list[i]), kDeviceName) == 0) ctx = ibv_open_device(list[i]);
  EXPECT_EQ(nullptr, ctx) << "SOFTRDMA_DM_SIZE=2g was accepted";
  if (ctx) ibv_close_device(ctx);
  if (list) ibv_free_device_list(list);
}

TEST_F(Dm, MemcpyRoundTripAndBounds) {
  constexpr size_t kLen = 100;
  ibv_dm* dm = alloc(kLen);
  ASSERT_NE(nullptr, dm);
  EXPECT_TRUE(AllBytesAre(contents(dm, kLen).data(), kLen, 0)) << "new DM reads as zeros";
  std::vector<uint8_t> in(kLen), out(kLen, 0xAA);
  fill_pattern(in.data(), kLen, 11);
  ASSERT_EQ(0, ibv_memcpy_to_dm(dm, 8, in.data(), 92));
  ASSERT_EQ(0, ibv_memcpy_from_dm(out.data(), dm, 8, 92));
  EXPECT_TRUE(SameBytes(in.data(), out.data(), 92));
  EXPECT_TRUE(AllBytesAre(contents(dm, kLen).data(), 8, 0)) << "bytes before the copy";
  EXPECT_EQ(0, ibv_memcpy_to_dm(dm, kLen, in.data(), 0)) << "empty copy at the end";

  // Out of the allocation: EFAULT (mlx5_access_dm), before any alignment check.
  EXPECT_EQ(EFAULT, ibv_memcpy_to_dm(dm, kLen + 4, in.data(), 4));
  EXPECT_EQ(EFAULT, ibv_memcpy_from_dm(out.data(), dm, 0, kLen + 4));
  EXPECT_EQ(EFAULT, ibv_memcpy_from_dm(out.data(), dm, UINT64_MAX - 3, 8)) << "wraps";
  EXPECT_EQ(EFAULT, ibv_memcpy_to_dm(dm, 99, in.data(), 3));
  // Unaligned offset or length: EINVAL (the device is accessed in 4-byte words).
  EXPECT_EQ(EINVAL, ibv_memcpy_to_dm(dm, 3, in.data(), 4));
  EXPECT_EQ(EINVAL, ibv_memcpy_to_dm(dm, 4, in.data(), 3));
  EXPECT_EQ(EINVAL, ibv_memcpy_from_dm(out.data(), dm, 3, 4));
  EXPECT_EQ(EINVAL, ibv_memcpy_from_dm(out.data(), dm, 4, 3));
  EXPECT_TRUE(SameBytes(in.data(), contents(dm, kLen).data() + 8, 92)) << "refused copies wrote";
}

TEST_F(Dm, RegDmMrIsZeroBased) {
  ibv_dm* dm = alloc(4096);
  ASSERT_NE(nullptr, dm);
  ibv_mr* mr = reg(dm, 1024, 2048);
  ASSERT_NE(nullptr, mr) << strerror(errno);
  EXPECT_EQ(nullptr, mr->addr) << "a DM MR has no address (ibv_cmd_reg_dm_mr)";
  EXPECT_EQ(2048u, mr->length);
  EXPECT_EQ(mr->lkey, mr->rkey);
  EXPECT_EQ(d.pd, mr->pd);
  EXPECT_NE(nullptr, reg(dm, 4096, 0)) << "length 0 at the end";
  EXPECT_NE(nullptr, reg(dm, 0, 4096, IBV_ACCESS_ZERO_BASED)) << "read-only";
  EXPECT_NE(nullptr, reg(dm, 0, 64, kDmRw | IBV_ACCESS_RELAXED_ORDERING)) << "optional bit";
}

TEST_F(Dm, RegDmMrArgumentErrors) {
  ibv_dm* dm = alloc(4096);
  ASSERT_NE(nullptr, dm);
  struct Case {
    uint64_t offset;
    size_t length;
    unsigned access;
    const char* what;
  } cases[] = {
      {0, 64, IBV_ACCESS_LOCAL_WRITE, "IBV_ACCESS_ZERO_BASED is required"},
      {0, 64, kDmRw | IBV_ACCESS_MW_BIND, "no windows on DM"},
      {0, 64, kDmRw | IBV_ACCESS_ON_DEMAND, "not on demand"},
      {0, 64, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_REMOTE_WRITE, "remote write needs local write"},
      {0, 64, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_REMOTE_ATOMIC, "atomic needs local write"},
      {0, 4100, kDmRw, "longer than the DM"},
      {4096, 4, kDmRw, "past the end"},
      {UINT64_MAX - 3, 8, kDmRw, "wraps"},
  };
  for (const Case& c : cases) {
    errno = 0;
    EXPECT_EQ(nullptr, reg(dm, c.offset, c.length, c.access)) << c.what;
    EXPECT_EQ(EINVAL, errno) << c.what;
  }
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_dm_mr(d.pd, nullptr, 0, 4, kDmRw));
  EXPECT_EQ(EINVAL, errno);
}

// ibv_free_dm refuses while MRs are on the DM (EBUSY, ibv_alloc_dm(3) NOTES), a PD with DM
// MRs is busy, and a DM MR cannot be re-registered (ib_uverbs_rereg_mr: EINVAL).
TEST_F(Dm, BusyAndCleanupRules) {
  ibv_dm* dm = alloc(4096);
  ASSERT_NE(nullptr, dm);
  ibv_mr* a = reg(dm, 0, 1024);
  ibv_mr* b = reg(dm, 1024, 1024);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(EBUSY, free_now(dm));
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(d.pd)) << "the PD has DM MRs";
  errno = 0;
  EXPECT_EQ(IBV_REREG_MR_ERR_CMD, ibv_rereg_mr(a, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                                               IBV_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(EINVAL, errno);
  ASSERT_EQ(0, dereg_now(a));
  EXPECT_EQ(EBUSY, free_now(dm)) << "one MR left";
  // The MR's key is dead after dereg: nothing to check from here but that dereg works.
  ASSERT_EQ(0, dereg_now(b));
  EXPECT_EQ(0, free_now(dm));
  // Freed memory returns to the device: the whole of it can be allocated again.
  EXPECT_NE(nullptr, alloc(kDefaultDmSize));
}

// Two QPs of one device: RDMA WRITE from host memory into a DM MR at an offset, READ from
// the DM MR into another DM MR (a DM as local scatter target), WRITE with a DM MR as the
// local gather source, SEND/RECV between DM MRs, and both atomics on a DM word — each
// checked with ibv_memcpy_from_dm / host memory, byte by byte.
TEST_F(Dm, TrafficBetweenTwoQpsOfOneDevice) {
  ConnOptions o;
  Endpoint a, b;
  ASSERT_TRUE(connect_pair(d, o, a, b));
  constexpr size_t kDm = 16384;
  constexpr uint64_t kMrOff = 4096;  // the MRs start 4 KiB into their DM
  constexpr uint32_t kLen = 5000;    // more than one 1 KiB MTU, not a multiple of 4
  ibv_dm* target = alloc(kDm);
  ibv_dm* local = alloc(kDm);
  ASSERT_TRUE(target && local);
  ibv_mr* tmr = reg(target, kMrOff, 8192);
  ibv_mr* lmr = reg(local, kMrOff, 8192);
  ASSERT_TRUE(tmr && lmr) << strerror(errno);
  Buffer host(16384);
  ibv_mr* hmr = ibv_reg_mr(d.pd, host.data(), host.size(), kAllAccess);
  ASSERT_NE(nullptr, hmr);
  mrs.push_back(hmr);
  fill_pattern(host.data(), kLen, 21);

  // WRITE: host -> target DM MR at MR offset 100 (DM offset 4196).
  ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_WRITE, 1, host.data(), kLen, hmr->lkey, 100, tmr->rkey));
  poll_success(a.scq, 1, IBV_WC_RDMA_WRITE);
  std::vector<uint8_t> t = contents(target, kDm);
  EXPECT_TRUE(HasPattern(t.data() + kMrOff + 100, kLen, 21));
  EXPECT_TRUE(AllBytesAre(t.data(), kMrOff + 100, 0));
  EXPECT_TRUE(AllBytesAre(t.data() + kMrOff + 100 + kLen, kDm - kMrOff - 100 - kLen, 0));

  // READ: target DM MR offset 100 -> local DM MR offset 8 (a DM as the scatter target).
  SendWr rd(IBV_WR_RDMA_READ, 3);
  rd.add_sge(reinterpret_cast<void*>(uintptr_t{8}), kLen, lmr->lkey).remote(100, tmr->rkey);
  ASSERT_EQ(0, rd.post(b.qp));
  poll_success(b.scq, 3, IBV_WC_RDMA_READ);
  std::vector<uint8_t> l = contents(local, kDm);
  EXPECT_TRUE(HasPattern(l.data() + kMrOff + 8, kLen, 21));
  EXPECT_TRUE(AllBytesAre(l.data(), kMrOff + 8, 0));

  // WRITE with the local DM MR as the gather source, into host memory.
  std::memset(host.data(), 0, host.size());
  SendWr wr(IBV_WR_RDMA_WRITE, 4);
  wr.add_sge(reinterpret_cast<void*>(uintptr_t{8}), kLen, lmr->lkey)
      .remote(host.addr() + 64, hmr->rkey);
  ASSERT_EQ(0, wr.post(a.qp));
  poll_success(a.scq, 4, IBV_WC_RDMA_WRITE);
  EXPECT_TRUE(HasPattern(host.data() + 64, kLen, 21));
  EXPECT_TRUE(AllBytesAre(host.data(), 64, 0));

  // SEND from the local DM MR into a receive buffer in the target DM MR.
  ASSERT_EQ(0, post_recv(b.qp, 5, reinterpret_cast<void*>(uintptr_t{6000}), 2000, tmr->lkey));
  SendWr snd(IBV_WR_SEND, 6);
  snd.add_sge(reinterpret_cast<void*>(uintptr_t{8}), 1500, lmr->lkey);
  ASSERT_EQ(0, snd.post(a.qp));
  poll_success(a.scq, 6, IBV_WC_SEND);
  const ibv_wc rwc = poll_success(b.rcq, 5, IBV_WC_RECV);
  EXPECT_EQ(1500u, rwc.byte_len);
  t = contents(target, kDm);
  EXPECT_TRUE(HasPattern(t.data() + kMrOff + 6000, 1500, 21));

  // Atomics on the 8-byte word at MR offset 4000 (DM offset 8096).
  const uint64_t init = 40;
  ASSERT_EQ(0, ibv_memcpy_to_dm(target, kMrOff + 4000, &init, 8));
  SendWr fa(IBV_WR_ATOMIC_FETCH_AND_ADD, 7);
  fa.add_sge(host.data(), 8, hmr->lkey).atomic(4000, tmr->rkey, 2);
  ASSERT_EQ(0, fa.post(a.qp));
  poll_success(a.scq, 7, IBV_WC_FETCH_ADD);
  uint64_t v = 0;
  std::memcpy(&v, host.data(), 8);
  EXPECT_EQ(40u, v) << "fetch-and-add returns the old value";
  SendWr cs(IBV_WR_ATOMIC_CMP_AND_SWP, 8);
  cs.add_sge(reinterpret_cast<void*>(uintptr_t{16}), 8, lmr->lkey).atomic(4000, tmr->rkey, 42, 7);
  ASSERT_EQ(0, cs.post(a.qp));
  poll_success(a.scq, 8, IBV_WC_COMP_SWAP);
  ASSERT_EQ(0, ibv_memcpy_from_dm(&v, local, kMrOff + 16, 8));
  EXPECT_EQ(42u, v) << "compare-and-swap result, scattered into a DM MR";
  ASSERT_EQ(0, ibv_memcpy_from_dm(&v, target, kMrOff + 4000, 8));
  EXPECT_EQ(7u, v) << "the DM word after add 2 and swap 42 -> 7";

  // A DM MR 4 bytes into its DM: the word at MR offset 8 is 8-aligned as a VA but not in
  // the DM; the atomic still applies.
  ibv_mr* odd = reg(target, 4, 64);
  ASSERT_NE(nullptr, odd);
  const uint64_t before = 1000;
  ASSERT_EQ(0, ibv_memcpy_to_dm(target, 12, &before, 8));
  SendWr fa2(IBV_WR_ATOMIC_FETCH_AND_ADD, 10);
  fa2.add_sge(host.data(), 8, hmr->lkey).atomic(8, odd->rkey, 5);
  ASSERT_EQ(0, fa2.post(a.qp));
  poll_success(a.scq, 10, IBV_WC_FETCH_ADD);
  std::memcpy(&v, host.data(), 8);
  EXPECT_EQ(1000u, v);
  ASSERT_EQ(0, ibv_memcpy_from_dm(&v, target, 12, 8));
  EXPECT_EQ(1005u, v);

  // Past the end of the target MR: remote access error.
  ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_WRITE, 9, host.data(), 16, hmr->lkey, 8190, tmr->rkey));
  const ibv_wc bad = poll_one(a.scq);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, bad.status) << describe(bad);

  destroy_endpoint(a);
  destroy_endpoint(b);
}

}  // namespace
}  // namespace softrdma::verbs_test
