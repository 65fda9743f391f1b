// ibv_pd and ibv_mr: protection domains and memory registration.
#include <sys/mman.h>
#include <unistd.h>

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

extern "C" {

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  if (!ctx) return fail<ibv_pd>(EINVAL);
  auto* p = new Pd{};
  if (!p->slot.take(*to_ctx(ctx)->dev, engine::ObjectKind::kPd)) {
    delete p;
    return fail<ibv_pd>(ENOMEM);  // max_pd reached
  }
  p->pd = std::make_unique<engine::ProtectionDomain>(*to_ctx(ctx)->dev);
  p->ibv.context = ctx;
  p->ibv.handle = 0;
  return &p->ibv;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  Pd* p = to_pd(pd);
  if (p->pd->users.load() > 0) return EBUSY;
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
  if (reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr))
    return fail<ibv_mr>(EINVAL);
  if (length && !range_is_mapped(addr, length)) return fail<ibv_mr>(EFAULT);
  auto* m = new Mr{};
  if (!m->slot.take(*to_ctx(pd->context)->dev, engine::ObjectKind::kMr)) {
    delete m;
    return fail<ibv_mr>(ENOMEM);  // max_mr reached
  }
  m->mr = std::make_unique<engine::MemoryRegion>(*to_pd(pd)->pd, addr, length, iova, access);
  m->ibv.context = pd->context;
  m->ibv.pd = pd;
  m->ibv.addr = addr;
  m->ibv.length = length;
  m->ibv.handle = m->mr->key();
  m->ibv.lkey = m->mr->key();
  m->ibv.rkey = m->mr->key();
  return &m->ibv;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

int ibv_rereg_mr(ibv_mr*, int, ibv_pd*, void*, size_t, int) {
  errno = EOPNOTSUPP;
  return IBV_REREG_MR_ERR_INPUT;
}

int ibv_dereg_mr(ibv_mr* mr) {
  delete to_mr(mr);
  return 0;
}

}  // extern "C"
