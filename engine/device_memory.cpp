#include "engine/device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace softrdma::engine {

bool DeviceMemoryPool::take(uint64_t bytes) {
  uint64_t cur = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > capacity_ || cur > capacity_ - bytes) return false;
  } while (!used_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  return true;
}

std::unique_ptr<DeviceMemory> DeviceMemory::allocate(DeviceMemoryPool& pool, uint64_t length,
                                                     uint32_t log_align, Status& st) {
  st = kOk;
  // mlx5_alloc_dm refuses more than max_dm_size with EINVAL; the kernel's MEMIC allocator
  // refuses length 0 and an alignment beyond the device's with EINVAL, and ENOMEM when no
  // free range holds the request.
  if (length == 0 || length > pool.capacity() || log_align > DeviceMemoryPool::kMaxLogAlign) {
    st = std::errc::invalid_argument;
    return nullptr;
  }
  const uint64_t g = DeviceMemoryPool::kGranule;
  const uint64_t counted = (length + g - 1) / g * g;
  if (!pool.take(counted)) {
    st = std::errc::not_enough_memory;
    return nullptr;
  }
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t mapped = (length + page - 1) / page * page;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    pool.give_back(counted);
    st = std::errc::not_enough_memory;
    return nullptr;
  }
  return std::unique_ptr<DeviceMemory>(
      new DeviceMemory(pool, static_cast<uint8_t*>(p), length, mapped, counted));
}

DeviceMemory::~DeviceMemory() {
  ::munmap(base_, mapped_);
  pool_.give_back(counted_);
}

Status DeviceMemory::copy_in(uint64_t offset, const void* src, uint64_t n) {
  if (!contains(offset, n)) return std::errc::bad_address;
  if ((offset | n) & 3) return std::errc::invalid_argument;
  if (n) std::memcpy(base_ + offset, src, n);
  return kOk;
}

Status DeviceMemory::copy_out(void* dst, uint64_t offset, uint64_t n) const {
  if (!contains(offset, n)) return std::errc::bad_address;
  if ((offset | n) & 3) return std::errc::invalid_argument;
  if (n) std::memcpy(dst, base_ + offset, n);
  return kOk;
}

}  // namespace softrdma::engine
