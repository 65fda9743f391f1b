// ibv_attach_mcast(3) / ibv_detach_mcast: UD QPs in multicast groups. The checks and errno
// values are the kernel's (ib_attach_mcast in drivers/infiniband/core/verbs.c, and
// ib_uverbs_attach_mcast / ib_uverbs_detach_mcast: attaching twice is a no-op, detaching what
// is not attached is EINVAL); the groups themselves are the engine's (engine/multicast.cpp).
// A QP attached to a group cannot be destroyed (ibv_destroy_qp: EBUSY), as with the kernel,
// which counts attachments in the QP's usecnt.
#include <netinet/in.h>

#include <cstring>

#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

enum class McastGid { kIpv4, kIpv6, kNotMulticast };

/// rdma_is_multicast_addr: an IPv6 multicast address (ff00::/8) or an IPv4-mapped one of
/// 224.0.0.0/4 (the GID rdma_cm gives a RoCEv2 group). `group` gets the IPv4 address.
McastGid classify(const ibv_gid& gid, uint32_t& group) {
  if (gid.raw[0] == 0xff) return McastGid::kIpv6;
  engine::Gid g;
  std::memcpy(g.raw, gid.raw, sizeof g.raw);
  return g.to_ipv4(group) && IN_MULTICAST(group) ? McastGid::kIpv4 : McastGid::kNotMulticast;
}

/// The checks both calls share; 0 with `group` set, or the errno.
int check(ibv_qp* qp, const ibv_gid* gid, uint32_t& group) {
  if (!qp || !gid) return EINVAL;
  const McastGid kind = classify(*gid, group);
  if (kind == McastGid::kNotMulticast || qp->qp_type != IBV_QPT_UD) return EINVAL;
  // softrdma devices are IPv4-only (their one GID is IPv4-mapped): an IPv6 group could
  // never be reached from them.
  if (kind == McastGid::kIpv6) return EOPNOTSUPP;
  return 0;
}

}  // namespace

extern "C" {

/// ibv_attach_mcast: the UD QP receives the datagrams sent to the group `gid` (an
/// IPv4-mapped multicast GID, ::ffff:224.0.0.0/100; `lid` is ignored on RoCE). Returns 0
/// (also when already attached), EINVAL (not a UD QP, not a multicast GID), EOPNOTSUPP (an
/// IPv6 multicast GID), ENOMEM (max_mcast_grp groups on the device, or max_mcast_qp_attach
/// QPs in the group), or the error joining the group on the host's network.
int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t /*lid*/) {
  uint32_t group = 0;
  if (int e = check(qp, gid, group)) return e;
  Qp* q = to_qp(qp);
  bool added = false;
  if (engine::Status s = to_ctx(qp->context)->dev->attach_mcast(q->qp->qpn(), group, added);
      s != engine::kOk)
    return err(s);
  if (added) q->mcast_attached.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

/// ibv_detach_mcast: undoes ibv_attach_mcast. Returns 0, or EINVAL (not attached to the
/// group, not a UD QP, not a multicast GID) or EOPNOTSUPP (an IPv6 multicast GID).
int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t /*lid*/) {
  uint32_t group = 0;
  if (int e = check(qp, gid, group)) return e;
  Qp* q = to_qp(qp);
  if (engine::Status s = to_ctx(qp->context)->dev->detach_mcast(q->qp->qpn(), group);
      s != engine::kOk)
    return err(s);
  q->mcast_attached.fetch_sub(1, std::memory_order_relaxed);
  return 0;
}

}  // extern "C"
