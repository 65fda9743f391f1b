// The handles the libibverbs ABI hands out, each the public verbs struct followed by the
// engine object it stands for. Every struct begins with the public struct, so a pointer to
// one is a pointer to the other (the same trick rdma-core's providers use).
//
// Process-wide state (the sets of live CQs and of objects async events may name, the open
// devices, command files and XRC domains) is never destroyed: `T& g = *new T`, not a static T.
// A program may call exit() while another of its threads is still in a verbs call — rping's
// CM thread does on every failed connect while its main thread destroys the QP and its CQ
// thread reads the flushed receive's event — and exit() runs static destructors, so a
// destroyed map there is a crash in the exiting process. With the kernel's verbs that state
// lives in the kernel and outlives the call. (Found by clang's -Wexit-time-destructors;
// verbs/tests/exit_race_test.cpp.)
#pragma once

#include <infiniband/verbs.h>

#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "engine/ah.h"
#include "engine/cq.h"
#include "engine/device.h"
#include "engine/device_memory.h"
#include "engine/memory.h"
#include "engine/mw.h"
#include "engine/qp.h"
#include "engine/srq.h"
#include "engine/xrcd.h"

namespace softrdma::verbs {

struct CommandFile;  // import.cpp: what a cmd_fd stands for, shared by imported contexts

/// ibv_context: the extended verbs_context (ibv_context is its last member) plus the
/// engine device, shared by every context of this process.
struct Context {
  verbs_context vctx;
  std::shared_ptr<engine::Device> dev;
  int async_fds[2] = {-1, -1};  // async_fd is the read end (async_event.cpp)
  /// The file behind cmd_fd, shared with the contexts ibv_import_device made from a dup of
  /// it: the PDs and MRs ibv_import_pd / ibv_import_mr find by handle (import.cpp).
  std::shared_ptr<CommandFile> file;
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
  /// Takes over the slot `o` holds (o then holds none).
  void adopt(Reservation& o) {
    dev_ = o.dev_;
    kind_ = o.kind_;
    o.dev_ = nullptr;
  }

 private:
  engine::Device* dev_ = nullptr;
  engine::ObjectKind kind_ = engine::ObjectKind::kPd;
};

/// ibv_td (parent_domain.cpp): a thread domain. softrdma keeps its locks whatever the
/// application promises, so it only counts the parent domains that name it.
struct Td {
  ibv_td ibv;
  std::atomic<int> users{0};
};

/// What makes an ibv_pd a parent domain (ibv_alloc_parent_domain(3), parent_domain.cpp):
/// the PD it was made over, its thread domain, and the allocator the queue buffers of its
/// QPs, SRQs and CQs come from (alloc NULL: the heap).
struct ParentDomain {
  ibv_pd* protection = nullptr;
  Td* td = nullptr;
  void* (*alloc)(ibv_pd*, void*, size_t, size_t, uint64_t) = nullptr;
  void (*free)(ibv_pd*, void*, void*, uint64_t) = nullptr;
  void* pd_context = nullptr;
};

/// ibv_pd: a protection domain, or a parent domain (`parent` set) sharing the engine PD of
/// the PD it was made over. The engine PD is shared by the handles ibv_import_pd makes.
struct Pd {
  ibv_pd ibv;
  std::shared_ptr<engine::ProtectionDomain> pd;
  Reservation slot;
  std::optional<ParentDomain> parent;
  /// A parent domain's QPs, SRQs and CQs: ibv_dealloc_pd refuses (EBUSY) while > 0.
  std::atomic<int> handle_users{0};
};

/// ibv_mr: the engine MR is shared by the handles ibv_import_mr makes.
struct Mr {
  ibv_mr ibv;
  std::shared_ptr<engine::MemoryRegion> mr;
  Reservation slot;
};

/// ibv_dm (dm.cpp): an allocation of the engine device's memory.
struct Dm {
  ibv_dm ibv;
  std::shared_ptr<engine::DeviceMemory> dm;  ///< shared by the handles ibv_import_dm made
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
  /// The parent domain of a CQ made with IBV_CQ_INIT_ATTR_MASK_PD (its ring's allocator).
  ibv_pd* parent_domain = nullptr;
  ibv_cq* as_cq() { return reinterpret_cast<ibv_cq*>(&ibv); }
};

struct QpExBuilder;  // qp_ex.cpp: the work requests between ibv_wr_start and ibv_wr_complete

/// ibv_qp, laid out as ibv_qp_ex so the extended post API can share it. The engine QP is
/// shared by the handles of an XRC receive QP (ibv_create_qp_ex, then ibv_open_qp): it
/// lives until the last one is destroyed.
struct Qp {
  ibv_qp_ex ibv;
  std::shared_ptr<engine::QueuePair> qp;
  Reservation slot;
  std::atomic<unsigned> async_reported{0};  // events returned by ibv_get_async_event
  /// Multicast groups the QP is attached to (mcast.cpp): while any, ibv_destroy_qp is EBUSY.
  std::atomic<unsigned> mcast_attached{0};
  /// Set for QPs created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (ibv_qp_to_qp_ex answers them).
  std::unique_ptr<QpExBuilder> ex;
  /// The parent domain the QP was made on (its queues' allocator), whose use it counts.
  ibv_pd* parent_domain = nullptr;
  ibv_qp* as_qp() { return &ibv.qp_base; }
  Qp();
  ~Qp();
};

/// ibv_ah: an engine address handle (ah.cpp).
struct Ah {
  ibv_ah ibv;
  std::unique_ptr<engine::AddressHandle> ah;
  Reservation slot;
};

/// ibv_srq (srq.cpp): a basic or XRC SRQ.
struct Srq {
  ibv_srq ibv;
  std::unique_ptr<engine::SharedReceiveQueue> srq;
  Reservation slot;
  std::atomic<unsigned> async_reported{0};  // SRQ events returned by ibv_get_async_event
  /// The parent domain the SRQ was made on (its queue's allocator), whose use it counts.
  ibv_pd* parent_domain = nullptr;
};

/// What an XRC domain is in this process, shared by every ibv_xrcd opened on it (xrc.cpp):
/// the engine domain, the file it was opened through (ibv_open_xrcd's fd; none for fd -1)
/// and its XRC receive QPs by QPN, for ibv_open_qp.
struct XrcdShared {
  engine::XrcDomain domain;
  bool has_inode = false;
  dev_t st_dev = 0;
  ino_t st_ino = 0;
  std::mutex mu;  // guards tgt_qps
  std::map<uint32_t, std::weak_ptr<engine::QueuePair>> tgt_qps;
};

/// ibv_xrcd: one handle on a shared domain.
struct Xrcd {
  ibv_xrcd ibv;
  std::shared_ptr<XrcdShared> shared;
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
inline Dm* to_dm(ibv_dm* d) {
  return reinterpret_cast<Dm*>(d);
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
inline Ah* to_ah(ibv_ah* a) {
  return reinterpret_cast<Ah*>(a);
}
inline Srq* to_srq(ibv_srq* s) {
  return reinterpret_cast<Srq*>(s);
}
inline Td* to_td(ibv_td* t) {
  return reinterpret_cast<Td*>(t);
}
inline Xrcd* to_xrcd(ibv_xrcd* x) {
  return reinterpret_cast<Xrcd*>(x);
}

}  // namespace softrdma::verbs
