// The handles the libibverbs ABI hands out, each the public verbs struct followed by the
// engine object it stands for. Every struct begins with the public struct, so a pointer to
// one is a pointer to the other (the same trick rdma-core's providers use).
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <mutex>

#include "engine/cq.h"
#include "engine/device.h"
#include "engine/memory.h"
#include "engine/mw.h"
#include "engine/qp.h"

namespace softrdma::verbs {

/// ibv_context: the extended verbs_context (ibv_context is its last member) plus the
/// engine device, shared by every context of this process.
struct Context {
  verbs_context vctx;
  std::shared_ptr<engine::Device> dev;
  int async_fds[2] = {-1, -1};  // async_fd is the read end (async_event.cpp)
};

/// One object counted against the device's limit (engine::Device::reserve), returned
/// when the handle that holds it is destroyed.
class Reservation {
 public:
  Reservation() = default;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() {
    if (dev_) dev_->release(kind_);
  }
  /// Takes one slot of `kind` on `dev`; false at the limit (caller fails with ENOMEM).
  bool take(engine::Device& dev, engine::ObjectKind kind) {
    if (!dev.reserve(kind)) return false;
    dev_ = &dev;
    kind_ = kind;
    return true;
  }

 private:
  engine::Device* dev_ = nullptr;
  engine::ObjectKind kind_ = engine::ObjectKind::kPd;
};

struct Pd {
  ibv_pd ibv;
  std::unique_ptr<engine::ProtectionDomain> pd;
  Reservation slot;
};

struct Mr {
  ibv_mr ibv;
  std::unique_ptr<engine::MemoryRegion> mr;
  Reservation slot;
};

struct Mw {
  ibv_mw ibv;
  std::unique_ptr<engine::MemoryWindow> mw;
  Reservation slot;
};

struct Channel {
  ibv_comp_channel ibv;
  engine::CompletionChannel channel;
};

/// ibv_cq, laid out as ibv_cq_ex so the extended CQ API can share it.
struct Cq {
  ibv_cq_ex ibv;
  std::unique_ptr<engine::CompletionQueue> cq;
  Reservation slot;
  std::atomic<unsigned> events_reported{0};
  std::atomic<unsigned> async_reported{0};  // CQ_ERR events returned by ibv_get_async_event
  // The extended poll (ibv_start_poll … ibv_end_poll, cq_ex.cpp): the CQE the read_*
  // accessors report, and the lock held from a successful start_poll to end_poll unless
  // the CQ was created IBV_CREATE_CQ_ATTR_SINGLE_THREADED.
  engine::Cqe current{};
  engine::CompletionTime current_time{};
  std::mutex poll_mu;
  bool single_threaded = false;
  ibv_cq* as_cq() { return reinterpret_cast<ibv_cq*>(&ibv); }
};

struct QpExBuilder;  // qp_ex.cpp: the work requests between ibv_wr_start and ibv_wr_complete

/// ibv_qp, laid out as ibv_qp_ex so the extended post API can share it.
struct Qp {
  ibv_qp_ex ibv;
  std::unique_ptr<engine::QueuePair> qp;
  Reservation slot;
  std::atomic<unsigned> async_reported{0};  // events returned by ibv_get_async_event
  /// Set for QPs created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (ibv_qp_to_qp_ex answers them).
  std::unique_ptr<QpExBuilder> ex;
  ibv_qp* as_qp() { return &ibv.qp_base; }
  Qp();
  ~Qp();
};

inline Context* to_ctx(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}
inline Pd* to_pd(ibv_pd* p) {
  return reinterpret_cast<Pd*>(p);
}
inline Mr* to_mr(ibv_mr* m) {
  return reinterpret_cast<Mr*>(m);
}
inline Mw* to_mw(ibv_mw* m) {
  return reinterpret_cast<Mw*>(m);
}
inline Channel* to_channel(ibv_comp_channel* c) {
  return reinterpret_cast<Channel*>(c);
}
inline Cq* to_cq(ibv_cq* c) {
  return reinterpret_cast<Cq*>(c);
}
inline Qp* to_qp(ibv_qp* q) {
  return reinterpret_cast<Qp*>(q);
}

}  // namespace softrdma::verbs
