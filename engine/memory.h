// Protection domains and memory regions: the key tables the responder checks remote
// accesses against and the requester checks local SGEs against (IBTA vol 1, 10.6).
#pragma once

#include <atomic>
#include <cstdint>

#include "engine/object_registry.h"
#include "engine/types.h"

namespace softrdma::engine {

/// A protection domain. MRs and QPs belong to one; a remote access succeeds only through
/// an MR of the target QP's PD.
class ProtectionDomain {
 public:
  explicit ProtectionDomain(ObjectRegistry& dev) : dev_(dev) {}
  /// The device whose tables the PD's MRs are published in.
  ObjectRegistry& registry() const { return dev_; }
  /// Objects (MRs, QPs) that reference this PD; dealloc is refused (EBUSY) while > 0.
  std::atomic<int> users{0};

 private:
  ObjectRegistry& dev_;
};

/// A registered memory region: host memory [host, host+length) addressed by the peer as
/// [iova, iova+length), with access rights. lkey == rkey (one key, as rxe does).
class MemoryRegion {
 public:
  /// Registers and publishes the MR in the device's key table. Check arguments with
  /// validate() first.
  MemoryRegion(ProtectionDomain& pd, void* host, uint64_t length, uint64_t iova, uint32_t access);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  /// Checks reg_mr arguments as verbs does: EINVAL for REMOTE_WRITE/REMOTE_ATOMIC without
  /// LOCAL_WRITE, unknown access bits, or a null address with non-zero length.
  static Status validate(const void* host, uint64_t length, uint32_t access);

  ProtectionDomain& pd() const { return pd_; }
  uint32_t key() const { return key_; }
  uint64_t iova() const { return iova_; }
  uint64_t length() const { return length_; }
  uint32_t access() const { return access_; }
  uint8_t* host() const { return host_; }

  /// Host address of [va, va+len) if it lies inside the region, else nullptr.
  /// Zero-length ranges inside or at the end of the region translate.
  uint8_t* translate(uint64_t va, uint64_t len) const {
    if (va < iova_ || len > length_ || va - iova_ > length_ - len) return nullptr;
    return host_ + (va - iova_);
  }

 private:
  ProtectionDomain& pd_;
  uint8_t* host_;
  uint64_t length_;
  uint64_t iova_;
  uint32_t access_;
  uint32_t key_;
};

}  // namespace softrdma::engine
