// Shared receive queues (IBTA vol 1, 10.2.9 and 11.2.3; ibv_create_srq(3), ibv_modify_srq(3),
// ibv_post_srq_recv(3)): one pool of receive WQEs that any number of QPs take from, in
// posting order, with an optional low-water mark (the SRQ limit) that raises an
// asynchronous event once. XRC SRQs (annex A14) are also the receive side of XRC: an
// XRC request names one by its SRQ number, and its receive completions go to the SRQ's
// own CQ.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>

#include "engine/memory.h"
#include "engine/object_registry.h"
#include "engine/queue_memory.h"
#include "engine/types.h"

namespace softrdma::engine {

class CompletionQueue;
class XrcDomain;

/// ibv_srq_attr_mask bits.
enum SrqAttrMask : uint32_t { kSrqMaxWr = 1u << 0, kSrqLimit = 1u << 1 };

/// A shared receive queue. Every method but the constructor and query-only accessors takes
/// the device lock; take() runs under it already (the responders call it).
class SharedReceiveQueue {
 public:
  /// Values of enum ibv_srq_type.
  enum class Kind : uint8_t { kBasic = 0, kXrc = 1 };
  /// ibv_srq_attr: capacity in WQEs, SGEs per WQE, and the limit (0: not armed).
  struct Attr {
    uint32_t max_wr = 0;
    uint32_t max_sge = 0;
    uint32_t srq_limit = 0;
  };

  /// Checks creation attributes as rxe (rxe_srq_chk_attr): 1 ≤ max_wr ≤ max_srq_wr,
  /// max_sge ≤ max_srq_sge, srq_limit ≤ max_wr. EINVAL otherwise.
  static Status validate(const Attr& a);

  /// Creates the SRQ and publishes its SRQ number. XRC SRQs have `cq` and `xrcd`.
  /// `memory` holds its WQEs (null: the heap; sized with queue_bytes(a.max_wr,
  /// sizeof(RecvWqe))).
  SharedReceiveQueue(ObjectRegistry& dev, ProtectionDomain& pd, Kind kind, const Attr& a,
                     CompletionQueue* cq, XrcDomain* xrcd, QueueMemory memory = nullptr);
  ~SharedReceiveQueue();
  SharedReceiveQueue(const SharedReceiveQueue&) = delete;
  SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;

  uint32_t srqn() const { return srqn_; }
  Kind kind() const { return kind_; }
  ProtectionDomain& pd() const { return pd_; }
  /// The CQ of an XRC SRQ's receive completions (nullptr for a basic SRQ: its QPs' CQs).
  CompletionQueue* cq() const { return cq_; }
  XrcDomain* xrcd() const { return xrcd_; }

  /// ibv_post_srq_recv for one WR: ENOMEM when max_wr WQEs are posted (rxe), EINVAL for more
  /// than max_sge SGEs or a missing SGE list.
  Status post_recv(uint64_t wr_id, const Sge* sges, uint32_t num_sge);
  /// ibv_modify_srq. kSrqMaxWr resizes (EINVAL: 0, over max_srq_wr, below the armed limit or
  /// below the WQEs posted now); kSrqLimit arms the limit (EINVAL: above max_wr). Other bits:
  /// EINVAL.
  Status modify(const Attr& a, uint32_t mask);
  /// ibv_query_srq: max_wr, max_sge and the limit (0 once it fired).
  Attr query() const;

  /// QPs created with this SRQ; ibv_destroy_srq is refused (EBUSY) while > 0.
  std::atomic<int> users{0};
  /// Called once per arming, under the device lock (so it must not block or call back into
  /// the engine), when a take() leaves fewer WQEs posted than the armed limit; the limit is
  /// disarmed first (IBTA 10.2.9.3; rxe get_srq_wqe). The verbs layer posts
  /// IBV_EVENT_SRQ_LIMIT_REACHED.
  std::function<void()> on_limit_reached;

  // ---- device lock held -------------------------------------------------------------
  /// Moves the oldest WQE into `out`; false when none is posted.
  bool take(RecvWqe& out);
  /// WQEs posted and not yet taken.
  size_t posted() const { return wqes_.size(); }

 private:
  ObjectRegistry& dev_;
  ProtectionDomain& pd_;
  Kind kind_;
  CompletionQueue* cq_;
  XrcDomain* xrcd_;
  Attr attr_;
  QueueMemory memory_;  // before wqes_: it outlives them
  std::pmr::deque<RecvWqe> wqes_;
  uint32_t srqn_ = 0;
};

}  // namespace softrdma::engine
