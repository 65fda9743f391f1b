// Single-process tests of parent and thread domains (ibv_alloc_parent_domain(3),
// ibv_alloc_td(3)) and of importing a context, PD and MR within a process
// (ibv_import_device(3), ibv_import_pd(3), ibv_import_mr(3)): the allocator is asked for
// each queue's buffer with its resource type, the queues really live there and go back
// through free; QPs made on a parent domain carry traffic; an imported PD and MR carry
// traffic and unimporting them leaves the originals working; errors as mlx5 and
// libibverbs give them.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "verbs/softrdma_private.h"
#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

/// What a parent domain's allocator was asked for and gave back.
struct AllocatorLog {
  struct Block {
    void* ptr;
    size_t size;
    size_t alignment;
    uint64_t type;
    ibv_pd* pd;
  };
  std::vector<Block> allocated;
  std::vector<std::pair<void*, uint64_t>> freed;
  bool use_default = false;  // answer IBV_ALLOCATOR_USE_DEFAULT
  bool refuse = false;       // answer NULL

  /// The live blocks of `type`.
  std::vector<Block> of(uint64_t type) const {
    std::vector<Block> r;
    for (const Block& b : allocated)
      if (b.type == type) r.push_back(b);
    return r;
  }
};

constexpr uint8_t kFill = 0xA5;  // what a fresh block holds

void* log_alloc(ibv_pd* pd, void* pd_context, size_t size, size_t alignment, uint64_t type) {
  auto* log = static_cast<AllocatorLog*>(pd_context);
  if (log->refuse) return nullptr;
  if (log->use_default) {
    log->allocated.push_back({IBV_ALLOCATOR_USE_DEFAULT, size, alignment, type, pd});
    return IBV_ALLOCATOR_USE_DEFAULT;
  }
  void* p = nullptr;
  if (posix_memalign(&p, alignment, size) != 0) return nullptr;
  std::memset(p, kFill, size);
  log->allocated.push_back({p, size, alignment, type, pd});
  return p;
}

void log_free(ibv_pd*, void* pd_context, void* ptr, uint64_t type) {
  static_cast<AllocatorLog*>(pd_context)->freed.emplace_back(ptr, type);
  std::free(ptr);
}

/// Whether the 8 bytes of `v` occur in [p, p + n).
bool contains(const void* p, size_t n, uint64_t v) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i + sizeof v <= n; ++i)
    if (std::memcmp(b + i, &v, sizeof v) == 0) return true;
  return false;
}

class ParentDomain : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(open_device(d)); }
  void TearDown() override { close_device(d); }

  /// A parent domain over d.pd with the logging allocator (none when `log` is null).
  ibv_pd* make_parent(AllocatorLog* log, ibv_td* td = nullptr) {
    ibv_parent_domain_init_attr a{};
    a.pd = d.pd;
    a.td = td;
    if (log) {
      a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
      a.alloc = log_alloc;
      a.free = log_free;
      a.pd_context = log;
    }
    return ibv_alloc_parent_domain(d.ctx, &a);
  }

  /// An extended CQ of `cqe` entries whose ring comes from `parent`.
  ibv_cq* make_cq(ibv_pd* parent, uint32_t cqe) {
    ibv_cq_init_attr_ex a{};
    a.cqe = cqe;
    a.wc_flags = IBV_WC_STANDARD_FLAGS;
    a.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    a.parent_domain = parent;
    ibv_cq_ex* cq = ibv_create_cq_ex(d.ctx, &a);
    return cq ? ibv_cq_ex_to_cq(cq) : nullptr;
  }

  /// SENDs, then an RDMA WRITE, between two QPs of `pd` (d.pd or a parent domain over it),
  /// with `send_id` as the first SEND's wr_id and `recv_id` as its receive's.
  void traffic(ibv_pd* pd, uint64_t send_id, uint64_t recv_id, Endpoint* keep_a = nullptr) {
    ibv_pd* saved = d.pd;
    d.pd = pd;
    Endpoint a, b;
    ConnOptions o;
    o.max_send_wr = 32;
    o.max_recv_wr = 32;
    o.cq_depth = 64;
    const bool connected = connect_pair(d, o, a, b);
    d.pd = saved;
    ASSERT_TRUE(connected);
    Buffer src(8192), dst(8192);
    fill_pattern(src.data(), src.size(), 7);
    // One MR on the parent domain, one on the PD it was made over: both work with its QPs.
    ibv_mr* smr = ibv_reg_mr(pd, src.data(), src.size(), kAllAccess);
    ibv_mr* dmr = ibv_reg_mr(d.pd, dst.data(), dst.size(), kAllAccess);
    ASSERT_NE(nullptr, smr);
    ASSERT_NE(nullptr, dmr);
    for (uint64_t i = 0; i < 4; ++i) {
      ASSERT_EQ(0, post_recv(b.qp, recv_id + i, dst.data() + 1024 * i, 1024, dmr->lkey));
      ASSERT_EQ(0,
                post_send(a.qp, IBV_WR_SEND, send_id + i, src.data() + 1024 * i, 1024, smr->lkey));
      poll_success(a.scq, send_id + i, IBV_WC_SEND);
      poll_success(b.rcq, recv_id + i, IBV_WC_RECV);
    }
    ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_WRITE, 99, src.data() + 4096, 4096, smr->lkey,
                           dst.addr() + 4096, dmr->rkey));
    poll_success(a.scq, 99, IBV_WC_RDMA_WRITE);
    EXPECT_TRUE(SameBytes(src.data(), dst.data(), dst.size()));
    EXPECT_EQ(0, ibv_dereg_mr(smr));
    EXPECT_EQ(0, ibv_dereg_mr(dmr));
    if (keep_a) {
      *keep_a = a;
    } else {
      destroy_endpoint(a);
    }
    destroy_endpoint(b);
  }

  Device d;
};

TEST_F(ParentDomain, AllocatorGivesEveryQueueItsBufferWhichHoldsTheQueue) {
  AllocatorLog log;
  ibv_pd* pd = make_parent(&log);
  ASSERT_NE(nullptr, pd) << strerror(errno);
  EXPECT_EQ(d.ctx, pd->context);
  EXPECT_TRUE(log.allocated.empty());  // nothing is asked for before a queue is made

  ibv_cq* cq = make_cq(pd, 64);
  ASSERT_NE(nullptr, cq) << strerror(errno);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  ASSERT_NE(nullptr, srq) << strerror(errno);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {32, 8, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(nullptr, qp) << strerror(errno);
  EXPECT_EQ(pd, qp->pd);
  // A QP with an SRQ has no receive queue of its own: only an SQ buffer.
  ibv_qp_init_attr qs = qa;
  qs.srq = srq;
  ibv_qp* qp_srq = ibv_create_qp(pd, &qs);
  ASSERT_NE(nullptr, qp_srq) << strerror(errno);

  ASSERT_EQ(1u, log.of(SOFTRDMADV_RES_TYPE_CQ).size());
  ASSERT_EQ(1u, log.of(SOFTRDMADV_RES_TYPE_SRQ).size());
  ASSERT_EQ(2u, log.of(SOFTRDMADV_RES_TYPE_SQ).size());
  ASSERT_EQ(1u, log.of(SOFTRDMADV_RES_TYPE_RQ).size());
  ASSERT_EQ(5u, log.allocated.size());
  for (const auto& b : log.allocated) {
    EXPECT_EQ(pd, b.pd);
    EXPECT_EQ(4096u, b.alignment);
  }
  // Sizes follow the depth: 64 CQEs, 16 SRQ WQEs, 32 send and 8 receive WQEs, each slot
  // at least as large as what the verbs structs carry.
  EXPECT_GE(log.of(SOFTRDMADV_RES_TYPE_CQ)[0].size, 64 * sizeof(uint64_t) * 3);
  EXPECT_GE(log.of(SOFTRDMADV_RES_TYPE_SQ)[0].size, 32 * sizeof(ibv_sge));
  EXPECT_GT(log.of(SOFTRDMADV_RES_TYPE_SQ)[0].size, log.of(SOFTRDMADV_RES_TYPE_RQ)[0].size);
  EXPECT_GT(log.of(SOFTRDMADV_RES_TYPE_SRQ)[0].size, log.of(SOFTRDMADV_RES_TYPE_RQ)[0].size);

  // The WQEs posted are kept in those buffers: their wr_id is found there.
  Buffer buf(4096);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  constexpr uint64_t kRecvId = 0x5152535455565758, kSrqId = 0x6162636465666768;
  ASSERT_EQ(0, modify_to_init(qp, ConnOptions{}));  // receives are posted from INIT on
  ASSERT_EQ(0, post_recv(qp, kRecvId, buf.data(), 64, mr->lkey));
  ibv_sge sge{buf.addr(), 64, mr->lkey};
  ibv_recv_wr rw{};
  rw.wr_id = kSrqId;
  rw.sg_list = &sge;
  rw.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(0, ibv_post_srq_recv(srq, &rw, &bad));
  const auto rq = log.of(SOFTRDMADV_RES_TYPE_RQ)[0];
  const auto srqb = log.of(SOFTRDMADV_RES_TYPE_SRQ)[0];
  EXPECT_TRUE(contains(rq.ptr, rq.size, kRecvId));
  EXPECT_TRUE(contains(srqb.ptr, srqb.size, kSrqId));
  EXPECT_FALSE(contains(rq.ptr, rq.size, kSrqId));

  // Destroying returns each buffer through free, with its type, and nothing else.
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(pd));  // QPs, an SRQ and a CQ are made on it
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  EXPECT_EQ(0, ibv_destroy_qp(qp));
  EXPECT_EQ(0, ibv_destroy_qp(qp_srq));
  EXPECT_EQ(0, ibv_destroy_srq(srq));
  EXPECT_EQ(0, ibv_destroy_cq(cq));
  ASSERT_EQ(log.allocated.size(), log.freed.size());
  for (const auto& b : log.allocated) {
    bool found = false;
    for (const auto& [p, t] : log.freed) found |= p == b.ptr && t == b.type;
    EXPECT_TRUE(found) << b.ptr;
  }
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
}

TEST_F(ParentDomain, CqRingHoldsTheCompletionsOfTrafficOverItsQps) {
  AllocatorLog log;
  ibv_pd* pd = make_parent(&log);
  ASSERT_NE(nullptr, pd);
  constexpr uint64_t kSendId = 0x7172737475767700, kRecvId = 0x0102030405060700;
  // harness endpoints make their CQs with ibv_create_cq (no parent domain); the QPs' queues
  // come from the allocator.
  traffic(pd, kSendId, kRecvId);
  ASSERT_EQ(2u, log.of(SOFTRDMADV_RES_TYPE_SQ).size());
  EXPECT_EQ(log.allocated.size(), log.freed.size());

  // A CQ made on the parent domain keeps its CQEs in the buffer.
  ibv_cq* cq = make_cq(pd, 16);
  ASSERT_NE(nullptr, cq);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(nullptr, qp);
  // RESET → ERR flushes a posted receive into the CQ: its wr_id lands in the ring.
  Buffer buf(4096);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  ConnOptions o;
  ASSERT_EQ(0, modify_to_init(qp, o));
  ASSERT_EQ(0, post_recv(qp, kRecvId, buf.data(), 64, mr->lkey));
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(0, ibv_modify_qp(qp, &err, IBV_QP_STATE));
  const auto ring = log.of(SOFTRDMADV_RES_TYPE_CQ).back();
  ibv_wc wc{};
  ASSERT_TRUE(try_poll_one(cq, wc));
  EXPECT_EQ(kRecvId, wc.wr_id);
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status);
  EXPECT_TRUE(contains(ring.ptr, ring.size, kRecvId));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  EXPECT_EQ(0, ibv_destroy_qp(qp));
  EXPECT_EQ(0, ibv_destroy_cq(cq));
  EXPECT_EQ(log.allocated.size(), log.freed.size());
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
}

TEST_F(ParentDomain, UseDefaultAnswerPutsQueuesOnTheHeapAndNeverCallsFree) {
  AllocatorLog log;
  log.use_default = true;
  ibv_pd* pd = make_parent(&log);
  ASSERT_NE(nullptr, pd);
  traffic(pd, 1000, 2000);
  EXPECT_EQ(2u, log.of(SOFTRDMADV_RES_TYPE_SQ).size());
  EXPECT_EQ(2u, log.of(SOFTRDMADV_RES_TYPE_RQ).size());
  EXPECT_TRUE(log.freed.empty());  // free is only for blocks the allocator gave
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
}

TEST_F(ParentDomain, WithoutAllocatorsQueuesAreTheProvidersOwn) {
  ibv_pd* pd = make_parent(nullptr);
  ASSERT_NE(nullptr, pd);
  traffic(pd, 1, 100);
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
}

TEST_F(ParentDomain, AllocatorReturningNullFailsTheCreateWithEnomem) {
  AllocatorLog log;
  log.refuse = true;
  ibv_pd* pd = make_parent(&log);
  ASSERT_NE(nullptr, pd);
  errno = 0;
  EXPECT_EQ(nullptr, make_cq(pd, 16));
  EXPECT_EQ(ENOMEM, errno);
  ibv_cq* cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(nullptr, cq);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {4, 4, 1, 1, 0};
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_qp(pd, &qa));
  EXPECT_EQ(ENOMEM, errno);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_srq(pd, &sa));
  EXPECT_EQ(ENOMEM, errno);
  EXPECT_EQ(0, ibv_destroy_cq(cq));
  EXPECT_EQ(0, ibv_dealloc_pd(pd));  // the failed creates left no use behind
}

TEST_F(ParentDomain, BusyAndInvalidCasesAsMlx5) {
  ibv_td_init_attr ta{};
  ta.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_td(d.ctx, &ta));
  EXPECT_EQ(EINVAL, errno);
  ta.comp_mask = 0;
  ibv_td* td = ibv_alloc_td(d.ctx, &ta);
  ASSERT_NE(nullptr, td);
  EXPECT_EQ(d.ctx, td->context);

  ibv_parent_domain_init_attr a{};
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_parent_domain(d.ctx, &a));  // no PD
  EXPECT_EQ(EINVAL, errno);
  a.pd = d.pd;
  a.comp_mask = 1u << 5;  // unknown
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_parent_domain(d.ctx, &a));
  EXPECT_EQ(EINVAL, errno);
  a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;  // without the callbacks
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_parent_domain(d.ctx, &a));
  EXPECT_EQ(EINVAL, errno);

  ibv_pd* pd = make_parent(nullptr, td);
  ASSERT_NE(nullptr, pd);
  a = {};
  a.pd = pd;  // a parent domain over a parent domain
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_parent_domain(d.ctx, &a));
  EXPECT_EQ(EINVAL, errno);

  // A CQ's IBV_CQ_INIT_ATTR_MASK_PD needs a parent domain, not a PD.
  errno = 0;
  EXPECT_EQ(nullptr, make_cq(d.pd, 16));
  EXPECT_EQ(EINVAL, errno);

  // The PD and the TD stay while the parent domain names them; the parent domain while a
  // CQ made on it lives.
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(d.pd));
  EXPECT_EQ(EBUSY, ibv_dealloc_td(td));
  ibv_cq* cq = make_cq(pd, 16);
  ASSERT_NE(nullptr, cq);
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(pd));
  EXPECT_EQ(0, ibv_destroy_cq(cq));
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
  EXPECT_EQ(0, ibv_dealloc_td(td));
}

// ---- import -------------------------------------------------------------------------

class Import : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(open_device(d)); }
  void TearDown() override { close_device(d); }
  Device d;
};

TEST_F(Import, DupOfCmdFdGivesAContextOnTheSameDevice) {
  const int fd = dup(d.ctx->cmd_fd);
  ASSERT_GE(fd, 0);
  ibv_context* ctx = ibv_import_device(fd);
  ASSERT_NE(nullptr, ctx) << strerror(errno);
  EXPECT_NE(d.ctx, ctx);
  EXPECT_EQ(fd, ctx->cmd_fd);
  EXPECT_EQ(d.ctx->device, ctx->device);
  ibv_gid gid{};
  ASSERT_EQ(0, ibv_query_gid(ctx, kPort, 0, &gid));
  EXPECT_EQ(0, std::memcmp(&gid, &d.gid, sizeof gid));
  EXPECT_EQ(0, ibv_close_device(ctx));  // closes fd
  EXPECT_EQ(-1, fcntl(fd, F_GETFD));
  // The original is untouched.
  ibv_pd* pd = ibv_alloc_pd(d.ctx);
  ASSERT_NE(nullptr, pd);
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
}

TEST_F(Import, ImportedPdAndMrCarryTrafficAndUnimportLeavesTheOriginals) {
  Buffer buf(8192), src(8192);
  fill_pattern(src.data(), src.size(), 3);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  ibv_mr* smr = ibv_reg_mr(d.pd, src.data(), src.size(), kAllAccess);
  ASSERT_NE(nullptr, smr);
  EXPECT_NE(0u, d.pd->handle);

  const int fd = dup(d.ctx->cmd_fd);
  ibv_context* ctx = ibv_import_device(fd);
  ASSERT_NE(nullptr, ctx) << strerror(errno);
  ibv_pd* ipd = ibv_import_pd(ctx, d.pd->handle);
  ASSERT_NE(nullptr, ipd) << strerror(errno);
  EXPECT_EQ(d.pd->handle, ipd->handle);
  EXPECT_EQ(ctx, ipd->context);
  ibv_mr* imr = ibv_import_mr(ipd, mr->handle);
  ASSERT_NE(nullptr, imr) << strerror(errno);
  EXPECT_EQ(mr->lkey, imr->lkey);
  EXPECT_EQ(mr->rkey, imr->rkey);
  EXPECT_EQ(mr->length, imr->length);
  EXPECT_EQ(mr->addr, imr->addr);

  // QPs of the imported context on the imported PD: a WRITE lands in the imported MR, a
  // SEND from it.
  Device id = d;
  id.ctx = ctx;
  id.pd = ipd;
  Endpoint a, b;
  ConnOptions o;
  o.max_send_wr = o.max_recv_wr = 16;
  o.cq_depth = 32;
  ASSERT_TRUE(connect_pair(id, o, a, b));
  ASSERT_EQ(
      0, post_send(a.qp, IBV_WR_RDMA_WRITE, 1, src.data(), 4096, smr->lkey, buf.addr(), imr->rkey));
  poll_success(a.scq, 1, IBV_WC_RDMA_WRITE);
  EXPECT_TRUE(SameBytes(src.data(), buf.data(), 4096));
  ASSERT_EQ(0, post_recv(b.qp, 2, src.data() + 4096, 4096, smr->lkey));
  ASSERT_EQ(0, post_send(a.qp, IBV_WR_SEND, 3, buf.data(), 4096, imr->lkey));
  poll_success(a.scq, 3, IBV_WC_SEND);
  poll_success(b.rcq, 2, IBV_WC_RECV);
  EXPECT_TRUE(SameBytes(src.data(), src.data() + 4096, 4096));

  // Unimport frees the handles only: the MR and PD stay, the originals keep working.
  ibv_unimport_mr(imr);
  ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_WRITE, 4, src.data(), 4096, smr->lkey, buf.addr() + 4096,
                         mr->rkey));
  poll_success(a.scq, 4, IBV_WC_RDMA_WRITE);
  EXPECT_TRUE(SameBytes(src.data(), buf.data() + 4096, 4096));
  destroy_endpoint(a);
  destroy_endpoint(b);
  ibv_unimport_pd(ipd);
  EXPECT_EQ(0, ibv_close_device(ctx));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  EXPECT_EQ(0, ibv_dereg_mr(smr));
  // A deallocated PD can no longer be imported.
  ibv_pd* pd = ibv_alloc_pd(d.ctx);
  ASSERT_NE(nullptr, pd);
  const uint32_t h = pd->handle;
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
  errno = 0;
  EXPECT_EQ(nullptr, ibv_import_pd(d.ctx, h));
  EXPECT_EQ(ENOENT, errno);
}

TEST_F(Import, BadDescriptorsAndHandlesAreRefused) {
  errno = 0;
  EXPECT_EQ(nullptr, ibv_import_device(-1));
  EXPECT_EQ(EINVAL, errno);  // rdma-core: fstat fails
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  ASSERT_GE(null_fd, 0);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_import_device(null_fd));  // no verbs device's descriptor
  EXPECT_EQ(ENODEV, errno);
  close(null_fd);

  errno = 0;
  EXPECT_EQ(nullptr, ibv_import_pd(d.ctx, 0xdead));
  EXPECT_EQ(ENOENT, errno);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_import_mr(d.pd, 0xdead));
  EXPECT_EQ(ENOENT, errno);
  // An MR imported on a PD it does not belong to.
  Buffer buf(4096);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  ibv_pd* other = ibv_alloc_pd(d.ctx);
  ASSERT_NE(nullptr, other);
  EXPECT_NE(other->handle, d.pd->handle);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_import_mr(other, mr->handle));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(0, ibv_dealloc_pd(other));
  // A second context opened on the device is another command file: its handles are not
  // this one's.
  Device e;
  ASSERT_TRUE(open_device(e));
  errno = 0;
  EXPECT_EQ(nullptr, ibv_import_mr(e.pd, mr->handle));
  EXPECT_EQ(ENOENT, errno);
  close_device(e);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// ibv_import_dm: the imported handle reaches the same device memory both ways; unimporting
// it leaves the original, and a freed DM can no longer be imported.
TEST_F(Import, ImportedDmSharesTheDeviceMemory) {
  ibv_alloc_dm_attr attr{};
  attr.length = 4096;
  ibv_dm* dm = ibv_alloc_dm(d.ctx, &attr);
  ASSERT_NE(nullptr, dm) << strerror(errno);
  const int fd = dup(d.ctx->cmd_fd);
  ibv_context* ctx = ibv_import_device(fd);
  ASSERT_NE(nullptr, ctx) << strerror(errno);
  ibv_dm* idm = ibv_import_dm(ctx, dm->handle);
  ASSERT_NE(nullptr, idm) << strerror(errno);
  EXPECT_EQ(dm->handle, idm->handle);
  EXPECT_EQ(ctx, idm->context);

  std::vector<uint8_t> out(attr.length), in(attr.length);
  fill_pattern(out.data(), out.size(), 9);
  ASSERT_EQ(0, ibv_memcpy_to_dm(dm, 0, out.data(), out.size()));
  ASSERT_EQ(0, ibv_memcpy_from_dm(in.data(), idm, 0, in.size()));
  EXPECT_EQ(out, in);
  fill_pattern(out.data(), 64, 11);  // and the other way
  ASSERT_EQ(0, ibv_memcpy_to_dm(idm, 128, out.data(), 64));
  ASSERT_EQ(0, ibv_memcpy_from_dm(in.data(), dm, 128, 64));
  EXPECT_EQ(0, std::memcmp(out.data(), in.data(), 64));

  ibv_unimport_dm(idm);
  ASSERT_EQ(0, ibv_memcpy_from_dm(in.data(), dm, 0, 64));  // the original still works
  const uint32_t handle = dm->handle;
  EXPECT_EQ(0, ibv_free_dm(dm));
  errno = 0;
  EXPECT_EQ(nullptr, ibv_import_dm(ctx, handle));  // freed: no longer listed
  EXPECT_EQ(ENOENT, errno);
  EXPECT_EQ(0, ibv_close_device(ctx));
}

}  // namespace
}  // namespace softrdma::verbs_test
