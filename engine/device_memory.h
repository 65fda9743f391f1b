// Device memory (ibv_alloc_dm(3)): memory the device owns and the application reaches only
// through the device — by copies (ibv_memcpy_to_dm / ibv_memcpy_from_dm) and through MRs
// registered on it (ibv_reg_dm_mr, zero-based: the MR's addresses are offsets into it).
//
// On a NIC it is on-chip memory (mlx5's MEMIC) behind a BAR; here it is memory of the engine:
// an anonymous mapping of this process whose address the verbs layer never hands out. The
// requester and responder reach it like any MR's memory (MemoryRegion::translate), so a DM MR
// serves as local SGE and as remote target of WRITE, READ and atomics with no other path.
// Every device has a capacity (SOFTRDMA_DM_SIZE, reported as max_dm_size) that allocations
// are counted against, in 64-byte units as mlx5 allocates MEMIC (MLX5_MEMIC_BASE_SIZE).
//
// Errors follow rdma-core 44's mlx5 provider and kernel driver (providers/mlx5/verbs.c
// mlx5_alloc_dm / mlx5_access_dm, drivers/infiniband/hw/mlx5/dm.c): see each function.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "engine/types.h"

namespace softrdma::engine {

/// The device memory of one device: `capacity` bytes that DeviceMemory allocations are
/// counted against. Lock-free (a process may fork with the device lock held; the pyverbs
/// suite allocates DM in forked children), thread-safe.
class DeviceMemoryPool {
 public:
  /// Allocations are counted in units of this many bytes (mlx5's MEMIC granularity).
  static constexpr uint64_t kGranule = 64;
  /// Largest log2 alignment ibv_alloc_dm accepts (an allocation starts on a page).
  static constexpr uint32_t kMaxLogAlign = 12;

  explicit DeviceMemoryPool(uint64_t capacity) : capacity_(capacity) {}
  DeviceMemoryPool(const DeviceMemoryPool&) = delete;
  DeviceMemoryPool& operator=(const DeviceMemoryPool&) = delete;

  /// Bytes the device offers in all (max_dm_size); 0: no device memory.
  uint64_t capacity() const { return capacity_; }
  /// Bytes counted against the capacity now (allocations rounded up to kGranule).
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  /// Counts `bytes` (a multiple of kGranule) against the capacity; false when they do not fit.
  bool take(uint64_t bytes);
  /// Returns what take() counted.
  void give_back(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  uint64_t capacity_;
  std::atomic<uint64_t> used_{0};
};

/// One allocation of device memory: `length` bytes, zero-filled, starting on a page
/// boundary. Freed (and returned to its pool) when destroyed; the verbs layer refuses to
/// destroy it while MRs are registered on it (mr_count()).
class DeviceMemory {
 public:
  /// ibv_alloc_dm: allocates `length` bytes from `pool` aligned to 2^log_align. Returns
  /// nullptr with `st` set: EINVAL for length 0, a length above the pool's capacity (as
  /// mlx5_alloc_dm checks max_dm_size) or log_align above kMaxLogAlign; ENOMEM when the
  /// pool's free bytes do not hold it (as the kernel's MEMIC allocator) or memory runs out.
  static std::unique_ptr<DeviceMemory> allocate(DeviceMemoryPool& pool, uint64_t length,
                                                uint32_t log_align, Status& st);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  /// Bytes allocated (what ibv_alloc_dm was asked for).
  uint64_t length() const { return length_; }

  /// ibv_memcpy_to_dm / ibv_memcpy_from_dm: copies `n` bytes between the host buffer and
  /// [offset, offset + n) of this memory. EFAULT when the range is not inside the
  /// allocation, EINVAL when offset or n is not a multiple of 4 (mlx5_access_dm: the device
  /// is accessed in 4-byte words), checked in that order.
  Status copy_in(uint64_t offset, const void* src, uint64_t n);
  Status copy_out(void* dst, uint64_t offset, uint64_t n) const;

  /// Whether [offset, offset + n) lies inside the allocation (n may be 0).
  bool contains(uint64_t offset, uint64_t n) const {
    return offset <= length_ && n <= length_ - offset;
  }
  /// The engine's address of byte `offset` (offset <= length()), for MemoryRegion.
  uint8_t* at(uint64_t offset) const { return base_ + offset; }

  /// MRs registered on this memory (MemoryRegion counts itself in and out).
  int mr_count() const { return mrs_.load(std::memory_order_acquire); }
  std::atomic<int>& mr_counter() { return mrs_; }

 private:
  DeviceMemory(DeviceMemoryPool& pool, uint8_t* base, uint64_t length, uint64_t mapped,
               uint64_t counted)
      : pool_(pool), base_(base), length_(length), mapped_(mapped), counted_(counted) {}

  DeviceMemoryPool& pool_;
  uint8_t* base_;
  uint64_t length_;
  uint64_t mapped_;   // bytes mapped (length rounded up to pages)
  uint64_t counted_;  // bytes counted against the pool (length rounded up to kGranule)
  std::atomic<int> mrs_{0};
};

}  // namespace softrdma::engine
