// Where a queue keeps its slots: the send and receive queues of a QP, an SRQ's receive
// queue, a CQ's ring. By default the heap; the verbs layer passes the memory a parent
// domain's allocator handed out (ibv_alloc_parent_domain(3), verbs/parent_domain.cpp), as a
// hardware provider places its WQE and CQE rings there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <memory_resource>

namespace softrdma::engine {

/// The memory resource a queue's containers allocate from, kept alive by the queue (it must
/// outlive the containers: declare it before them). Null means the heap.
using QueueMemory = std::shared_ptr<std::pmr::memory_resource>;

/// The resource behind `m`: `m` itself, or the heap when it is null.
inline std::pmr::memory_resource* resource_of(const QueueMemory& m) {
  return m ? m.get() : std::pmr::new_delete_resource();
}

/// Bytes a queue of `depth` slots of `slot_bytes` each occupies as a std::deque (the WQE
/// queues) or a std::vector (the CQ ring) allocated from a QueueMemory: the slots, a block
/// of slack at either end and the deque's map of block pointers. A size for the buffer a
/// parent domain's allocator is asked for, so that the queue at full depth fits in it.
inline size_t queue_bytes(uint32_t depth, size_t slot_bytes) {
  constexpr size_t kDequeBlock = 512;  // libstdc++'s deque block, the larger of it and a slot
  const size_t block = slot_bytes > kDequeBlock ? slot_bytes : kDequeBlock;
  const size_t slots = (size_t{depth} + 1) * slot_bytes + 2 * block;
  const size_t map = (size_t{depth} + 16) * sizeof(void*);
  return (slots + map + 63) / 64 * 64;
}

}  // namespace softrdma::engine
