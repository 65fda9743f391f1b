// The extended post API (rdma-core 44 <infiniband/verbs.h>, man ibv_wr_post(3)): a QP created
// by ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS is an ibv_qp_ex whose function
// pointers build work requests between ibv_wr_start and ibv_wr_complete:
//   ibv_wr_start(qp);
//   qp->wr_id = …; qp->wr_flags = IBV_SEND_SIGNALED;
//   ibv_wr_rdma_write(qp, rkey, remote_addr);   // opens a WR (wr_id, wr_flags taken now)
//   ibv_wr_set_sge(qp, lkey, addr, length);     // completes its data
//   … more WRs …
//   ret = ibv_wr_complete(qp);                  // posts them all, or none
// Each WR is built as the ibv_send_wr ibv_post_send would take (opcode, wr.rdma/atomic/ud,
// qp_type.xrc, bind_mw, invalidate_rkey, sg_list) and wr_complete hands the list to the same
// op_post_send, so both APIs reach the engine through one conversion and the work-request
// table's rows. The data setters fill the WR opened last; SGE lists and inline data are copied
// when set (the caller may reuse its arrays and buffers at once, as on mlx5).
//
// Errors, as rxe's provider: send_ops_flags beyond what the QP type supports → EOPNOTSUPP at
// create; inline data beyond max_inline_data, more SGEs than max_send_sge, or a setter with no
// WR open → ENOSPC / EINVAL recorded and returned by wr_complete, which then posts nothing; an
// opcode the QP was not created with → EOPNOTSUPP from wr_complete. wr_complete otherwise
// returns what ibv_post_send would (EINVAL, ENOMEM for a full SQ, …); WRs before the failing
// one are then posted, as ibv_post_send posts the WRs before *bad_wr.
#include <cstring>
#include <mutex>
#include <vector>

#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace softrdma::verbs {

/// The WRs of one ibv_wr_start … ibv_wr_complete sequence.
struct QpExBuilder {
  uint64_t send_ops = 0;  ///< IBV_QP_EX_WITH_* the QP was created with
  std::mutex mu;          ///< held from wr_start to wr_complete / wr_abort
  std::vector<ibv_send_wr> wrs;
  /// SGEs of each WR: [first, first + count) of `sges`, linked at wr_complete (the vectors
  /// may move while WRs are added).
  struct Span {
    size_t first = 0, count = 0;
  };
  std::vector<Span> spans;
  std::vector<ibv_sge> sges;
  /// Inline data copied by wr_set_inline_data(_list): SGEs over `inline_bytes` carry offsets
  /// until wr_complete turns them into addresses.
  std::vector<uint8_t> inline_bytes;
  std::vector<bool> inline_wr;
  int error = 0;  ///< first error a builder call recorded; wr_complete returns it
  void clear() {
    wrs.clear();
    spans.clear();
    sges.clear();
    inline_bytes.clear();
    inline_wr.clear();
    error = 0;
  }
};

}  // namespace softrdma::verbs

Qp::Qp() : ibv{} {}
Qp::~Qp() = default;

namespace {

QpExBuilder& builder(ibv_qp_ex* qx) {
  return *reinterpret_cast<Qp*>(qx)->ex;
}

void record(QpExBuilder& b, int e) {
  if (!b.error) b.error = e;
}

/// Opens a WR of `opcode` carrying the qp_ex's wr_id and wr_flags, if the QP was created
/// with `op_flag`; nullptr (and an error for wr_complete) otherwise.
ibv_send_wr* open_wr(ibv_qp_ex* qx, ibv_wr_opcode opcode, uint64_t op_flag) {
  QpExBuilder& b = builder(qx);
  if (!(b.send_ops & op_flag)) {
    record(b, EOPNOTSUPP);
    return nullptr;
  }
  ibv_send_wr& w = b.wrs.emplace_back();
  w = ibv_send_wr{};
  w.wr_id = qx->wr_id;
  w.send_flags = qx->wr_flags;
  w.opcode = opcode;
  b.spans.push_back({b.sges.size(), 0});
  b.inline_wr.push_back(false);
  return &w;
}

/// The WR the data setters apply to (the one opened last); nullptr and EINVAL when none.
ibv_send_wr* current_wr(ibv_qp_ex* qx) {
  QpExBuilder& b = builder(qx);
  if (b.wrs.empty()) {
    record(b, EINVAL);
    return nullptr;
  }
  return &b.wrs.back();
}

void wr_rdma_write(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr) {
  if (ibv_send_wr* w = open_wr(qx, IBV_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE))
    w->wr.rdma = {addr, rkey};
}
void wr_rdma_write_imm(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, __be32 imm) {
  if (ibv_send_wr* w =
          open_wr(qx, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)) {
    w->wr.rdma = {addr, rkey};
    w->imm_data = imm;
  }
}
void wr_rdma_read(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr) {
  if (ibv_send_wr* w = open_wr(qx, IBV_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ))
    w->wr.rdma = {addr, rkey};
}
void wr_send(ibv_qp_ex* qx) {
  open_wr(qx, IBV_WR_SEND, IBV_QP_EX_WITH_SEND);
}
void wr_send_imm(ibv_qp_ex* qx, __be32 imm) {
  if (ibv_send_wr* w = open_wr(qx, IBV_WR_SEND_WITH_IMM, IBV_QP_EX_WITH_SEND_WITH_IMM))
    w->imm_data = imm;
}
void wr_send_inv(ibv_qp_ex* qx, uint32_t invalidate_rkey) {
  if (ibv_send_wr* w = open_wr(qx, IBV_WR_SEND_WITH_INV, IBV_QP_EX_WITH_SEND_WITH_INV))
    w->invalidate_rkey = invalidate_rkey;
}
void wr_atomic_cmp_swp(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, uint64_t compare,
                       uint64_t swap) {
  if (ibv_send_wr* w = open_wr(qx, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)) {
    w->wr.atomic.remote_addr = addr;
    w->wr.atomic.rkey = rkey;
    w->wr.atomic.compare_add = compare;
    w->wr.atomic.swap = swap;
  }
}
void wr_atomic_fetch_add(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, uint64_t add) {
  if (ibv_send_wr* w =
          open_wr(qx, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)) {
    w->wr.atomic.remote_addr = addr;
    w->wr.atomic.rkey = rkey;
    w->wr.atomic.compare_add = add;
  }
}
void wr_local_inv(ibv_qp_ex* qx, uint32_t invalidate_rkey) {
  if (ibv_send_wr* w = open_wr(qx, IBV_WR_LOCAL_INV, IBV_QP_EX_WITH_LOCAL_INV))
    w->invalidate_rkey = invalidate_rkey;
}
void wr_bind_mw(ibv_qp_ex* qx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  ibv_send_wr* w = open_wr(qx, IBV_WR_BIND_MW, IBV_QP_EX_WITH_BIND_MW);
  if (!w) return;
  if (!mw || !info || (!info->mr && (info->addr || info->length))) {
    record(builder(qx), EINVAL);  // as ibv_bind_mw's own checks
    return;
  }
  w->bind_mw.mw = mw;
  w->bind_mw.rkey = rkey;
  w->bind_mw.bind_info = *info;
}
void wr_send_tso(ibv_qp_ex* qx, void*, uint16_t, uint16_t) {
  record(builder(qx), EOPNOTSUPP);  // never in send_ops_flags: create refuses IBV_QP_EX_WITH_TSO
}

// UD and XRC addressing: the fields ibv_post_send reads for those QP types.
void wr_set_ud_addr(ibv_qp_ex* qx, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  if (ibv_send_wr* w = current_wr(qx)) w->wr.ud = {ah, remote_qpn, remote_qkey};
}
void wr_set_xrc_srqn(ibv_qp_ex* qx, uint32_t remote_srqn) {
  if (ibv_send_wr* w = current_wr(qx)) w->qp_type.xrc.remote_srqn = remote_srqn;
}

void set_sges(ibv_qp_ex* qx, size_t n, const ibv_sge* list) {
  ibv_send_wr* w = current_wr(qx);
  if (!w) return;
  QpExBuilder& b = builder(qx);
  if (n > reinterpret_cast<Qp*>(qx)->qp->cap.max_send_sge) {
    record(b, EINVAL);
    return;
  }
  QpExBuilder::Span& s = b.spans.back();
  b.sges.resize(s.first);  // a second setter call replaces the first's data
  b.sges.insert(b.sges.end(), list, list + n);
  s.count = n;
  b.inline_wr.back() = false;
  w->send_flags &= ~unsigned(IBV_SEND_INLINE);
}
void wr_set_sge(ibv_qp_ex* qx, uint32_t lkey, uint64_t addr, uint32_t length) {
  const ibv_sge s{addr, length, lkey};
  set_sges(qx, 1, &s);
}
void wr_set_sge_list(ibv_qp_ex* qx, size_t n, const ibv_sge* list) {
  set_sges(qx, n, list);
}

/// Makes `bufs` (`total` bytes) the data of the WR opened last, copied now, IBV_SEND_INLINE.
void copy_inline(QpExBuilder& b, ibv_send_wr* w, size_t n, const ibv_data_buf* bufs, size_t total) {
  // One SGE over the copy (addr holds its offset in inline_bytes until wr_complete).
  QpExBuilder::Span& s = b.spans.back();
  b.sges.resize(s.first);
  const size_t at = b.inline_bytes.size();
  for (size_t i = 0; i < n; ++i) {
    const auto* p = static_cast<const uint8_t*>(bufs[i].addr);
    if (bufs[i].length) b.inline_bytes.insert(b.inline_bytes.end(), p, p + bufs[i].length);
  }
  b.sges.push_back({at, static_cast<uint32_t>(total), 0});
  s.count = 1;
  b.inline_wr.back() = true;
  w->send_flags |= IBV_SEND_INLINE;
}

void set_inline(ibv_qp_ex* qx, size_t n, const ibv_data_buf* bufs) {
  ibv_send_wr* w = current_wr(qx);
  if (!w) return;
  QpExBuilder& b = builder(qx);
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += bufs[i].length;
  if (total > reinterpret_cast<Qp*>(qx)->qp->cap.max_inline_data) {
    record(b, ENOSPC);  // rxe: the data does not fit the WQE
    return;
  }
  copy_inline(b, w, n, bufs, total);
}

/// ibv_wr_atomic_write(3) (rdma-core 44): RDMA ATOMIC WRITE of the 8 bytes at `atomic_wr` to
/// `addr` (8-byte aligned, else the responder NAKs it: IBV_WC_REM_INV_REQ_ERR) of R_Key
/// `rkey`, which needs IBV_ACCESS_REMOTE_WRITE. The bytes are copied now and carried in the
/// WQE (as rxe's wqe->dma.atomic_wr), whatever max_inline_data; no SGE setter follows.
void wr_atomic_write(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, const void* atomic_wr) {
  ibv_send_wr* w = open_wr(qx, IBV_WR_ATOMIC_WRITE, IBV_QP_EX_WITH_ATOMIC_WRITE);
  if (!w) return;
  if (!atomic_wr) {
    record(builder(qx), EINVAL);
    return;
  }
  w->wr.rdma = {addr, rkey};
  const ibv_data_buf value{const_cast<void*>(atomic_wr), 8};
  copy_inline(builder(qx), w, 1, &value, value.length);
}
void wr_set_inline_data(ibv_qp_ex* qx, void* addr, size_t length) {
  const ibv_data_buf buf{addr, length};
  set_inline(qx, 1, &buf);
}
void wr_set_inline_data_list(ibv_qp_ex* qx, size_t n, const ibv_data_buf* bufs) {
  set_inline(qx, n, bufs);
}

void wr_start(ibv_qp_ex* qx) {
  QpExBuilder& b = builder(qx);
  b.mu.lock();
  b.clear();
}

void wr_abort(ibv_qp_ex* qx) {
  QpExBuilder& b = builder(qx);
  b.clear();
  b.mu.unlock();
}

int wr_complete(ibv_qp_ex* qx) {
  QpExBuilder& b = builder(qx);
  int rc = b.error;
  if (!rc && !b.wrs.empty()) {
    for (size_t i = 0; i < b.wrs.size(); ++i) {
      ibv_send_wr& w = b.wrs[i];
      const QpExBuilder::Span& s = b.spans[i];
      if (b.inline_wr[i]) {
        ibv_sge& g = b.sges[s.first];
        g.addr = reinterpret_cast<uintptr_t>(b.inline_bytes.data()) + g.addr;
      }
      w.sg_list = s.count ? &b.sges[s.first] : nullptr;
      w.num_sge = static_cast<int>(s.count);
      w.next = i + 1 < b.wrs.size() ? &b.wrs[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    rc = op_post_send(&qx->qp_base, b.wrs.data(), &bad);
  }
  b.clear();
  b.mu.unlock();
  return rc;
}

}  // namespace

namespace softrdma::verbs {

int check_send_ops_flags(ibv_qp_type type, uint64_t flags) {
  constexpr uint64_t kUd = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  // UC has no SEND with invalidate opcode (IBTA table 38), UD only SENDs.
  constexpr uint64_t kUc = kUd | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                           IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
  constexpr uint64_t kXrc = kUc | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV;
  // RDMA ATOMIC WRITE: RC only, as in rxe (IBTA rel. 1.5 gives XRC one too; not implemented).
  constexpr uint64_t kRc = kXrc | IBV_QP_EX_WITH_ATOMIC_WRITE;
  uint64_t supported = 0;
  switch (type) {
    case IBV_QPT_RC:
      supported = kRc;
      break;
    case IBV_QPT_XRC_SEND:
      supported = kXrc;
      break;
    case IBV_QPT_UC:
      supported = kUc;
      break;
    case IBV_QPT_UD:
      supported = kUd;
      break;
    default:
      break;
  }
  return (flags & ~supported) ? EOPNOTSUPP : 0;
}

void enable_qp_ex(Qp* q, uint64_t send_ops_flags) {
  q->ex = std::make_unique<QpExBuilder>();
  q->ex->send_ops = send_ops_flags;
  ibv_qp_ex& x = q->ibv;
  x.comp_mask = 0;
  x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  x.wr_bind_mw = wr_bind_mw;
  x.wr_local_inv = wr_local_inv;
  x.wr_rdma_read = wr_rdma_read;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_send_inv = wr_send_inv;
  x.wr_send_tso = wr_send_tso;
  x.wr_set_ud_addr = wr_set_ud_addr;
  x.wr_set_xrc_srqn = wr_set_xrc_srqn;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_atomic_write = wr_atomic_write;
}

}  // namespace softrdma::verbs

extern "C" {

/// ibv_qp_to_qp_ex(3): the ibv_qp_ex of a QP created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
/// NULL for any other QP (as libibverbs, which checks VERBS_QP_EX).
ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  if (!qp) return nullptr;
  Qp* q = to_qp(qp);
  return q->ex ? &q->ibv : nullptr;
}

}  // extern "C"
