// ibv_pd and ibv_mr: protection domains and memory registration.
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>

#include "verbs/ops.h"

// verbs.h wraps these exported names in inline helpers; we define the real symbols.
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

/// Whether every page of [addr, addr+length) is mapped in this process. msync(MS_ASYNC) is
/// one system call whatever the length (no per-page vector as mincore needs, no copy as
/// process_vm_readv does): Linux walks the VMAs of the range and answers ENOMEM for a hole,
/// without writing anything back. A PROT_NONE mapping counts as mapped here (the kernel's
/// ib_umem_get would fail on it when pinning); softrdma pins nothing.
bool range_is_mapped(const void* addr, size_t length) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + length;
  return ::msync(reinterpret_cast<void*>(start), end - start, MS_ASYNC) == 0;
}

}  // namespace

namespace softrdma::verbs {

/// verbs_context::advise_mr (ibv_advise_mr(3)): the ranges must lie in MRs of `pd` with
/// IBV_ACCESS_ON_DEMAND (EINVAL otherwise, or for no SGE / an unknown flag; EOPNOTSUPP for
/// an unknown advice). PREFETCH and PREFETCH_WRITE fault the pages in now (MADV_WILLNEED,
/// then one touch per page; a write prefetch writes nothing), PREFETCH_NO_FAULT only asks
/// the kernel to read ahead. An unmapped page is skipped, never an error: on hardware the
/// prefetch of such a page fails later, at the access. IBV_ADVISE_MR_FLAG_FLUSH changes
/// nothing here: the work is done before the call returns either way.
int ctx_advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list,
                  uint32_t num_sge) {
  if (!pd || !sg_list || num_sge == 0) return EINVAL;
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return EOPNOTSUPP;
  if (flags & ~uint32_t(IBV_ADVISE_MR_FLAG_FLUSH)) return EINVAL;
  engine::Device& dev = *to_ctx(pd->context)->dev;
  for (uint32_t i = 0; i < num_sge; ++i) {
    const ibv_sge& s = sg_list[i];
    uint8_t* host = nullptr;
    {
      std::lock_guard lk(dev.mutex());
      engine::MemoryRegion* mr = dev.find_mr(s.lkey);
      if (!mr || &mr->pd() != to_pd(pd)->pd.get() || !(mr->access() & IBV_ACCESS_ON_DEMAND))
        return EINVAL;
      host = mr->translate(s.addr, s.length);
      if (!host) return EINVAL;
    }
    if (s.length)
      engine::prefetch_range(host, s.length, advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT);
  }
  return 0;
}

ibv_mr* new_mr_handle(ibv_pd* pd, void* addr, size_t length,
                      const std::function<std::unique_ptr<engine::MemoryRegion>()>& make) {
  auto* m = new Mr{};
  if (!m->slot.take(*to_ctx(pd->context)->dev, engine::ObjectKind::kMr)) {
    delete m;
    return fail<ibv_mr>(ENOMEM);  // max_mr reached
  }
  m->mr = make();
  m->ibv.context = pd->context;
  m->ibv.pd = pd;
  m->ibv.addr = addr;
  m->ibv.length = length;
  m->ibv.handle = m->mr->key();
  m->ibv.lkey = m->mr->key();
  m->ibv.rkey = m->mr->key();
  publish(pd->context, m);  // importable by its handle (ibv_import_mr)
  return &m->ibv;
}

}  // namespace softrdma::verbs

extern "C" {

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  if (!ctx) return fail<ibv_pd>(EINVAL);
  auto* p = new Pd{};
  if (!p->slot.take(*to_ctx(ctx)->dev, engine::ObjectKind::kPd)) {
    delete p;
    return fail<ibv_pd>(ENOMEM);  // max_pd reached
  }
  p->pd = std::make_shared<engine::ProtectionDomain>(*to_ctx(ctx)->dev);
  p->ibv.context = ctx;
  publish(ctx, p);  // sets ibv.handle
  return &p->ibv;
}

/// ibv_dealloc_pd(3): EBUSY while MRs, QPs, SRQs, AHs, MWs or parent domains use the PD, or
/// while QPs, SRQs or CQs made on a parent domain exist (parent_domain.cpp).
int ibv_dealloc_pd(ibv_pd* pd) {
  if (!pd) return EINVAL;
  Pd* p = to_pd(pd);
  if (p->parent) return dealloc_parent_domain(p);
  if (p->pd->users.load() > 0) return EBUSY;
  unpublish(p);
  delete p;
  return 0;
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                         unsigned int access) {
  if (!pd) return fail<ibv_mr>(EINVAL);
  if (engine::Status s = engine::MemoryRegion::validate(addr, length, access); s != engine::kOk)
    return fail<ibv_mr>(err(s));
  // As ib_umem_get: a range that wraps the address space is EINVAL, one that is not mapped
  // (e.g. address 0x10) EFAULT.
  // On-demand MRs need not be mapped yet (their pages are reached when used), and the
  // implicit one covers the whole address space.
  const bool odp = access & IBV_ACCESS_ON_DEMAND;
  if (!engine::MemoryRegion::is_implicit_odp(addr, length, access)) {
    if (reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr))
      return fail<ibv_mr>(EINVAL);
    if (length && !odp && !range_is_mapped(addr, length)) return fail<ibv_mr>(EFAULT);
  }
  return new_mr_handle(pd, addr, length, [&] {
    return std::make_unique<engine::MemoryRegion>(*to_pd(pd)->pd, addr, length, iova, access);
  });
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

/// ibv_rereg_mr(3): changes an MR in place, keeping its lkey/rkey. Returns 0, or an
/// ibv_rereg_mr_err_code with errno set, checked in the order libibverbs and the kernel's
/// ib_uverbs_rereg_mr check:
///   IBV_REREG_MR_ERR_INPUT (EINVAL): no flag, an unknown flag, CHANGE_TRANSLATION without an
///   address or a length;
///   IBV_REREG_MR_ERR_CMD: EINVAL for bad access bits (remote write/atomic without local
///   write, unknown bits), a missing PD or one of another device, a wrapping range; EBUSY
///   while memory windows are bound to the MR (the kernel's usecnt check); EFAULT for a
///   new range that is not mapped (unless on-demand); EOPNOTSUPP for zero-based access;
///   EINVAL for an MR on device memory (ibv_reg_dm_mr), as the kernel refuses it.
/// The change is atomic for the engine: a request in flight sees the old or the new region.
int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  auto input_error = [] {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  };
  auto cmd_error = [](int e) {
    errno = e;
    return IBV_REREG_MR_ERR_CMD;
  };
  if (!mr || !flags || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED)) return input_error();
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !length)) return input_error();
  Mr* m = to_mr(mr);
  if (m->mr->on_device_memory()) return cmd_error(EINVAL);  // ib_uverbs_rereg_mr: no DM MRs
  const unsigned new_access =
      (flags & IBV_REREG_MR_CHANGE_ACCESS) ? static_cast<unsigned>(access) : m->mr->access();
  void* new_addr = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? addr : mr->addr;
  const size_t new_length = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : mr->length;
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
    if (engine::Status s = engine::MemoryRegion::validate(new_addr, new_length, new_access);
        s != engine::kOk)
      return cmd_error(err(s));
  }
  if ((flags & IBV_REREG_MR_CHANGE_PD) && (!pd || pd->context != mr->context))
    return cmd_error(EINVAL);
  if (m->mr->windows_bound()) return cmd_error(EBUSY);
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    if (reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr))
      return cmd_error(EINVAL);
    if (!(new_access & IBV_ACCESS_ON_DEMAND) && !range_is_mapped(addr, length))
      return cmd_error(EFAULT);
  }
  m->mr->rereg(static_cast<uint32_t>(flags),
               (flags & IBV_REREG_MR_CHANGE_PD) ? to_pd(pd)->pd.get() : nullptr, addr, length,
               reinterpret_cast<uintptr_t>(addr), new_access);
  if (flags & IBV_REREG_MR_CHANGE_PD) mr->pd = pd;
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    mr->addr = addr;
    mr->length = length;
  }
  return 0;
}

/// ibv_dereg_mr(3): 0, or EINVAL while memory windows are bound to the MR (IBA 10.6.7.2.6;
/// rxe_dereg_mr refuses the same way). Accesses through its key fail from now on.
int ibv_dereg_mr(ibv_mr* mr) {
  if (!mr) return EINVAL;
  if (to_mr(mr)->mr->windows_bound()) return EINVAL;
  unpublish(to_mr(mr));
  delete to_mr(mr);
  return 0;
}

}  // extern "C"
