// PlacementTable: the direct-placement table of the same-host path. The owner and the sender
// are two PlacementTable objects on one region in this process (process_vm_writev(2) to its own
// pid), so every check is exercised without a second process; every loop is bounded in count
// and in time.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "net/shm_placement.h"

using namespace softrdma::net;
using namespace std::chrono_literals;

namespace {

struct Tables {
  Tables() {
    region = ::mmap(nullptr, PlacementTable::region_bytes(), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(region, MAP_FAILED);
    owner.init_owner(region);
    EXPECT_TRUE(
        sender.attach(region, PlacementTable::region_bytes(), static_cast<uint32_t>(getpid())));
  }
  ~Tables() {
    owner.reset();
    sender.reset();
    ::munmap(region, PlacementTable::region_bytes());
  }
  void* region = nullptr;
  PlacementTable owner, sender;
};

// A region of `buf` named from iova `iova` in protection domain `pd`.
PlaceEntry region_of(std::vector<uint8_t>& buf, uint64_t iova, uint32_t pd) {
  return PlaceEntry{iova, buf.size(), reinterpret_cast<uintptr_t>(buf.data()), pd};
}

PlaceResult place(const PlacementTable& t, uint32_t qpn, uint32_t rkey, uint64_t va,
                  std::vector<uint8_t>& src, int* err = nullptr) {
  int e = 0;
  iovec v{src.data(), src.size()};
  PlaceResult r = t.place(qpn, rkey, va, &v, 1, src.size(), &e);
  if (err) *err = e;
  return r;
}

}  // namespace

TEST(PlacementTable, WritesOnlyWhatAPublishedQpMayWriteInsideAPublishedRegion) {
  Tables t;
  std::vector<uint8_t> dst(4096, 0), src(100, 0xab);
  ASSERT_TRUE(t.owner.publish(PlaceKind::kRegion, 0x1234, region_of(dst, 0x10000, 7)));
  // No QP published yet: refused, nothing written.
  EXPECT_EQ(place(t.sender, 0x11, 0x1234, 0x10000, src), PlaceResult::kRefused);
  ASSERT_TRUE(t.owner.publish(PlaceKind::kQp, 0x11, PlaceEntry{0, 0, 0, 7}));
  ASSERT_TRUE(t.owner.publish(PlaceKind::kQp, 0x12, PlaceEntry{0, 0, 0, 8}));  // another PD
  EXPECT_EQ(place(t.sender, 0x12, 0x1234, 0x10000, src), PlaceResult::kRefused);
  EXPECT_EQ(place(t.sender, 0x11, 0x9999, 0x10000, src), PlaceResult::kRefused);  // no such key
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 4096);
  // Inside, up to the last byte: placed at va − iova.
  EXPECT_EQ(place(t.sender, 0x11, 0x1234, 0x10000 + 4096 - 100, src), PlaceResult::kPlaced);
  EXPECT_EQ(dst[4095], 0xab);
  EXPECT_EQ(dst[4096 - 100], 0xab);
  EXPECT_EQ(dst[4096 - 101], 0);
  // One byte past the end, before the start, and a range that wraps: refused.
  EXPECT_EQ(place(t.sender, 0x11, 0x1234, 0x10000 + 4096 - 99, src), PlaceResult::kRefused);
  EXPECT_EQ(place(t.sender, 0x11, 0x1234, 0x10000 - 1, src), PlaceResult::kRefused);
  EXPECT_EQ(place(t.sender, 0x11, 0x1234, UINT64_MAX - 10, src), PlaceResult::kRefused);
  // Withdrawn region, then withdrawn QP: refused again.
  EXPECT_EQ(t.owner.withdraw(PlaceKind::kRegion, 0x1234), 0u);
  EXPECT_EQ(place(t.sender, 0x11, 0x1234, 0x10000, src), PlaceResult::kRefused);
  ASSERT_TRUE(t.owner.publish(PlaceKind::kRegion, 0x1234, region_of(dst, 0x10000, 7)));
  EXPECT_EQ(place(t.sender, 0x11, 0x1234, 0x10000, src), PlaceResult::kPlaced);
  t.owner.withdraw(PlaceKind::kQp, 0x11);
  EXPECT_EQ(place(t.sender, 0x11, 0x1234, 0x10000, src), PlaceResult::kRefused);
}

TEST(PlacementTable, ARepublishedRegionIsWrittenAtItsNewPlaceOnly) {
  Tables t;
  std::vector<uint8_t> a(256, 0), b(256, 0), src(16, 0x5a);
  ASSERT_TRUE(t.owner.publish(PlaceKind::kQp, 1, PlaceEntry{0, 0, 0, 3}));
  ASSERT_TRUE(t.owner.publish(PlaceKind::kRegion, 77, region_of(a, 0x1000, 3)));
  ASSERT_TRUE(t.owner.publish(PlaceKind::kRegion, 77, region_of(b, 0x1000, 3)));  // rereg
  EXPECT_EQ(t.owner.published(), 2u);
  EXPECT_EQ(place(t.sender, 1, 77, 0x1000, src), PlaceResult::kPlaced);
  EXPECT_EQ(a[0], 0);
  EXPECT_EQ(b[0], 0x5a);
}

TEST(PlacementTable, UnmappedTargetMemoryFailsTheCallWithEfault) {
  Tables t;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_TRUE(t.owner.publish(PlaceKind::kQp, 1, PlaceEntry{0, 0, 0, 3}));
  ASSERT_TRUE(t.owner.publish(PlaceKind::kRegion, 5,
                              PlaceEntry{0, page, reinterpret_cast<uintptr_t>(m), 3}));
  ::munmap(m, page);  // unmapped since registration, as MrChange tests do
  std::vector<uint8_t> src(64, 1);
  int err = 0;
  EXPECT_EQ(place(t.sender, 1, 5, 0, src, &err), PlaceResult::kFailed);
  EXPECT_EQ(err, EFAULT);
}

TEST(PlacementTable, TheOwnerIsVerifiedByItsCookie) {
  Tables t;
  int err = -1;
  EXPECT_TRUE(t.sender.verify_owner(&err));
  EXPECT_EQ(err, 0);
  // Another process behind the pid would hold another value at the published address.
  auto* words = static_cast<uint64_t*>(t.region);
  words[1] ^= 1;  // the header's copy of the cookie
  EXPECT_FALSE(t.sender.verify_owner(&err));
  EXPECT_EQ(err, 0);
  PlacementTable none;
  EXPECT_FALSE(none.attach(t.region, PlacementTable::region_bytes() - 1, 1));
}

TEST(PlacementTable, AFullTableRefusesToPublishUntilAnEntryIsWithdrawn) {
  Tables t;
  std::vector<uint8_t> buf(64);
  for (uint32_t k = 1; k <= PlacementTable::kSlots; ++k)
    ASSERT_TRUE(t.owner.publish(PlaceKind::kRegion, k, region_of(buf, 0, 1))) << k;
  EXPECT_FALSE(t.owner.publish(PlaceKind::kQp, 1, PlaceEntry{0, 0, 0, 1}));
  t.owner.withdraw(PlaceKind::kRegion, 4000);
  EXPECT_TRUE(t.owner.publish(PlaceKind::kQp, 1, PlaceEntry{0, 0, 0, 1}));
  // Every entry is still found past the withdrawn ones on its probe sequence.
  std::vector<uint8_t> src(8, 9);
  for (uint32_t k : {1u, 2u, 3999u, 4001u, 4096u})
    EXPECT_EQ(place(t.sender, 1, k, 0, src), PlaceResult::kPlaced) << k;
  EXPECT_EQ(place(t.sender, 1, 4000, 0, src), PlaceResult::kRefused);
}

// What makes ibv_dereg_mr safe: once withdraw() returns, no sender writes the region again,
// while another thread places into it as fast as it can.
TEST(PlacementTable, NothingIsWrittenAfterWithdrawReturns) {
  Tables t;
  std::vector<uint8_t> dst(1 << 16, 0);
  ASSERT_TRUE(t.owner.publish(PlaceKind::kQp, 1, PlaceEntry{0, 0, 0, 3}));
  for (int round = 0; round < 20; ++round) {
    std::fill(dst.begin(), dst.end(), 0);
    ASSERT_TRUE(t.owner.publish(PlaceKind::kRegion, 9, region_of(dst, 0, 3)));
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> placed{0};
    std::thread writer([&] {
      std::vector<uint8_t> src(dst.size(), static_cast<uint8_t>(round + 1));
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (!stop.load() && std::chrono::steady_clock::now() < until)
        if (place(t.sender, 1, 9, 0, src) == PlaceResult::kPlaced) placed.fetch_add(1);
    });
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (placed.load() < 3 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    EXPECT_EQ(t.owner.withdraw(PlaceKind::kRegion, 9), 0u);
    std::fill(dst.begin(), dst.end(), 0);  // "freed and reused" by the owner
    std::this_thread::sleep_for(2ms);
    stop.store(true);
    writer.join();
    EXPECT_GE(placed.load(), 3u);
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), static_cast<long>(dst.size())) << round;
  }
}

// A sender killed inside its copy holds its pins for good: the owner's withdraw() (ibv_dereg_mr,
// modify_qp to ERR) must find it dead and go on at once rather than wait kWithdrawWaitNs — a
// kv-demo decode whose prefill was killed mid-WRITE sat 2 s in withdraw() with its device lock
// held. The child pins both entries and is killed while holding them; afterwards another sender
// can still place (the dead one's pinner entry is repaired, not lost).
TEST(PlacementTable, ASenderKilledHoldingPinsDoesNotHoldUpWithdraw) {
  Tables t;
  std::vector<uint8_t> dst(4096, 0), src(64, 0x77);
  ASSERT_TRUE(t.owner.publish(PlaceKind::kQp, 1, PlaceEntry{0, 0, 0, 3}));
  ASSERT_TRUE(t.owner.publish(PlaceKind::kRegion, 9, region_of(dst, 0, 3)));
  for (uint32_t round = 0; round < PlacementTable::kPinners + 2; ++round) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::alarm(30);  // bounded: ends by itself should the test fail before killing it
      PlacementTable::Pinned p;
      const bool pinned = t.sender.pin(1, 9, 0, src.size(), &p) == PlaceResult::kPlaced;
      const char c = pinned ? 'p' : 'r';
      (void)!::write(ready[1], &c, 1);
      ::pause();  // killed here, pins held
      ::_exit(0);
    }
    ::close(ready[1]);
    char c = 0;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    ASSERT_EQ(c, 'p') << "round " << round;
    ::kill(child, SIGKILL);
    ASSERT_EQ(::waitpid(child, nullptr, 0), child);
    if (round % 2 == 0) {
      // The owner finds the dead holder (every second round: a later sender's pin does).
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(t.owner.withdraw(PlaceKind::kRegion, 9), 0u);
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "round " << round;
      ASSERT_TRUE(t.owner.publish(PlaceKind::kRegion, 9, region_of(dst, 0, 3)));
    }
  }
  // More dead senders than pinner entries came and went: every entry is free again.
  std::vector<PlacementTable::Pinned> held(PlacementTable::kPinners);
  for (auto& p : held) ASSERT_EQ(t.sender.pin(1, 9, 0, src.size(), &p), PlaceResult::kPlaced);
  PlacementTable::Pinned one_more;
  EXPECT_EQ(t.sender.pin(1, 9, 0, src.size(), &one_more), PlaceResult::kRefused);
  for (auto& p : held) t.sender.unpin(p);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(t.owner.withdraw(PlaceKind::kQp, 1), 0u);
  EXPECT_EQ(t.owner.withdraw(PlaceKind::kRegion, 9), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}
