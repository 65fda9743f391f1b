// XRC domains and shared receive QPs (ibv_open_xrcd(3), ibv_close_xrcd, ibv_open_qp(3)).
//
// The fd / oflags rules are the kernel's (ib_uverbs_open_xrcd): fd -1 opens a new, unshared
// domain; otherwise the domain is the one already associated with that file's inode
// (st_dev, st_ino), which O_CREAT creates when there is none (without O_CREAT: EAGAIN),
// and O_EXCL refuses when there is one (EINVAL); a bad fd is EBADF. comp_mask must hold
// IBV_XRCD_INIT_ATTR_FD and IBV_XRCD_INIT_ATTR_OFLAGS (rdma-core ibv_cmd_open_xrcd: EINVAL).
//
// What sharing means here: on a kernel device an XRC domain opened through one file by two
// processes is one domain of the one HCA, so each can open the other's XRC receive QPs. A
// softrdma device belongs to one process (its own IPv4 address), so domains are shared only
// within a process — two ibv_open_xrcd on the same file there return handles on one domain,
// and ibv_open_qp finds that domain's XRC receive QPs; another process opening the same file
// gets a domain of its own device. Across processes XRC works as on the wire: an XRC send QP
// reaches any XRC receive QP and SRQ of the peer device by their numbers.
#include <fcntl.h>
#include <sys/stat.h>

#include <vector>

#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

std::mutex g_domains_mu;
/// Domains opened through a file, per device: (device, st_dev, st_ino) → domain.
struct DomainKey {
  const engine::Device* dev;
  dev_t st_dev;
  ino_t st_ino;
  bool operator<(const DomainKey& o) const {
    return std::tie(dev, st_dev, st_ino) < std::tie(o.dev, o.st_dev, o.st_ino);
  }
};
/// Never destroyed (objects.h, "Process-wide state").
std::map<DomainKey, std::weak_ptr<XrcdShared>>& g_domains =
    *new std::map<DomainKey, std::weak_ptr<XrcdShared>>;

}  // namespace

namespace softrdma::verbs {

ibv_xrcd* ctx_open_xrcd(ibv_context* ctx, ibv_xrcd_init_attr* attr) {
  if (!ctx || !attr) return fail<ibv_xrcd>(EINVAL);
  if (attr->comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED) return fail<ibv_xrcd>(EOPNOTSUPP);
  if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS))
    return fail<ibv_xrcd>(EINVAL);
  std::shared_ptr<XrcdShared> shared;
  if (attr->fd == -1) {
    shared = std::make_shared<XrcdShared>();
  } else {
    struct stat st;
    if (::fstat(attr->fd, &st) != 0) return fail<ibv_xrcd>(EBADF);
    const DomainKey key{to_ctx(ctx)->dev.get(), st.st_dev, st.st_ino};
    std::lock_guard lk(g_domains_mu);
    shared = g_domains[key].lock();
    if (!shared && !(attr->oflags & O_CREAT)) return fail<ibv_xrcd>(EAGAIN);
    if (shared && (attr->oflags & O_EXCL)) return fail<ibv_xrcd>(EINVAL);
    if (!shared) {
      shared = std::make_shared<XrcdShared>();
      shared->has_inode = true;
      shared->st_dev = st.st_dev;
      shared->st_ino = st.st_ino;
      g_domains[key] = shared;
    }
  }
  auto* x = new Xrcd{};
  x->ibv.context = ctx;
  x->shared = std::move(shared);
  return &x->ibv;
}

int ctx_close_xrcd(ibv_xrcd* xrcd) {
  Xrcd* x = to_xrcd(xrcd);
  {
    std::lock_guard lk(g_domains_mu);
    // The last handle of a domain its SRQs or XRC receive QPs still use: EBUSY (the
    // kernel's ib_dealloc_xrcd). Another handle may close any time.
    if (x->shared.use_count() == 1 && x->shared->domain.users.load() > 0) return EBUSY;
    if (x->shared.use_count() == 1 && x->shared->has_inode)
      g_domains.erase({to_ctx(xrcd->context)->dev.get(), x->shared->st_dev, x->shared->st_ino});
    x->shared.reset();
  }
  delete x;
  return 0;
}

void track_xrc_recv_qp(ibv_xrcd* xrcd, const std::shared_ptr<engine::QueuePair>& qp) {
  XrcdShared& d = *to_xrcd(xrcd)->shared;
  std::lock_guard lk(d.mu);
  for (auto it = d.tgt_qps.begin(); it != d.tgt_qps.end();)  // forget destroyed ones
    it = it->second.expired() ? d.tgt_qps.erase(it) : std::next(it);
  d.tgt_qps[qp->qpn()] = qp;
}

/// ibv_open_qp: another handle on an XRC receive QP of the domain. EINVAL for a missing
/// attribute (num, xrcd, type), a type other than IBV_QPT_XRC_RECV, or a QPN the domain
/// has no XRC receive QP under (the kernel's ib_open_qp).
ibv_qp* ctx_open_qp(ibv_context* ctx, ibv_qp_open_attr* attr) {
  if (!ctx || !attr) return fail<ibv_qp>(EINVAL);
  constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  if ((attr->comp_mask & kNeeded) != kNeeded || !attr->xrcd || attr->xrcd->context != ctx ||
      attr->qp_type != IBV_QPT_XRC_RECV)
    return fail<ibv_qp>(EINVAL);
  std::shared_ptr<engine::QueuePair> qp;
  {
    XrcdShared& d = *to_xrcd(attr->xrcd)->shared;
    std::lock_guard lk(d.mu);
    auto it = d.tgt_qps.find(attr->qp_num);
    if (it != d.tgt_qps.end()) qp = it->second.lock();
  }
  if (!qp) return fail<ibv_qp>(EINVAL);
  void* qp_context = (attr->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? attr->qp_context : nullptr;
  return new_qp_handle(ctx, std::move(qp), qp_context, nullptr, nullptr, nullptr, nullptr)->as_qp();
}

}  // namespace softrdma::verbs
