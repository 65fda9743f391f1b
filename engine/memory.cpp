#include "engine/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <mutex>

#include "net/fault_guard.h"

namespace softrdma::engine {

Status MemoryRegion::validate(const void* host, uint64_t length, uint32_t access) {
  constexpr uint32_t kKnown = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic | kMwBind |
                              kZeroBased | kOnDemand | kHugetlb | kRelaxedOrdering;
  if (access & ~kKnown) return std::errc::invalid_argument;
  // IBTA 10.6.3.1 / ibv_reg_mr(3): remote write or atomic requires local write.
  if ((access & (kRemoteWrite | kRemoteAtomic)) && !(access & kLocalWrite))
    return std::errc::invalid_argument;
  // Zero-based MRs need an iova of 0 chosen by the provider; no verbs call here asks for
  // one (ibv_reg_mr_iova(…, 0, …) gives the same translation), so the bit is refused as
  // rxe refuses it in reg_user_mr.
  if (access & kZeroBased) return std::errc::operation_not_supported;
  if (!host && length && !is_implicit_odp(host, length, access)) return std::errc::invalid_argument;
  return kOk;
}

Status MemoryRegion::validate_dm(const DeviceMemory& dm, uint64_t offset, uint64_t length,
                                 uint32_t access) {
  constexpr uint32_t kOptionalRange = 0x3ffu << 20;  // IBV_ACCESS_OPTIONAL_RANGE
  constexpr uint32_t kAllowed =
      kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic | kZeroBased | kOptionalRange;
  if (!(access & kZeroBased) || (access & ~kAllowed)) return std::errc::invalid_argument;
  if ((access & (kRemoteWrite | kRemoteAtomic)) && !(access & kLocalWrite))
    return std::errc::invalid_argument;
  if (!dm.contains(offset, length)) return std::errc::invalid_argument;
  return kOk;
}

MemoryRegion::MemoryRegion(ProtectionDomain& pd, DeviceMemory& dm, uint64_t offset, uint64_t length,
                           uint32_t access)
    : MemoryRegion(pd, dm.at(offset), length, 0, access) {
  dm_ = &dm;
  dm.mr_counter().fetch_add(1, std::memory_order_acq_rel);
}

MemoryRegion::MemoryRegion(ProtectionDomain& pd, void* host, uint64_t length, uint64_t iova,
                           uint32_t access)
    : pd_(&pd), host_(static_cast<uint8_t*>(host)), length_(length), iova_(iova), access_(access) {
  std::lock_guard lk(pd_->registry().mutex());
  key_ = pd_->registry().register_mr(this);
  pd_->users++;
  pd_->registry().publish_mr(*this, false);
}

MemoryRegion::~MemoryRegion() {
  std::lock_guard lk(pd_->registry().mutex());
  pd_->registry().publish_mr(*this, true);  // returns once no same-host peer can write it
  pd_->registry().unregister_mr(key_);
  pd_->users--;
  // After the key is gone: no request can reach the memory once the count allows freeing it.
  if (dm_) dm_->mr_counter().fetch_sub(1, std::memory_order_acq_rel);
}

bool MemoryRegion::windows_bound() const {
  std::lock_guard lk(pd_->registry().mutex());
  return bound_windows > 0;
}

void MemoryRegion::rereg(uint32_t flags, ProtectionDomain* pd, void* host, uint64_t length,
                         uint64_t iova, uint32_t access) {
  std::lock_guard lk(pd_->registry().mutex());
  pd_->registry().publish_mr(*this, true);
  if (flags & kChangeTranslation) {
    host_ = static_cast<uint8_t*>(host);
    length_ = length;
    iova_ = iova;
  }
  if ((flags & kChangePd) && pd != pd_) {
    pd_->users--;
    pd_ = pd;
    pd_->users++;
  }
  if (flags & kChangeAccess) access_ = access;
  pd_->registry().publish_mr(*this, false);
}

void prefetch_range(uint8_t* p, size_t n, bool fault_in) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  ::madvise(reinterpret_cast<void*>(start), end - start, MADV_WILLNEED);
  if (fault_in) net::guarded_touch(p, n);
}

}  // namespace softrdma::engine
