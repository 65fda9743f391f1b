// FETCH & ADD and COMPARE & SWAP from several requester processes at once, each on its
// own QP to one target process. The responder must execute atomics one at a time per
// location and exactly once per request: the final values are checked exactly, and the
// values the requesters got back must be a permutation of 0 … N−1.
#include <algorithm>
#include <cstring>
#include <vector>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr int kRequesters = 4;
constexpr int kOps = 1000;
constexpr uint32_t kFaaOff = 0;
constexpr uint32_t kCasOff = 64;
constexpr int kWindow = 16;  // outstanding FETCH & ADDs per requester (= max_rd_atomic)

void target(Role& r) {
  memset(r.buf(), kGuard, 4096);
  auto* faa = reinterpret_cast<uint64_t*>(r.buf() + kFaaOff);
  auto* cas = reinterpret_cast<uint64_t*>(r.buf() + kCasOff);
  *faa = 0;
  *cas = 0;
  r.barrier();  // requesters start
  std::vector<uint64_t> faa_all, cas_all;
  for (int p = 1; p <= kRequesters; ++p) {
    std::vector<uint64_t> f(kOps), c(kOps);
    ASSERT_TRUE(r.recv_bytes(p, f.data(), f.size() * 8, 100s)) << "results of role " << p;
    ASSERT_TRUE(r.recv_bytes(p, c.data(), c.size() * 8, 100s)) << "results of role " << p;
    faa_all.insert(faa_all.end(), f.begin(), f.end());
    cas_all.insert(cas_all.end(), c.begin(), c.end());
  }
  EXPECT_EQ(uint64_t(kRequesters * kOps), __atomic_load_n(faa, __ATOMIC_ACQUIRE));
  EXPECT_EQ(uint64_t(kRequesters * kOps), __atomic_load_n(cas, __ATOMIC_ACQUIRE));
  std::sort(faa_all.begin(), faa_all.end());
  std::sort(cas_all.begin(), cas_all.end());
  size_t faa_bad = 0, cas_bad = 0;
  for (size_t i = 0; i < faa_all.size(); ++i) faa_bad += faa_all[i] != i;
  for (size_t i = 0; i < cas_all.size(); ++i) cas_bad += cas_all[i] != i;
  EXPECT_EQ(0u, faa_bad) << "FETCH & ADD results are not a permutation of 0.."
                         << faa_all.size() - 1;
  EXPECT_EQ(0u, cas_bad) << "successful COMPARE & SWAPs are not a permutation of 0.."
                         << cas_all.size() - 1;
  EXPECT_TRUE(AllBytesAre(r.buf() + 8, kCasOff - 8, kGuard));
  EXPECT_TRUE(AllBytesAre(r.buf() + kCasOff + 8, 4096 - kCasOff - 8, kGuard));
}

void requester(Role& r) {
  auto& l = r.link(0);
  auto* res = reinterpret_cast<uint64_t*>(r.buf());
  const uint64_t faa_addr = l.remote.addr + kFaaOff;
  const uint64_t cas_addr = l.remote.addr + kCasOff;
  r.barrier();

  // FETCH & ADD +1, kWindow outstanding; completions come back in posting order.
  int posted = 0, done = 0;
  while (done < kOps) {
    while (posted < kOps && posted - done < kWindow) {
      SendWr w(IBV_WR_ATOMIC_FETCH_AND_ADD, posted);
      w.add_sge(&res[posted], 8, r.lkey()).atomic(faa_addr, l.remote.rkey, 1);
      ASSERT_EQ(0, w.post(l.ep.qp));
      ++posted;
    }
    const ibv_wc wc = poll_one(l.ep.scq, 30s);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
    ASSERT_EQ(uint64_t(done), wc.wr_id);
    ASSERT_EQ(IBV_WC_FETCH_ADD, wc.opcode);
    ++done;
  }
  for (int i = 1; i < kOps; ++i)
    ASSERT_LT(res[i - 1], res[i]) << "one QP's FETCH & ADDs must execute in order";

  // COMPARE & SWAP as a spin increment: a CAS succeeds iff it returns the compare value,
  // so each success claims exactly one value.
  std::vector<uint64_t> wins;
  uint64_t* slot = res + kOps;
  uint64_t guess = 0;
  const auto end = Clock::now() + 90s;
  for (int attempt = 0; wins.size() < size_t(kOps); ++attempt) {
    ASSERT_LT(attempt, 200 * kOps) << "COMPARE & SWAP loop makes no progress";
    ASSERT_LT(Clock::now(), end) << "COMPARE & SWAP loop too slow";
    *slot = ~0ull;
    SendWr w(IBV_WR_ATOMIC_CMP_AND_SWP, attempt);
    w.add_sge(slot, 8, r.lkey()).atomic(cas_addr, l.remote.rkey, guess, guess + 1);
    ASSERT_EQ(0, w.post(l.ep.qp));
    const ibv_wc wc = poll_one(l.ep.scq, 30s);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
    ASSERT_EQ(IBV_WC_COMP_SWAP, wc.opcode);
    if (*slot == guess) {
      wins.push_back(guess);
      ++guess;
    } else {
      ASSERT_GT(*slot, guess) << "the shared counter only grows";
      guess = *slot;
    }
  }
  r.send_bytes(0, res, kOps * 8);
  r.send_bytes(0, wins.data(), wins.size() * 8);
}

TEST(ConcurrentAtomics, FourRequestersFetchAddAndCompareSwap) {
  Spec s;
  s.roles.resize(1 + kRequesters);
  s.roles[0].fn = target;
  s.roles[0].buf_size = 4096;
  for (int i = 1; i <= kRequesters; ++i) {
    s.roles[i].fn = requester;
    s.roles[i].buf_size = 64 << 10;
    s.links.push_back({0, i});
  }
  run_roles(s);
}

}  // namespace
}  // namespace softrdma::verbs_test
