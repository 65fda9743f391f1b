#include "engine/srq.h"

#include <mutex>

#include "engine/cq.h"
#include "engine/log.h"
#include "engine/xrcd.h"

namespace softrdma::engine {

Status SharedReceiveQueue::validate(const Attr& a) {
  if (a.max_wr == 0 || a.max_wr > DeviceLimits::kMaxSrqWr || a.max_sge > DeviceLimits::kMaxSrqSge ||
      a.srq_limit > a.max_wr)
    return std::errc::invalid_argument;
  return kOk;
}

SharedReceiveQueue::SharedReceiveQueue(ObjectRegistry& dev, ProtectionDomain& pd, Kind kind,
                                       const Attr& a, CompletionQueue* cq, XrcDomain* xrcd,
                                       QueueMemory memory)
    : dev_(dev),
      pd_(pd),
      kind_(kind),
      cq_(cq),
      xrcd_(xrcd),
      attr_(a),
      memory_(std::move(memory)),
      wqes_(resource_of(memory_)) {
  std::lock_guard lk(dev_.mutex());
  srqn_ = dev_.register_srq(this);
  pd_.users++;
  if (cq_) cq_->users++;
  if (xrcd_) xrcd_->users++;
}

SharedReceiveQueue::~SharedReceiveQueue() {
  std::lock_guard lk(dev_.mutex());
  dev_.unregister_srq(srqn_);
  pd_.users--;
  if (cq_) cq_->users--;
  if (xrcd_) xrcd_->users--;
}

Status SharedReceiveQueue::post_recv(uint64_t wr_id, const Sge* sges, uint32_t num_sge) {
  std::lock_guard lk(dev_.mutex());
  // rxe_post_one_recv's order: a full queue first, then the SGE count.
  if (wqes_.size() >= attr_.max_wr) return std::errc::not_enough_memory;
  if (num_sge > attr_.max_sge || (num_sge && !sges)) return std::errc::invalid_argument;
  RecvWqe& r = wqes_.emplace_back();
  r.wr_id = wr_id;
  r.sges.assign(sges, sges + num_sge);
  for (const Sge& s : r.sges) r.length += s.length;
  return kOk;
}

Status SharedReceiveQueue::modify(const Attr& a, uint32_t mask) {
  std::lock_guard lk(dev_.mutex());
  auto refuse = [&](const char* why) {
    log().debug("srq {:#x}: modify_srq refused: {}", srqn_, why);
    return std::errc::invalid_argument;
  };
  if (mask & ~(kSrqMaxWr | kSrqLimit)) return refuse("unknown attribute mask bits");
  uint32_t max_wr = attr_.max_wr;
  if (mask & kSrqMaxWr) {
    if (a.max_wr == 0 || a.max_wr > DeviceLimits::kMaxSrqWr)
      return refuse("max_wr is 0 or over max_srq_wr");
    if (attr_.srq_limit && a.max_wr < attr_.srq_limit)
      return refuse("max_wr is below the armed limit");
    if (a.max_wr < wqes_.size()) return refuse("max_wr is below the WQEs posted");
    max_wr = a.max_wr;
  }
  if ((mask & kSrqLimit) && a.srq_limit > max_wr) return refuse("srq_limit is over max_wr");
  attr_.max_wr = max_wr;
  if (mask & kSrqLimit) attr_.srq_limit = a.srq_limit;
  return kOk;
}

SharedReceiveQueue::Attr SharedReceiveQueue::query() const {
  std::lock_guard lk(dev_.mutex());
  return attr_;
}

bool SharedReceiveQueue::take(RecvWqe& out) {
  if (wqes_.empty()) return false;
  out = std::move(wqes_.front());
  wqes_.pop_front();
  if (attr_.srq_limit && wqes_.size() < attr_.srq_limit) {
    attr_.srq_limit = 0;  // fires once per arming
    if (on_limit_reached) on_limit_reached();
  }
  return true;
}

}  // namespace softrdma::engine
