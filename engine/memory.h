// Protection domains and memory regions: the key tables the responder checks remote
// accesses against and the requester checks local SGEs against (IBTA vol 1, 10.6).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "engine/device_memory.h"
#include "engine/object_registry.h"
#include "engine/types.h"

namespace softrdma::engine {

/// A protection domain. MRs and QPs belong to one; a remote access succeeds only through
/// an MR of the target QP's PD.
class ProtectionDomain {
 public:
  explicit ProtectionDomain(ObjectRegistry& dev) : dev_(dev), id_(next_id()) {}
  /// The device whose tables the PD's MRs are published in.
  ObjectRegistry& registry() const { return dev_; }
  /// A number no other PD of this process has (for tables that compare PDs by value, such
  /// as the same-host placement table; never 0).
  uint32_t id() const { return id_; }
  /// Objects (MRs, QPs) that reference this PD; dealloc is refused (EBUSY) while > 0.
  std::atomic<int> users{0};

 private:
  static uint32_t next_id() {
    static std::atomic<uint32_t> n{0};
    return n.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  ObjectRegistry& dev_;
  uint32_t id_;
};

/// A registered memory region: host memory [host, host+length) addressed by the peer as
/// [iova, iova+length), with access rights. lkey == rkey (one key, as rxe does).
/// ibv_rereg_mr changes translation, PD or rights in place (rereg()); the key stays.
class MemoryRegion {
 public:
  /// Registers and publishes the MR in the device's key table. Check arguments with
  /// validate() first.
  MemoryRegion(ProtectionDomain& pd, void* host, uint64_t length, uint64_t iova, uint32_t access);
  /// ibv_reg_dm_mr: registers [offset, offset + length) of device memory `dm` zero-based
  /// (iova 0: the MR's addresses are offsets from its start, for local SGEs and remote
  /// requests alike) and counts itself on `dm` until destroyed. Check arguments with
  /// validate_dm() first.
  MemoryRegion(ProtectionDomain& pd, DeviceMemory& dm, uint64_t offset, uint64_t length,
               uint32_t access);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  /// Checks reg_mr arguments as verbs does: EINVAL for REMOTE_WRITE/REMOTE_ATOMIC without
  /// LOCAL_WRITE, unknown access bits, or a null address with non-zero length (except the
  /// implicit on-demand MR: NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND); EOPNOTSUPP for
  /// IBV_ACCESS_ZERO_BASED.
  static Status validate(const void* host, uint64_t length, uint32_t access);
  /// Checks reg_dm_mr arguments as libibverbs, the kernel and mlx5 do (ibv_cmd_reg_dm_mr,
  /// ib_uverbs_reg_dm_mr, mlx5_reg_dm_mr): EINVAL without IBV_ACCESS_ZERO_BASED, for access
  /// bits other than local write, remote write/read/atomic, zero-based and the optional
  /// range (IBV_ACCESS_OPTIONAL_RANGE), for remote write or atomic without local write, or
  /// a range [offset, offset + length) outside `dm`.
  static Status validate_dm(const DeviceMemory& dm, uint64_t offset, uint64_t length,
                            uint32_t access);
  /// Whether (host, length, access) asks for the implicit on-demand MR that covers the whole
  /// address space (ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND), as mlx5 offers).
  static bool is_implicit_odp(const void* host, uint64_t length, uint32_t access) {
    return !host && length == UINT64_MAX && (access & kOnDemand);
  }

  /// What ibv_rereg_mr changes (IBV_REREG_MR_CHANGE_* bits). Arguments are checked by the
  /// caller; takes the device lock, so a request in progress sees the old or the new
  /// region, never a mix.
  enum ReregFlag : uint32_t { kChangeTranslation = 1, kChangePd = 2, kChangeAccess = 4 };
  void rereg(uint32_t flags, ProtectionDomain* pd, void* host, uint64_t length, uint64_t iova,
             uint32_t access);

  ProtectionDomain& pd() const { return *pd_; }
  uint32_t key() const { return key_; }
  uint64_t iova() const { return iova_; }
  uint64_t length() const { return length_; }
  uint32_t access() const { return access_; }
  uint8_t* host() const { return host_; }
  /// Whether the MR is registered on device memory (ibv_reg_dm_mr); ibv_rereg_mr refuses
  /// such MRs, as the kernel does.
  bool on_device_memory() const { return dm_ != nullptr; }

  /// Memory windows bound to this region (device lock held): dereg is refused while > 0
  /// (IBA 10.6.7.2.6, as rxe_dereg_mr).
  uint32_t bound_windows = 0;
  /// Whether windows are bound to it (takes the device lock).
  bool windows_bound() const;

  /// Host address of [va, va+len) if it lies inside the region, else nullptr.
  /// Zero-length ranges inside or at the end of the region translate.
  uint8_t* translate(uint64_t va, uint64_t len) const {
    if (va < iova_ || len > length_ || va - iova_ > length_ - len) return nullptr;
    return host_ + (va - iova_);
  }

 private:
  ProtectionDomain* pd_;
  uint8_t* host_;
  uint64_t length_;
  uint64_t iova_;
  uint32_t access_;
  uint32_t key_;
  DeviceMemory* dm_ = nullptr;
};

/// Asks the kernel to read the host memory [p, p+n) ahead (madvise MADV_WILLNEED over its
/// pages) and, when `fault_in`, touches one byte of each page through net's fault guard, so
/// that the pages are present when the engine copies (ibv_advise_mr's PREFETCH and
/// PREFETCH_WRITE; a write prefetch writes nothing). A page unmapped since registration is
/// skipped: its access fails later, at the copy. No errors.
void prefetch_range(uint8_t* p, size_t n, bool fault_in);

}  // namespace softrdma::engine
