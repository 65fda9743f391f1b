// engine::DeviceMemoryPool and engine::DeviceMemory (ibv_alloc_dm's memory) without a device:
// accounting in 64-byte units against the capacity, the allocation errors of mlx5 (EINVAL,
// ENOMEM), the copy checks (EFAULT out of range, EINVAL unaligned) and zero-based MRs over
// device memory (MemoryRegion::validate_dm, translate from offset 0).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "engine/device_memory.h"
#include "engine/memory.h"

namespace softrdma::engine {
namespace {

TEST(DeviceMemoryPool, CountsAgainstCapacity) {
  DeviceMemoryPool pool(256);
  EXPECT_TRUE(pool.take(128));
  EXPECT_TRUE(pool.take(128));
  EXPECT_EQ(256u, pool.used());
  EXPECT_FALSE(pool.take(64));
  pool.give_back(128);
  EXPECT_TRUE(pool.take(64));
  EXPECT_EQ(192u, pool.used());
  EXPECT_FALSE(pool.take(UINT64_MAX));  // no wrap-around
}

TEST(DeviceMemory, AllocationErrorsAsMlx5) {
  DeviceMemoryPool pool(4096);
  Status st;
  EXPECT_EQ(nullptr, DeviceMemory::allocate(pool, 0, 0, st));
  EXPECT_EQ(std::errc::invalid_argument, st) << "length 0";
  EXPECT_EQ(nullptr, DeviceMemory::allocate(pool, 4097, 0, st));
  EXPECT_EQ(std::errc::invalid_argument, st) << "above the capacity (max_dm_size)";
  EXPECT_EQ(nullptr, DeviceMemory::allocate(pool, 64, DeviceMemoryPool::kMaxLogAlign + 1, st));
  EXPECT_EQ(std::errc::invalid_argument, st) << "alignment";
  EXPECT_EQ(0u, pool.used());

  auto a = DeviceMemory::allocate(pool, 4000, DeviceMemoryPool::kMaxLogAlign, st);
  ASSERT_NE(nullptr, a);
  EXPECT_EQ(kOk, st);
  EXPECT_EQ(4000u, a->length());
  EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(a->at(0)) % 4096) << "starts on a page";
  EXPECT_EQ(4032u, pool.used()) << "counted in 64-byte units";
  EXPECT_EQ(nullptr, DeviceMemory::allocate(pool, 65, 0, st));
  EXPECT_EQ(std::errc::not_enough_memory, st) << "64 bytes left";
  auto b = DeviceMemory::allocate(pool, 1, 0, st);
  ASSERT_NE(nullptr, b);
  EXPECT_EQ(4096u, pool.used());
  a.reset();
  b.reset();
  EXPECT_EQ(0u, pool.used()) << "freeing returns the memory";
}

TEST(DeviceMemory, CopiesCheckRangeThenAlignment) {
  DeviceMemoryPool pool(1024);
  Status st;
  auto m = DeviceMemory::allocate(pool, 100, 0, st);
  ASSERT_NE(nullptr, m);
  std::vector<uint8_t> zero(100, 0), out(100, 0xAA), in(100);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_EQ(kOk, m->copy_out(out.data(), 0, 100));
  EXPECT_EQ(zero, out) << "new device memory reads as zeros";
  ASSERT_EQ(kOk, m->copy_in(4, in.data(), 96));
  ASSERT_EQ(kOk, m->copy_out(out.data(), 4, 96));
  EXPECT_EQ(0, std::memcmp(in.data(), out.data(), 96));
  EXPECT_EQ(kOk, m->copy_in(100, in.data(), 0)) << "empty copy at the end";

  EXPECT_EQ(std::errc::bad_address, m->copy_in(104, in.data(), 4));
  EXPECT_EQ(std::errc::bad_address, m->copy_out(out.data(), 0, 104));
  EXPECT_EQ(std::errc::bad_address, m->copy_out(out.data(), UINT64_MAX - 3, 8)) << "wraps";
  EXPECT_EQ(std::errc::bad_address, m->copy_in(101, in.data(), 3)) << "range before alignment";
  EXPECT_EQ(std::errc::invalid_argument, m->copy_in(3, in.data(), 4));
  EXPECT_EQ(std::errc::invalid_argument, m->copy_out(out.data(), 4, 3));
}

/// A registry with only a key table: enough for MemoryRegion.
class KeyTable : public ObjectRegistry {
 public:
  std::mutex& mutex() override { return mu_; }
  uint32_t register_qp(QueuePair*) override { return 0; }
  bool register_qp_at(QueuePair*, uint32_t) override { return false; }
  void unregister_qp(uint32_t) override {}
  uint32_t register_mr(MemoryRegion*) override { return ++next_; }
  void unregister_mr(uint32_t) override {}
  uint32_t register_mw(MemoryWindow*) override { return 0; }
  void unregister_mw(uint32_t) override {}
  uint32_t register_srq(SharedReceiveQueue*) override { return 0; }
  void unregister_srq(uint32_t) override {}
  uint8_t active_mtu() const override { return 5; }
  Transport& transport() override { std::abort(); }
  void try_progress() override {}

 private:
  std::mutex mu_;
  uint32_t next_ = 0;
};

TEST(DeviceMemory, ZeroBasedRegionTranslatesOffsets) {
  DeviceMemoryPool pool(4096);
  Status st;
  auto m = DeviceMemory::allocate(pool, 1024, 0, st);
  ASSERT_NE(nullptr, m);
  constexpr uint32_t kRw = kLocalWrite | kRemoteWrite | kRemoteRead | kZeroBased;
  EXPECT_EQ(kOk, MemoryRegion::validate_dm(*m, 256, 512, kRw));
  EXPECT_EQ(kOk, MemoryRegion::validate_dm(*m, 1024, 0, kRw)) << "empty, at the end";
  EXPECT_EQ(std::errc::invalid_argument, MemoryRegion::validate_dm(*m, 768, 512, kRw));
  EXPECT_EQ(std::errc::invalid_argument, MemoryRegion::validate_dm(*m, 0, 64, kLocalWrite))
      << "IBV_ACCESS_ZERO_BASED is required";
  EXPECT_EQ(std::errc::invalid_argument, MemoryRegion::validate_dm(*m, 0, 64, kRw | kMwBind));
  EXPECT_EQ(std::errc::invalid_argument,
            MemoryRegion::validate_dm(*m, 0, 64, kZeroBased | kRemoteWrite))
      << "remote write needs local write";
  EXPECT_EQ(kOk, MemoryRegion::validate_dm(*m, 0, 64, kRw | kRelaxedOrdering))
      << "optional bits are accepted";

  KeyTable keys;
  ProtectionDomain pd(keys);
  {
    MemoryRegion mr(pd, *m, 256, 512, kRw);
    EXPECT_TRUE(mr.on_device_memory());
    EXPECT_EQ(1, m->mr_count());
    EXPECT_EQ(0u, mr.iova());
    EXPECT_EQ(m->at(256), mr.translate(0, 512));
    EXPECT_EQ(m->at(256 + 100), mr.translate(100, 8));
    EXPECT_EQ(nullptr, mr.translate(508, 8)) << "past the MR";
  }
  EXPECT_EQ(0, m->mr_count()) << "dereg uncounts the MR";
  EXPECT_EQ(0, pd.users.load());
}

}  // namespace
}  // namespace softrdma::engine
