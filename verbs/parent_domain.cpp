// Thread domains and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3), rdma-core
// 44; mlx5 is the reference provider). A parent domain is an ibv_pd accepted wherever a PD
// is: it shares the engine PD of the PD it was made over, so MRs of either work with QPs of
// either. With allocators (IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) the WQE queues of its QPs
// and SRQs and the rings of its CQs live in buffers its alloc callback hands out, one per
// queue, released through its free callback when the object is destroyed.
//
// A thread domain is a promise that one thread uses the objects of a parent domain; softrdma
// keeps its locks anyway (the engine's progress thread touches the same queues), so a TD
// changes nothing but its own reference counting.
#include <cstdlib>
#include <map>
#include <memory_resource>
#include <optional>
#include <vector>

#include "verbs/ops.h"
#include "verbs/softrdma_private.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

/// Alignment of the buffers asked for: a page, as providers align their queue buffers.
constexpr size_t kQueueAlignment = 4096;

/// A queue's buffer from a parent domain's allocator (or the heap when it answers
/// IBV_ALLOCATOR_USE_DEFAULT), as a memory resource for the engine's queue containers.
/// Blocks are carved from the buffer and reused by size once freed (the deque of a WQE
/// queue frees and allocates blocks of one size as WQEs come and go); what does not fit —
/// deque bookkeeping beyond queue_bytes() — comes from the heap. The engine uses it under
/// the lock of its queue (the device lock, a CQ's lock), so it needs none of its own.
class ProviderBuffer final : public std::pmr::memory_resource {
 public:
  /// Takes `base` (`size` bytes); `parent` set means it came from parent->alloc and goes
  /// back through parent->free, else from std::aligned_alloc.
  ProviderBuffer(ibv_pd* pd, const ParentDomain* parent, void* base, size_t size,
                 uint64_t resource_type)
      : pd_(pd),
        parent_(parent ? std::optional<ParentDomain>(*parent) : std::nullopt),
        base_(static_cast<uint8_t*>(base)),
        size_(size),
        type_(resource_type) {}
  ~ProviderBuffer() override {
    if (parent_)
      parent_->free(pd_, parent_->pd_context, base_, type_);
    else
      std::free(base_);
  }
  ProviderBuffer(const ProviderBuffer&) = delete;
  ProviderBuffer& operator=(const ProviderBuffer&) = delete;

 private:
  void* do_allocate(size_t bytes, size_t align) override {
    if (auto it = free_.find(bytes); it != free_.end() && !it->second.empty()) {
      for (size_t i = 0; i < it->second.size(); ++i) {
        void* p = it->second[i];
        if (reinterpret_cast<uintptr_t>(p) % align) continue;
        it->second[i] = it->second.back();
        it->second.pop_back();
        return p;
      }
    }
    const size_t at = (used_ + align - 1) / align * align;
    if (at <= size_ && bytes <= size_ - at) {
      used_ = at + bytes;
      return base_ + at;
    }
    return std::pmr::new_delete_resource()->allocate(bytes, align);
  }
  void do_deallocate(void* p, size_t bytes, size_t align) override {
    auto* b = static_cast<uint8_t*>(p);
    if (b >= base_ && b < base_ + size_)
      free_[bytes].push_back(p);
    else
      std::pmr::new_delete_resource()->deallocate(p, bytes, align);
  }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override {
    return this == &o;
  }

  ibv_pd* pd_;
  std::optional<ParentDomain> parent_;
  uint8_t* base_;
  size_t size_;
  uint64_t type_;
  size_t used_ = 0;
  std::map<size_t, std::vector<void*>> free_;  // freed blocks of the buffer, by size
};

}  // namespace

namespace softrdma::verbs {

int queue_memory(ibv_pd* pd, uint32_t depth, size_t slot_bytes, uint64_t resource_type,
                 engine::QueueMemory& out) {
  out.reset();
  if (!pd || !to_pd(pd)->parent || !to_pd(pd)->parent->alloc) return 0;
  const ParentDomain& parent = *to_pd(pd)->parent;
  const size_t size = engine::queue_bytes(depth, slot_bytes);
  void* p = parent.alloc(pd, parent.pd_context, size, kQueueAlignment, resource_type);
  const bool custom = p != IBV_ALLOCATOR_USE_DEFAULT;
  if (!custom)
    p = std::aligned_alloc(kQueueAlignment, (size + kQueueAlignment - 1) & ~(kQueueAlignment - 1));
  if (!p) return ENOMEM;  // as mlx5: an allocator that returns NULL fails the create
  out = std::make_shared<ProviderBuffer>(pd, custom ? &parent : nullptr, p, size, resource_type);
  return 0;
}

/// verbs_context::alloc_td (ibv_alloc_td(3)): EINVAL for a missing attr or any comp_mask
/// bit (none is defined), as mlx5_alloc_td.
ibv_td* ctx_alloc_td(ibv_context* ctx, ibv_td_init_attr* attr) {
  if (!ctx || !attr || attr->comp_mask) return fail<ibv_td>(EINVAL);
  auto* t = new Td{};
  t->ibv.context = ctx;
  return &t->ibv;
}

/// verbs_context::dealloc_td (ibv_dealloc_td(3)): EBUSY while a parent domain names it (as
/// mlx5_dealloc_td).
int ctx_dealloc_td(ibv_td* td) {
  if (!td) return EINVAL;
  if (to_td(td)->users.load() > 0) return EBUSY;
  delete to_td(td);
  return 0;
}

/// verbs_context::alloc_parent_domain (ibv_alloc_parent_domain(3)). NULL with errno EINVAL
/// for a missing attr or PD, a PD or TD of another context, a parent domain as the PD, an
/// unknown comp_mask bit (as ibv_check_alloc_parent_domain and mlx5_alloc_parent_domain), or
/// IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS with a NULL alloc or free.
ibv_pd* ctx_alloc_parent_domain(ibv_context* ctx, ibv_parent_domain_init_attr* attr) {
  if (!ctx || !attr || !attr->pd || attr->pd->context != ctx) return fail<ibv_pd>(EINVAL);
  if (attr->td && attr->td->context != ctx) return fail<ibv_pd>(EINVAL);
  constexpr uint32_t kKnown =
      IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  if (attr->comp_mask & ~kKnown) return fail<ibv_pd>(EINVAL);
  Pd* protection = to_pd(attr->pd);
  if (protection->parent) return fail<ibv_pd>(EINVAL);
  const bool allocators = attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
  if (allocators && (!attr->alloc || !attr->free)) return fail<ibv_pd>(EINVAL);
  auto* p = new Pd{};
  p->pd = protection->pd;
  ParentDomain& d = p->parent.emplace();
  d.protection = attr->pd;
  d.td = attr->td ? to_td(attr->td) : nullptr;
  if (allocators) {
    d.alloc = attr->alloc;
    d.free = attr->free;
  }
  if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT) d.pd_context = attr->pd_context;
  // The PD and TD may not go while the parent domain names them (EBUSY).
  p->pd->users++;
  if (d.td) d.td->users++;
  p->ibv.context = ctx;
  p->ibv.handle = attr->pd->handle;
  return &p->ibv;
}

int dealloc_parent_domain(Pd* p) {
  if (p->handle_users.load() > 0) return EBUSY;
  p->pd->users--;
  if (p->parent->td) p->parent->td->users--;
  delete p;
  return 0;
}

}  // namespace softrdma::verbs
