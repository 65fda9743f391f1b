// ibv_dm: device memory (ibv_alloc_dm(3), ibv_free_dm, ibv_memcpy_to_dm / ibv_memcpy_from_dm,
// ibv_reg_dm_mr), reached through verbs_context's alloc_dm / free_dm / reg_dm_mr and the
// copy functions of struct ibv_dm. The memory is the engine's (engine/device_memory.h): the
// application gets no address of it, only copies and zero-based MRs. Errors as rdma-core
// 44's libibverbs, kernel and mlx5 provider give them (docs/verbs.md, "Device memory").
#include <atomic>

#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

/// ibv_dm::memcpy_to_dm (ibv_memcpy_to_dm): 0, EFAULT for a range outside the DM, EINVAL
/// for an offset or length that is not a multiple of 4 (mlx5_access_dm).
int dm_copy_to(ibv_dm* dm, uint64_t dm_offset, const void* host_addr, size_t length) {
  if (!dm) return EINVAL;
  return err(to_dm(dm)->dm->copy_in(dm_offset, host_addr, length));
}

/// ibv_dm::memcpy_from_dm (ibv_memcpy_from_dm): as dm_copy_to, the other way.
int dm_copy_from(void* host_addr, ibv_dm* dm, uint64_t dm_offset, size_t length) {
  if (!dm) return EINVAL;
  return err(to_dm(dm)->dm->copy_out(host_addr, dm_offset, length));
}

/// The handle ibv_alloc_dm reports (ibv_import_dm finds the DM by it): unique in the
/// process.
std::atomic<uint32_t> g_next_dm_handle{1};

/// A new ibv_dm handle on ctx for the device memory `mem`, reporting `handle`.
Dm* new_dm_handle(ibv_context* ctx, std::shared_ptr<engine::DeviceMemory> mem, uint32_t handle) {
  auto* d = new Dm{};
  d->dm = std::move(mem);
  d->ibv.context = ctx;
  d->ibv.memcpy_to_dm = dm_copy_to;
  d->ibv.memcpy_from_dm = dm_copy_from;
  d->ibv.comp_mask = IBV_DM_MASK_HANDLE;
  d->ibv.handle = handle;
  return d;
}

}  // namespace

namespace softrdma::verbs {

/// verbs_context::alloc_dm (ibv_alloc_dm(3)): `attr->length` bytes of the device's memory,
/// zero-filled, aligned to 2^log_align_req. NULL with errno: EINVAL for no attr, a comp_mask
/// (none is defined), length 0, a length above max_dm_size (mlx5_alloc_dm) or log_align_req
/// above 12; ENOMEM when the device's free device memory does not hold it.
ibv_dm* ctx_alloc_dm(ibv_context* ctx, ibv_alloc_dm_attr* attr) {
  if (!ctx || !attr || attr->comp_mask) return fail<ibv_dm>(EINVAL);
  engine::Status st;
  auto mem = engine::DeviceMemory::allocate(to_ctx(ctx)->dev->device_memory(), attr->length,
                                            attr->log_align_req, st);
  if (!mem) return fail<ibv_dm>(err(st));
  Dm* d =
      new_dm_handle(ctx, std::move(mem), g_next_dm_handle.fetch_add(1, std::memory_order_relaxed));
  publish(ctx, d);
  return &d->ibv;
}

/// verbs_context::free_dm (ibv_free_dm): 0, or EBUSY while MRs are registered on the DM
/// (the kernel's usecnt check; ibv_alloc_dm(3) NOTES). The memory returns to the device.
int ctx_free_dm(ibv_dm* dm) {
  if (!dm) return EINVAL;
  Dm* d = to_dm(dm);
  if (d->dm->mr_count() > 0) return EBUSY;
  unpublish(d);
  delete d;
  return 0;
}

/// verbs_context::reg_dm_mr (ibv_reg_dm_mr): an MR over [dm_offset, dm_offset + length) of
/// `dm`, zero-based — SGEs and remote requests address it from 0 — with lkey == rkey and
/// addr NULL (as libibverbs' ibv_cmd_reg_dm_mr fills it). Length 0 is allowed. NULL with
/// errno: EINVAL for no PD or DM, a DM of another device, access without
/// IBV_ACCESS_ZERO_BASED or with bits a DM MR cannot have (MW_BIND, ON_DEMAND, HUGETLB),
/// remote write/atomic without local write, a range outside the DM; ENOMEM at max_mr.
ibv_mr* ctx_reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t dm_offset, size_t length,
                      unsigned int access) {
  if (!pd || !dm) return fail<ibv_mr>(EINVAL);
  if (to_ctx(dm->context)->dev != to_ctx(pd->context)->dev) return fail<ibv_mr>(EINVAL);
  engine::DeviceMemory& mem = *to_dm(dm)->dm;
  if (engine::Status s = engine::MemoryRegion::validate_dm(mem, dm_offset, length, access);
      s != engine::kOk)
    return fail<ibv_mr>(err(s));
  return new_mr_handle(pd, nullptr, length, [&] {
    return std::make_unique<engine::MemoryRegion>(*to_pd(pd)->pd, mem, dm_offset, length, access);
  });
}

}  // namespace softrdma::verbs

extern "C" {

/// ibv_import_dm(3): a new handle, on `ctx`, on the DM that `dm_handle` (its ibv_dm::handle)
/// names in ctx's command file — a context imported from a dup of the allocating context's
/// cmd_fd (ibv_import_device), within this process. NULL with errno EINVAL (no context),
/// ENOENT when the file lists no such DM (freed, or never allocated there).
ibv_dm* ibv_import_dm(ibv_context* ctx, uint32_t dm_handle) {
  if (!ctx) return fail<ibv_dm>(EINVAL);
  std::shared_ptr<engine::DeviceMemory> mem = find_dm(ctx, dm_handle);
  if (!mem) return fail<ibv_dm>(ENOENT);
  return &new_dm_handle(ctx, std::move(mem), dm_handle)->ibv;
}

/// ibv_unimport_dm(3): frees the handle; the DM stays allocated (ibv_free_dm through
/// another handle frees it).
void ibv_unimport_dm(ibv_dm* dm) {
  if (!dm) return;
  Dm* d = to_dm(dm);
  keep_if_last(d);
  delete d;
}

}  // extern "C"
