// rdma_join_multicast(3), rdma_join_multicast_ex(3), rdma_leave_multicast(3) on RoCEv2, as
// Linux's rdma_cm does them for an Ethernet port (drivers/infiniband/core/cma.c:
// cma_iboe_join_multicast, cma_iboe_set_mgid) with librdmacm's share of the work
// (librdmacm/cma.c: ucma_process_join attaches the ID's QP when the application fetches
// RDMA_CM_EVENT_MULTICAST_JOIN; rdma_leave_multicast detaches it):
//  - a RoCE group needs no SA: the join event comes at once, with the group's GID
//    ::ffff:a.b.c.d, destination QPN 0xFFFFFF, Q_Key RDMA_UDP_QKEY (RDMA_PS_UDP) and hop
//    limit 1 (the kernel's record for a RoCE group);
//  - the QP joins the group in the device (ibv_attach_mcast, engine/multicast.cpp), which
//    receives the IPv4 group on the host's network; senders need nothing but an AH to the
//    group's GID.
// Errors (librdmacm and kernel): EINVAL for an ID not bound to an address (neither
// ADDR_BOUND nor ADDR_RESOLVED), a wildcard or non-multicast group address, bad _ex
// attributes; ENOTSUP for unknown _ex comp_mask bits; EAFNOSUPPORT for IPv6 groups (softrdma
// devices are IPv4); EADDRNOTAVAIL for leaving a group the ID did not join.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "cm/address.h"
#include "cm/cm_device.h"
#include "cm/cma.h"
#include "cm/log.h"

using namespace softrdma::cm;

namespace softrdma::cm {
namespace {

/// The Q_Key of an ID's group (cma_iboe_join_multicast: RDMA_UDP_QKEY for RDMA_PS_UDP).
uint32_t group_qkey(const IdPriv* id) {
  return id->id.ps == RDMA_PS_UDP ? RDMA_UDP_QKEY : 0;
}

/// The address vector of the group (ib_init_ah_from_mcmember over the kernel's RoCE record:
/// the group's GID, hop limit 1, the ID's TOS).
ibv_ah_attr group_ah_attr(const IdPriv* id, const ibv_gid& mgid) {
  return ah_attr_to(id, mgid, 1);
}

int join(rdma_cm_id* cm_id, sockaddr* addr, uint32_t join_flags, void* context) {
  if (!cm_id) return fail_errno(EINVAL);
  uint32_t group = 0;
  uint16_t port = 0;
  if (int e = ipv4_of(addr, group, port)) return fail_errno(e);
  if (!IN_MULTICAST(group)) {  // the wildcard too (cma_zero_addr: EINVAL)
    log().info("rdma_join_multicast: {} is not a multicast address", ip_string(group));
    return fail_errno(EINVAL);
  }
  std::unique_lock lk(g_mu);
  IdPriv* p = priv(cm_id);
  if (!p->dev || (p->state != IdState::kAddrBound && p->state != IdState::kAddrResolved))
    return fail_errno(EINVAL);
  static uint64_t next_serial = 1;
  Multicast mc;
  mc.serial = next_serial++;
  mc.group = group;
  mc.mgid = ipv4_gid(group);
  mc.context = context;
  mc.join_flags = join_flags;
  p->mcs.push_back(mc);
  // The id.verbs of a bound ID is its device's context (rdma_bind_addr), so a QP may be
  // created before the join event is fetched, as with the kernel.
  auto ev = make_event(p, RDMA_CM_EVENT_MULTICAST_JOIN);
  ev->mc_serial = mc.serial;
  rdma_ud_param& u = ev->event.param.ud;
  u.private_data = context;  // librdmacm: the join's context, not data from the wire
  u.private_data_len = 0;
  u.ah_attr = group_ah_attr(p, mc.mgid);
  u.qp_num = 0xffffff;  // the multicast QPN (IBTA vol 1, 10.5.2.3)
  u.qkey = group_qkey(p);
  log().info("joined multicast group {} ({})", ip_string(group),
             join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER ? "send-only" : "full member");
  queue_event_locked(p, std::move(ev));
  return p->sync ? complete_sync_locked(p, lk) : 0;
}

/// Detaches `mc`'s QP if the join attached one (rdma_leave_multicast's ibv_detach_mcast).
void detach_locked(IdPriv* p, Multicast& mc) {
  if (!mc.attached) return;
  // The QP the join attached: the ID's QP, unless the application destroyed it (then the
  // attachment went with it, or the destroy was refused and the QP is still the ID's).
  if (p->id.qp == mc.attached) {
    if (int e = ibv_detach_mcast(mc.attached, &mc.mgid, 0))
      log().warn("leaving {}: ibv_detach_mcast: {}", ip_string(mc.group), std::strerror(e));
  }
  mc.attached = nullptr;
}

}  // namespace

void process_join_locked(CmaEvent* ev) {
  IdPriv* p = priv(ev->event.id);
  auto it = std::find_if(p->mcs.begin(), p->mcs.end(),
                         [&](const Multicast& m) { return m.serial == ev->mc_serial; });
  if (it == p->mcs.end() || !p->id.qp) return;  // left already, or no QP to attach
  if (it->join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) return;  // sends only
  if (int e = ibv_attach_mcast(p->id.qp, &it->mgid, 0); e != 0) {
    log().warn("joining {}: ibv_attach_mcast: {}", ip_string(it->group), std::strerror(e));
    ev->event.event = RDMA_CM_EVENT_MULTICAST_ERROR;
    ev->event.status = -e;
    return;
  }
  it->attached = p->id.qp;
}

void leave_all_locked(IdPriv* id) {
  for (Multicast& mc : id->mcs) detach_locked(id, mc);
  id->mcs.clear();
}

}  // namespace softrdma::cm

extern "C" {

/// rdma_join_multicast: joins `addr` (an IPv4 multicast address) as a full member; the
/// RDMA_CM_EVENT_MULTICAST_JOIN event carries the group's AH attributes, QPN and Q_Key,
/// and the ID's QP is attached to the group when the application fetches it. Returns 0, or
/// -1 with errno (see the file comment).
int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
  return join(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context);
}

/// rdma_join_multicast_ex: as rdma_join_multicast, with join flags: a send-only full member
/// (RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) gets the event but no attachment.
int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* context) {
  if (!attr) return fail_errno(EINVAL);
  if (attr->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED) return fail_errno(ENOTSUP);
  if (!(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS)) return fail_errno(EINVAL);
  if (!(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
      attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED)
    return fail_errno(EINVAL);
  return join(id, attr->addr, attr->join_flags, context);
}

/// rdma_leave_multicast: leaves the group `addr` joined on this ID (the oldest such join),
/// detaching the ID's QP. Returns 0, or -1 with errno EADDRNOTAVAIL (not joined on this
/// ID) or EINVAL (no ID, a malformed address).
int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  if (!id) return fail_errno(EINVAL);
  uint32_t group = 0;
  uint16_t port = 0;
  if (int e = ipv4_of(addr, group, port)) return fail_errno(e);
  std::lock_guard lk(g_mu);
  IdPriv* p = priv(id);
  auto it = std::find_if(p->mcs.begin(), p->mcs.end(),
                         [&](const Multicast& m) { return m.group == group; });
  if (it == p->mcs.end()) return fail_errno(EADDRNOTAVAIL);
  detach_locked(p, *it);
  log().info("left multicast group {}", ip_string(group));
  p->mcs.erase(it);
  return 0;
}

}  // extern "C"
