// ibv_cq_ex: the extended CQ (ibv_create_cq_ex through verbs_context::create_cq_ex) and its
// poll API — ibv_start_poll / ibv_next_poll / ibv_end_poll and the ibv_wc_read_* accessors,
// function pointers in struct ibv_cq_ex that the provider fills (rdma-core 44
// <infiniband/verbs.h>, man ibv_create_cq_ex(3)). The same CQ also answers ibv_poll_cq.
//
// Completion timestamps: read_completion_ts is the engine's clock in ns (base/clock.h:
// CLOCK_MONOTONIC, divided by K under time dilation), so the "HCA clock"
// runs at 1 GHz (ibv_query_device_ex: hca_core_clock = 1,000,000 kHz, and
// ibv_query_rt_values_ex's raw_clock reads the same clock); read_completion_wallclock_ns is
// CLOCK_REALTIME in ns (dilated alike). Both are taken when the engine queues the CQE.
#include <time.h>

#include "base/clock.h"
#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

/// wc_flags softrdma can fill, as rxe (RXE supports the standard flags and both timestamps):
/// CVLAN, FLOW_TAG and TM_INFO are EOPNOTSUPP.
constexpr uint64_t kSupportedWcFlags = uint64_t{IBV_WC_STANDARD_FLAGS} |
                                       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

Cq* of(ibv_cq_ex* cq) {
  return reinterpret_cast<Cq*>(cq);
}

/// Takes the next CQE into `current` and publishes wr_id/status; 0, ENOENT when the CQ is
/// empty, EOVERFLOW after a CQ overrun (where ibv_poll_cq returns -1).
int take_next(Cq* c) {
  const int got = c->cq->poll(1, &c->current, &c->current_time);
  if (got < 0) return EOVERFLOW;
  if (got == 0) return ENOENT;
  c->ibv.wr_id = c->current.wr_id;
  c->ibv.status = static_cast<ibv_wc_status>(c->current.status);
  return 0;
}

int start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;  // no poll attributes are defined
  Cq* c = of(cq);
  if (!c->single_threaded) c->poll_mu.lock();
  const int rc = take_next(c);
  // As rdma-core providers: the lock is held only while a poll cycle is open, i.e. after
  // start_poll returned 0 and until end_poll.
  if (rc != 0 && !c->single_threaded) c->poll_mu.unlock();
  return rc;
}

int next_poll(ibv_cq_ex* cq) {
  return take_next(of(cq));
}

void end_poll(ibv_cq_ex* cq) {
  Cq* c = of(cq);
  if (!c->single_threaded) c->poll_mu.unlock();
}

ibv_wc_opcode read_opcode(ibv_cq_ex* cq) {
  return static_cast<ibv_wc_opcode>(of(cq)->current.opcode);
}
uint32_t read_vendor_err(ibv_cq_ex* cq) {
  return of(cq)->current.vendor_err;
}
uint32_t read_byte_len(ibv_cq_ex* cq) {
  return of(cq)->current.byte_len;
}
__be32 read_imm_data(ibv_cq_ex* cq) {
  return of(cq)->current.imm_be;
}
uint32_t read_qp_num(ibv_cq_ex* cq) {
  return of(cq)->current.qp_num;
}
uint32_t read_src_qp(ibv_cq_ex* cq) {
  return of(cq)->current.src_qp;
}
unsigned int read_wc_flags(ibv_cq_ex* cq) {
  return of(cq)->current.wc_flags;
}
// RoCE has no LIDs or path bits (IBTA annex A17): 0, as rxe reports in ibv_wc. The SL is
// what ibv_wc.sl has: 0, or on a UD receive the packet type a ConnectX reports there
// (engine::ud::kSlRoceV2Ipv4).
uint32_t read_slid(ibv_cq_ex*) {
  return 0;
}
uint8_t read_sl(ibv_cq_ex* cq) {
  return of(cq)->current.sl;
}
uint8_t read_dlid_path_bits(ibv_cq_ex*) {
  return 0;
}
uint64_t read_completion_ts(ibv_cq_ex* cq) {
  return of(cq)->current_time.monotonic_ns;
}
uint64_t read_completion_wallclock_ns(ibv_cq_ex* cq) {
  return of(cq)->current_time.realtime_ns;
}

}  // namespace

namespace softrdma::verbs {

/// verbs_context::create_cq_ex. Errors (NULL, errno): EINVAL for a bad cqe/comp_vector, a
/// missing attr, or IBV_CQ_INIT_ATTR_MASK_PD with no parent domain (a plain PD, one of
/// another context: mlx5_create_cq refuses the same); EOPNOTSUPP for wc_flags outside
/// kSupportedWcFlags or create flags other than SINGLE_THREADED; ENOMEM at max_cq or when
/// the parent domain's allocator returns NULL.
/// Accessors for flags not requested are left NULL, as providers leave them.
ibv_cq_ex* ctx_create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr) {
  if (!ctx || !attr) return fail<ibv_cq_ex>(EINVAL);
  if (attr->wc_flags & ~kSupportedWcFlags) return fail<ibv_cq_ex>(EOPNOTSUPP);
  if (attr->comp_mask & ~uint32_t(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
    return fail<ibv_cq_ex>(EOPNOTSUPP);
  ibv_pd* parent = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) ? attr->parent_domain : nullptr;
  if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) &&
      (!parent || parent->context != ctx || !to_pd(parent)->parent))
    return fail<ibv_cq_ex>(EINVAL);
  const uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
  if (flags & ~uint32_t(IBV_CREATE_CQ_ATTR_SINGLE_THREADED)) return fail<ibv_cq_ex>(EOPNOTSUPP);
  if (attr->cqe > uint32_t(INT32_MAX) || attr->comp_vector > uint32_t(INT32_MAX))
    return fail<ibv_cq_ex>(EINVAL);
  const bool times = attr->wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
  Cq* c = create_cq(ctx, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                    static_cast<int>(attr->comp_vector), times, parent);
  if (!c) return nullptr;
  c->single_threaded = flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
  ibv_cq_ex& x = c->ibv;
  x.comp_mask = 0;
  x.start_poll = start_poll;
  x.next_poll = next_poll;
  x.end_poll = end_poll;
  x.read_opcode = read_opcode;
  x.read_vendor_err = read_vendor_err;
  x.read_byte_len = read_byte_len;
  x.read_imm_data = read_imm_data;
  x.read_qp_num = read_qp_num;
  x.read_src_qp = read_src_qp;
  x.read_wc_flags = read_wc_flags;
  x.read_slid = read_slid;
  x.read_sl = read_sl;
  x.read_dlid_path_bits = read_dlid_path_bits;
  if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
    x.read_completion_ts = read_completion_ts;
  if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
    x.read_completion_wallclock_ns = read_completion_wallclock_ns;
  return &x;
}

/// verbs_context::query_rt_values (ibv_query_rt_values_ex): raw_clock is the clock of
/// read_completion_ts (clock::now_ns()). EINVAL for a NULL values, EOPNOTSUPP for mask bits
/// other than IBV_VALUES_MASK_RAW_CLOCK.
int ctx_query_rt_values(ibv_context*, ibv_values_ex* values) {
  if (!values) return EINVAL;
  if (values->comp_mask & ~uint32_t(IBV_VALUES_MASK_RAW_CLOCK)) return EOPNOTSUPP;
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    const uint64_t t = clock::now_ns();
    values->raw_clock.tv_sec = static_cast<time_t>(t / 1'000'000'000);
    values->raw_clock.tv_nsec = static_cast<long>(t % 1'000'000'000);
  }
  return 0;
}

}  // namespace softrdma::verbs
