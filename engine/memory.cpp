#include "engine/memory.h"

#include <mutex>

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

MemoryRegion::MemoryRegion(ProtectionDomain& pd, void* host, uint64_t length, uint64_t iova,
                           uint32_t access)
    : pd_(&pd), host_(static_cast<uint8_t*>(host)), length_(length), iova_(iova), access_(access) {
  std::lock_guard lk(pd_->registry().mutex());
  key_ = pd_->registry().register_mr(this);
  pd_->users++;
}

MemoryRegion::~MemoryRegion() {
  std::lock_guard lk(pd_->registry().mutex());
  pd_->registry().unregister_mr(key_);
  pd_->users--;
}

bool MemoryRegion::windows_bound() const {
  std::lock_guard lk(pd_->registry().mutex());
  return bound_windows > 0;
}

void MemoryRegion::rereg(uint32_t flags, ProtectionDomain* pd, void* host, uint64_t length,
                         uint64_t iova, uint32_t access) {
  std::lock_guard lk(pd_->registry().mutex());
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
}

}  // namespace softrdma::engine
