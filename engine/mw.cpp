#include "engine/mw.h"

#include <mutex>

#include "engine/log.h"
#include "engine/qp.h"

namespace softrdma::engine {

namespace {

/// Rights a window may carry (rxe's RXE_ACCESS_SUPPORTED_MW): the MR rights plus
/// zero-based addressing. Others are EOPNOTSUPP at bind.
constexpr uint32_t kWindowAccess =
    kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic | kMwBind | kZeroBased;

}  // namespace

MemoryWindow::MemoryWindow(ProtectionDomain& pd, MwType type)
    : pd_(pd), type_(type), state_(type == MwType::kType1 ? MwState::kValid : MwState::kFree) {
  std::lock_guard lk(pd_.registry().mutex());
  rkey_ = pd_.registry().register_mw(this);
  pd_.users++;
}

MemoryWindow::~MemoryWindow() {
  std::lock_guard lk(pd_.registry().mutex());
  unbind();  // deallocation unbinds (rxe_mw_cleanup)
  pd_.registry().unregister_mw(rkey_);
  pd_.users--;
}

void MemoryWindow::unbind() {
  if (mr_) --mr_->bound_windows;
  mr_ = nullptr;
  qpn_ = 0;
  addr_ = length_ = 0;
  access_ = 0;
}

Status MemoryWindow::bind(const QueuePair& qp, const MwBind& b, MemoryRegion* mr) {
  auto refuse = [&](const char* why) {
    log().debug("mw {:#x}: bind refused: {}", rkey_, why);
    return std::errc::invalid_argument;
  };
  if ((b.rkey >> 8) != (rkey_ >> 8)) return refuse("the new R_Key changes the window's index");
  if (b.length && !mr) return refuse("no MR with that lkey");
  if (b.access & ~kWindowAccess) {
    log().debug("mw {:#x}: bind refused: access {:#x} not supported", rkey_, b.access);
    return std::errc::operation_not_supported;
  }
  if (type_ == MwType::kType1) {
    if (b.access & kZeroBased) return refuse("a type 1 window cannot be zero-based (o10-36.2.2)");
  } else {
    if (state_ != MwState::kFree) return refuse("a type 2 window must be free (o10-37.2.30)");
    if (&qp.pd() != &pd_) return refuse("the QP's PD is not the window's (C10-72)");
    if (!mr || b.length == 0)
      return refuse("a type 2 window needs an MR and a length (o10-37.2.40)");
  }
  if (b.length) {
    if (&mr->pd() != &pd_) return refuse("the MR's PD is not the window's");
    if (!(mr->access() & kMwBind)) return refuse("the MR lacks IBV_ACCESS_MW_BIND (C10-73)");
    if ((b.access & (kRemoteWrite | kRemoteAtomic)) && !(mr->access() & kLocalWrite))
      return refuse("a writable window needs an MR with LOCAL_WRITE (C10-74)");
    if (!mr->translate(b.addr, b.length)) return refuse("the range leaves the MR (C10-75)");
  }
  unbind();
  rkey_ = b.rkey;
  state_ = MwState::kValid;
  if (b.length) {
    mr_ = mr;
    ++mr_->bound_windows;
    addr_ = b.addr;
    length_ = b.length;
    access_ = b.access;
    if (type_ == MwType::kType2) qpn_ = qp.qpn();
  }
  return kOk;
}

Status MemoryWindow::invalidate() {
  if (type_ == MwType::kType1) {
    log().debug("mw {:#x}: invalidate refused: type 1 (o10-37.2.26)", rkey_);
    return std::errc::invalid_argument;
  }
  if (state_ != MwState::kValid) {
    log().debug("mw {:#x}: invalidate refused: not bound", rkey_);
    return std::errc::invalid_argument;
  }
  unbind();
  state_ = MwState::kFree;
  return kOk;
}

uint8_t* MemoryWindow::translate(const ProtectionDomain& pd, uint32_t qpn, uint64_t va,
                                 uint64_t len, uint32_t need) const {
  if (state_ != MwState::kValid || !mr_ || length_ == 0) return nullptr;
  if (&pd_ != &pd || !(access_ & need)) return nullptr;
  if (type_ == MwType::kType2 && qpn_ != qpn) return nullptr;
  // A zero-based window is addressed by offsets from its start; the others by the MR's
  // virtual addresses.
  const uint64_t base = (access_ & kZeroBased) ? 0 : addr_;
  if (va < base || len > length_ || va - base > length_ - len) return nullptr;
  return mr_->translate(addr_ + (va - base), len);
}

}  // namespace softrdma::engine
