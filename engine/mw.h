// Memory windows (IBTA vol 1, 10.6.7; Linux rxe_mw.c): remote access rights to a range of a
// memory region, granted and revoked without re-registering it. A window has an R_Key of its
// own, in the same key space as MR keys (index << 8 | an 8-bit key the consumer chooses at
// each bind), so the responder looks up one table for both.
//   Type 1: bound and unbound (bind with length 0) by ibv_bind_mw; valid from allocation;
//           usable by any QP of the window's PD.
//   Type 2: bound by an IBV_WR_BIND_MW work request (type 2A: to the QP that binds it),
//           invalidated by IBV_WR_LOCAL_INV on that QP or by a peer's SEND with invalidate
//           naming its R_Key; only then may it be bound again.
// Every method runs with the device lock held, except the constructor and destructor,
// which take it.
#pragma once

#include <cstdint>

#include "engine/memory.h"
#include "engine/object_registry.h"
#include "engine/types.h"

namespace softrdma::engine {

class QueuePair;

/// ibv_mw_type values.
enum class MwType : uint8_t { kType1 = 1, kType2 = 2 };

/// IBTA 10.6.7.1 window states (rxe_mw_state): a type 1 window is valid from allocation, a
/// type 2 window is free until bound and again after invalidation.
enum class MwState : uint8_t { kValid, kFree };

/// A memory window.
class MemoryWindow {
 public:
  /// Allocates a window of `type` (checked with valid_type() first) in `pd` and publishes
  /// its R_Key in the device's key table.
  MemoryWindow(ProtectionDomain& pd, MwType type);
  ~MemoryWindow();
  MemoryWindow(const MemoryWindow&) = delete;
  MemoryWindow& operator=(const MemoryWindow&) = delete;

  /// Whether `type` (an ibv_mw_type value from the application) names a window type;
  /// ibv_alloc_mw fails with EINVAL otherwise (rxe_alloc_mw).
  static bool valid_type(uint32_t type) { return type == 1 || type == 2; }

  ProtectionDomain& pd() const { return pd_; }
  MwType type() const { return type_; }
  MwState state() const { return state_; }
  /// The current R_Key (its low 8 bits change at each bind).
  uint32_t rkey() const { return rkey_; }
  uint64_t addr() const { return addr_; }
  uint64_t length() const { return length_; }
  uint32_t access() const { return access_; }

  /// Executes a bind work request posted on `qp` (rxe_check_bind_mw + rxe_do_bind_mw).
  /// `mr` is the MR `b.mr_lkey` names (nullptr when unknown). EINVAL when: `b.rkey` does not
  /// keep the window's index; a type 1 window is zero-based; a type 2 window is not free,
  /// belongs to another PD than `qp`, or gets no MR or length 0 (o10-37.2.40); the MR is
  /// missing, in another PD, zero-based, lacks IBV_ACCESS_MW_BIND (C10-73) or LOCAL_WRITE for
  /// a writable window (C10-74); the range leaves the MR (C10-75). EOPNOTSUPP for access bits
  /// a window cannot carry. On success the window is valid with the new key, range and
  /// rights (a type 1 bind of length 0 leaves it bound to nothing).
  Status bind(const QueuePair& qp, const MwBind& b, MemoryRegion* mr);

  /// Invalidates a type 2 window (LOCAL_INV on `qp`, or a SEND with invalidate that `qp`
  /// received; rxe_invalidate_mw). EINVAL for a type 1 window (o10-37.2.26) or one not bound.
  Status invalidate();

  /// Host address of [va, va+len) through this window for a remote access of kind `need`
  /// (an Access bit) arriving on QP `qpn` whose responder PD is `pd`, or nullptr: the window
  /// must be valid and bound, of that PD, of that QP if type 2, grant `need`, and cover the
  /// range, which its MR must still translate (IBTA 10.6.7.3; rxe_lookup_mw + check_rkey).
  uint8_t* translate(const ProtectionDomain& pd, uint32_t qpn, uint64_t va, uint64_t len,
                     uint32_t need) const;

 private:
  void unbind();

  ProtectionDomain& pd_;
  MwType type_;
  MwState state_;
  uint32_t rkey_ = 0;
  MemoryRegion* mr_ = nullptr;  ///< bound MR (its bound_windows counts this window)
  uint32_t qpn_ = 0;            ///< type 2: the QP it is bound to
  uint64_t addr_ = 0;
  uint64_t length_ = 0;
  uint32_t access_ = 0;
};

}  // namespace softrdma::engine
