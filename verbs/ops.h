// What the per-object files of verbs/ share: the errno helpers of the C ABI boundary and
// the ops each object file provides for ibv_open_device to place in ibv_context::ops and
// verbs_context (the inline verbs of <infiniband/verbs.h> reach them there).
//
// Conventions kept from rdma-core: functions returning int return 0 or an errno value
// (ibv_modify_qp, ibv_post_*, ibv_dealloc_pd, …) unless their man page says -1/errno
// (ibv_query_gid, ibv_query_pkey, ibv_get_cq_event); functions returning a pointer return
// NULL and set errno.
#pragma once

#include <cerrno>
#include <functional>
#include <memory>
#include <vector>

#include "verbs/objects.h"

namespace softrdma::verbs {

/// An engine Status as the positive errno value the C ABI returns.
inline int err(engine::Status s) {
  return static_cast<int>(s);
}

/// Posts a chain of receive WRs one by one through `post(wr_id, sges, num_sge)` (an engine
/// Status): stops at the first refusal, which `*bad` then names (ibv_post_recv(3),
/// ibv_post_srq_recv). A negative num_sge is EINVAL.
template <class Post>
int post_recv_chain(ibv_recv_wr* wr, ibv_recv_wr** bad, Post&& post) {
  for (ibv_recv_wr* w = wr; w; w = w->next) {
    const engine::Status st = w->num_sge < 0
                                  ? std::errc::invalid_argument
                                  : post(w->wr_id, reinterpret_cast<const engine::Sge*>(w->sg_list),
                                         static_cast<uint32_t>(w->num_sge));
    if (st != engine::kOk) {
      if (bad) *bad = w;
      return err(st);
    }
  }
  return 0;
}

/// Sets errno to `e` and returns NULL: the failure convention of pointer-returning verbs.
template <class T>
T* fail(int e) {
  errno = e;
  return nullptr;
}

// device.cpp: the address of this process's default device — the open one, else SOFTRDMA_ADDR,
// else 127.0.0.1 — which the GUID and the sysfs files describe.
uint32_t device_ip();
// device.cpp: the addresses of the devices ibv_get_device_list lists, srdma0 first
// (device_ip()), then srdma<i> at the i-th SOFTRDMA_ADDR entry — what each device's sysfs
// files describe (verbs/sysfs/tree.h). Stops before a malformed entry.
std::vector<uint32_t> device_ips();

// cq.cpp: the CQ both ibv_create_cq and ibv_create_cq_ex build (checks `cqe` against
// max_cqe and `comp_vector`; EINVAL, ENOMEM at max_cq); `record_times` stamps completions.
// Returns NULL with errno set on failure.
// `parent_domain` (IBV_CQ_INIT_ATTR_MASK_PD) gives the ring its allocator.
Cq* create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel,
              int comp_vector, bool record_times, ibv_pd* parent_domain = nullptr);
// cq.cpp: ibv_context::ops.poll_cq / req_notify_cq (ibv_poll_cq, ibv_req_notify_cq).
int op_poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
int op_req_notify_cq(ibv_cq* cq, int solicited_only);
// cq_ex.cpp: verbs_context::create_cq_ex (ibv_create_cq_ex).
ibv_cq_ex* ctx_create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr);
// cq_ex.cpp: verbs_context::query_rt_values (ibv_query_rt_values_ex), the CQ timestamp clock.
int ctx_query_rt_values(ibv_context* ctx, ibv_values_ex* values);

// qp.cpp: ibv_context::ops.post_send / post_recv and verbs_context::create_qp_ex
// (ibv_create_qp_ex).
int op_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int op_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
ibv_qp* ctx_create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr);
/// qp.cpp: creates a QP of any type from `attr` (comp_mask PD and/or XRCD) on `ctx`; `qpn`
/// non-zero asks for that QPN (EBUSY when taken). NULL with errno: EOPNOTSUPP for a type
/// the engine lacks, EINVAL for objects missing or of another context, ENOMEM at max_qp.
ibv_qp* create_qp(ibv_context* ctx, ibv_qp_init_attr_ex* attr, uint32_t qpn);
/// qp.cpp: a new ibv_qp handle on engine QP `eqp` (a created QP, or one ibv_open_qp opened).
Qp* new_qp_handle(ibv_context* ctx, std::shared_ptr<engine::QueuePair> eqp, void* qp_context,
                  ibv_pd* pd, ibv_cq* scq, ibv_cq* rcq, ibv_srq* srq);

// srq.cpp: ibv_context::ops.post_srq_recv (ibv_post_srq_recv) and verbs_context's
// create_srq_ex / get_srq_num.
int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
ibv_srq* ctx_create_srq_ex(ibv_context* ctx, ibv_srq_init_attr_ex* attr);
int ctx_get_srq_num(ibv_srq* srq, uint32_t* srq_num);

// xrc.cpp: verbs_context's open_xrcd / close_xrcd / open_qp, and the XRC receive QPs a
// domain knows for ibv_open_qp.
ibv_xrcd* ctx_open_xrcd(ibv_context* ctx, ibv_xrcd_init_attr* attr);
int ctx_close_xrcd(ibv_xrcd* xrcd);
ibv_qp* ctx_open_qp(ibv_context* ctx, ibv_qp_open_attr* attr);
void track_xrc_recv_qp(ibv_xrcd* xrcd, const std::shared_ptr<engine::QueuePair>& qp);

// qp_ex.cpp: the extended post API (ibv_wr_*).
/// 0 when `flags` (IBV_QP_EX_WITH_*) are all ops a QP of `type` can post here, else
/// EOPNOTSUPP (TSO, ATOMIC_WRITE, RDMA/atomics on UD, …), as rxe's provider.
int check_send_ops_flags(ibv_qp_type type, uint64_t flags);
/// Makes `q` an ibv_qp_ex: fills its wr_* function pointers (ibv_qp_to_qp_ex answers it).
void enable_qp_ex(Qp* q, uint64_t send_ops_flags);

// mw.cpp: memory windows (ibv_context::ops alloc_mw / dealloc_mw / bind_mw).
ibv_mw* op_alloc_mw(ibv_pd* pd, ibv_mw_type type);
int op_dealloc_mw(ibv_mw* mw);
int op_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind);

/// pd_mr.cpp: a new ibv_mr handle on `pd` (lkey == rkey == the engine MR's key, `addr` and
/// `length` as given) for the engine MR `make` creates once an MR slot is reserved, listed for
/// ibv_import_mr under its handle (the key). NULL with errno ENOMEM at max_mr (make is then
/// not called).
ibv_mr* new_mr_handle(ibv_pd* pd, void* addr, size_t length,
                      const std::function<std::unique_ptr<engine::MemoryRegion>()>& make);

// parent_domain.cpp: thread and parent domains (verbs_context alloc_td / dealloc_td /
// alloc_parent_domain).
ibv_td* ctx_alloc_td(ibv_context* ctx, ibv_td_init_attr* attr);
int ctx_dealloc_td(ibv_td* td);
ibv_pd* ctx_alloc_parent_domain(ibv_context* ctx, ibv_parent_domain_init_attr* attr);
/// ibv_dealloc_pd of a parent domain: EBUSY while QPs, SRQs or CQs made on it exist.
int dealloc_parent_domain(Pd* p);
/// The memory of a queue of `depth` slots of `slot_bytes` made on `pd`: when `pd` is a
/// parent domain with allocators, a buffer of engine::queue_bytes(depth, slot_bytes) from its
/// alloc(pd, pd_context, size, 4096, resource_type) (IBV_ALLOCATOR_USE_DEFAULT: the heap),
/// freed through its free when the queue goes; else `out` stays null (the heap). 0, or
/// ENOMEM when alloc returns NULL.
int queue_memory(ibv_pd* pd, uint32_t depth, size_t slot_bytes, uint64_t resource_type,
                 engine::QueueMemory& out);

// import.cpp: the file behind a context's cmd_fd, and the PDs and MRs it lists by handle for
// ibv_import_pd / ibv_import_mr.
/// A new command file for a context opened on `device` (engine device `dev`): returns its
/// descriptor (a memfd, whose inode names the file for ibv_import_device) and sets `file`;
/// -1 with errno set on failure.
int open_command_file(ibv_device* device, const std::shared_ptr<engine::Device>& dev,
                      std::shared_ptr<CommandFile>& file);
/// Lists `w` (a new Pd, Mr or Dm of `ctx`) in ctx's command file under its handle: a PD is
/// given its handle here, an MR's is its key, a DM's was given at allocation.
/// ibv_dealloc_pd / ibv_dereg_mr / ibv_free_dm unlist it (unpublish).
template <class W>
void publish(ibv_context* ctx, W* w);
/// Unlists `w`'s object (Pd, Mr or Dm): it can no longer be imported.
template <class W>
void unpublish(W* w);
/// The handle `w` (Pd, Mr or Dm) is being unimported: its command file keeps the object when
/// `w` was its last handle (ibv_unimport_pd/mr/dm).
template <class W>
void keep_if_last(W* w);
/// The DM ctx's command file lists under `handle`, or null (ibv_import_dm).
std::shared_ptr<engine::DeviceMemory> find_dm(ibv_context* ctx, uint32_t handle);

// device.cpp: a new ibv_context on `dev` listed as `device`, on command file `file` with
// descriptor `cmd_fd` (ibv_import_device), or on a new one when `file` is null. NULL with
// errno set on failure (`cmd_fd` is then not closed).
ibv_context* new_context(std::shared_ptr<engine::Device> dev, ibv_device* device,
                         std::shared_ptr<CommandFile> file = nullptr, int cmd_fd = -1);

// pd_mr.cpp: verbs_context::advise_mr (ibv_advise_mr).
int ctx_advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list,
                  uint32_t num_sge);

// dm.cpp: device memory (verbs_context alloc_dm / free_dm / reg_dm_mr).
ibv_dm* ctx_alloc_dm(ibv_context* ctx, ibv_alloc_dm_attr* attr);
int ctx_free_dm(ibv_dm* dm);
ibv_mr* ctx_reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t dm_offset, size_t length,
                      unsigned int access);

// async_event.cpp: affiliated asynchronous events.
/// Marks a QP or CQ handle as one events may name (on create) or may no longer name (first
/// thing on destroy; events still queued for it are then skipped).
void async_target_created(const void* object);
void async_target_destroyed(const void* object);
/// Queues `event` on ctx's async_fd; never blocks (a full pipe drops it).
void post_async_event(ibv_context* ctx, const ibv_async_event& event);
/// Blocks until `*completed` (the handle's acked-event count, guarded by `mu`) reaches
/// `reported` (events ibv_get_async_event returned for it): ibv_destroy_* call it so that
/// no event handed to the application names a freed object.
void wait_async_acks(pthread_mutex_t* mu, pthread_cond_t* cond, const uint32_t* completed,
                     const std::atomic<unsigned>& reported);

/// The first step of ibv_destroy_qp / _srq / _cq once the object may go: the handle `h` (an
/// ibv_qp, ibv_srq or ibv_cq, with its libibverbs mutex and cond) stops being an async event
/// target, then waits until the `*completed` acks reach `reported` (wait_async_acks).
template <class Handle>
void stop_async_events(Handle* h, const uint32_t* completed,
                       const std::atomic<unsigned>& reported) {
  async_target_destroyed(h);
  wait_async_acks(&h->mutex, &h->cond, completed, reported);
}

/// The last step of ibv_destroy_qp / _srq / _cq: destroys the mutex and cond of `h` (the
/// wrapper's ibv_qp, ibv_srq or ibv_cq), deletes the wrapper `w` (its queue buffers go back to its
/// parent domain's free first) and then drops its use of the parent domain, if any (ibv_dealloc_pd
/// of a parent domain is EBUSY until then).
template <class Wrapper, class Handle>
void delete_handle(Wrapper* w, Handle* h) {
  pthread_mutex_destroy(&h->mutex);
  pthread_cond_destroy(&h->cond);
  ibv_pd* parent = w->parent_domain;
  delete w;
  if (parent) to_pd(parent)->handle_users--;
}

}  // namespace softrdma::verbs
