// rdma_cm_id: creation and destruction, binding to an address (and so to a device, see
// cm_device.h), address and route resolution, listening, options, ports, the device list.
// Errors follow librdmacm over the kernel's rdma_cm (drivers/infiniband/core/cma.c): EINVAL
// for a call in the wrong state or a malformed argument, EADDRINUSE for a taken port,
// EADDRNOTAVAIL for an address that is not this host's, ENOSYS for an unknown option.
#include <arpa/inet.h>
#include <endian.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/params.h"
#include "cm/address.h"
#include "cm/cm_device.h"
#include "cm/cma.h"
#include "cm/log.h"

using namespace softrdma::cm;

namespace softrdma::cm {
namespace {

/// Every live ID (to find a listener's undelivered requests, and to clean up at unload).
std::set<IdPriv*>& ids() {
  static auto* s = new std::set<IdPriv*>;
  return *s;
}

bool valid_port_space(int ps) {
  return ps == RDMA_PS_TCP || ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB || ps == RDMA_PS_IB;
}

}  // namespace

int ipv4_of(const sockaddr* sa, uint32_t& ip, uint16_t& port) {
  if (!sa) return EINVAL;
  if (sockaddr_ipv4(sa, ip, port)) return 0;
  if (sa->sa_family == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    port = ntohs(s6->sin6_port);
    if (IN6_IS_ADDR_UNSPECIFIED(&s6->sin6_addr)) {
      ip = 0;
      return 0;
    }
    if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
      std::memcpy(&ip, &s6->sin6_addr.s6_addr[12], 4);
      ip = ntohl(ip);
      return 0;
    }
    log().warn("IPv6 addresses are not supported (softrdma devices are IPv4 addresses)");
    return EAFNOSUPPORT;
  }
  if (sa->sa_family == AF_IB) return EAFNOSUPPORT;
  return EINVAL;
}

namespace {

const char* ps_name(int ps) {
  switch (ps) {
    case RDMA_PS_TCP:
      return "RDMA_PS_TCP";
    case RDMA_PS_UDP:
      return "RDMA_PS_UDP";
    case RDMA_PS_IPOIB:
      return "RDMA_PS_IPOIB";
    case RDMA_PS_IB:
      return "RDMA_PS_IB";
  }
  return "?";
}

/// The device a resolving ID with no source address goes out of (cm_device.h): the default
/// one, or — when none is open, SOFTRDMA_ADDR is unset and the destination is not on
/// loopback — the device at the address the kernel routes `dst` from.
uint32_t source_for(uint32_t dst, int& err) {
  if (!CmDevice::all_locked().empty() || params::raw(params::kAddr) || (dst >> 24) == 127 ||
      dst == 0)
    return 0;
  uint32_t src = route_source(dst, err);
  return src;
}

/// Whether one of the process's own RDMA-CM devices is bound at `ip` (no need to ask the
/// host then).
bool endpoint_open_locked(uint32_t ip) {
  for (CmDevice* d : CmDevice::all_locked())
    if (d->ip() == ip) return true;
  return false;
}

/// Whether `ip` (not 0) is an address of one of the process's devices, so that a bind there
/// attaches that device: one the RDMA-CM has open there, or an entry of SOFTRDMA_ADDR (the
/// devices `softrdma run --addr` gave the process). Without SOFTRDMA_ADDR the process has
/// declared no devices and a bind opens one at any address of this host (a process may own
/// several addresses). Anything else is an address of this host with no device of the
/// process — 127.0.0.1, which libfabric's verbs provider binds to find its interfaces, or a
/// NIC's address — where the kernel's rdma_cm binds without a device (id->verbs NULL).
bool owned_locked(uint32_t ip) {
  if (endpoint_open_locked(ip)) return true;
  std::vector<uint32_t> configured;
  std::string malformed;
  if (!params::raw(params::kAddr) || !params::read_ipv4_list(params::kAddr, configured, malformed))
    return true;
  return std::find(configured.begin(), configured.end(), ip) != configured.end();
}

}  // namespace

IdPriv* alloc_id_locked(Channel* channel, void* context, rdma_port_space ps, ibv_qp_type qp_type) {
  auto id = std::make_unique<IdPriv>();
  id->id.context = context;
  id->id.ps = ps;
  id->id.qp_type = qp_type;
  if (!channel) {
    if (!(channel = create_channel())) return nullptr;
    id->sync = true;
  }
  id->id.channel = &channel->ch;
  id->qkey = (ps == RDMA_PS_UDP || ps == RDMA_PS_IB) ? RDMA_UDP_QKEY : 0;
  ids().insert(id.get());
  return id.release();
}

void free_id_locked(IdPriv* id) {
  leave_all_locked(id);
  release_connection_locked(id);
  if (id->port_bound && id->dev) id->dev->release_port(uint16_t(id->id.ps), id->src_port, id);
  id->port_bound = false;
  id->ephemeral_port = false;
  ids().erase(id);
  if (id->sync) destroy_channel(id->channel(), /*application_owned=*/false);
  delete id;
}

void release_all_connections_locked() {
  for (IdPriv* id : ids()) release_connection_locked(id);
}

size_t live_ids_locked() {
  return ids().size();
}

void publish_addresses_locked(IdPriv* id) {
  rdma_addr& a = id->id.route.addr;
  make_sockaddr(a.src_sin, id->wildcard ? 0 : id->src_ip, id->src_port);
  if (id->dst_ip || id->dst_port) make_sockaddr(a.dst_sin, id->dst_ip, id->dst_port);
  if (id->dev && !id->unattached)
    a.addr.ibaddr.sgid = ipv4_gid(id->dev->ip());
  else
    a.addr.ibaddr.sgid = ibv_gid{};  // no device, no GID
  if (id->dst_ip) a.addr.ibaddr.dgid = ipv4_gid(id->dst_ip);
  a.addr.ibaddr.pkey = htobe16(0xffff);
}

int bind_locked(IdPriv* id, uint32_t ip, uint16_t port, bool wildcard) {
  int err = 0;
  CmDevice* dev = CmDevice::get_locked(ip, err);
  if (!dev) return err;
  if ((err = dev->reserve_port(uint16_t(id->id.ps), port, id))) return err;
  id->dev = dev;
  id->port_bound = true;
  id->src_ip = dev->ip();
  id->src_port = port;
  id->wildcard = wildcard;
  id->state = IdState::kAddrBound;
  // A wildcard bind names no device (the kernel leaves verbs NULL until a request arrives).
  if (!wildcard) {
    id->id.verbs = dev->verbs();
    id->id.pd = dev->pd();
    id->id.port_num = 1;
  }
  publish_addresses_locked(id);
  return 0;
}

void build_path_locked(IdPriv* id) {
  ibv_sa_path_rec& p = id->path;
  p = ibv_sa_path_rec{};
  p.sgid = ipv4_gid(id->dev->ip());
  p.dgid = ipv4_gid(id->dst_ip);
  p.hop_limit = id->hop_limit;
  p.traffic_class = id->tos;
  p.reversible = 1;
  p.numb_path = 1;
  p.pkey = htobe16(0xffff);
  p.sl = id->tos >> 5;
  p.mtu_selector = 2;  // exactly
  p.mtu = id->path_mtu ? id->path_mtu : id->dev->active_mtu();
  p.rate_selector = 2;
  p.rate = id->dev->rate();
  p.packet_life_time_selector = 2;
  p.packet_life_time = id->dev->cm().config().packet_life_time;
  id->id.route.path_rec = &id->path;
  id->id.route.num_paths = 1;
}

}  // namespace softrdma::cm

extern "C" {

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context,
                   rdma_port_space ps) {
  if (!id || !valid_port_space(ps)) return fail_errno(EINVAL);
  if (int e = library_init()) return fail_errno(e);
  const ibv_qp_type qp_type = (ps == RDMA_PS_IPOIB || ps == RDMA_PS_UDP) ? IBV_QPT_UD : IBV_QPT_RC;
  std::lock_guard lk(g_mu);
  IdPriv* p = alloc_id_locked(reinterpret_cast<Channel*>(channel), context, ps, qp_type);
  if (!p) return -1;
  *id = &p->id;
  return 0;
}

int rdma_destroy_id(rdma_cm_id* id) {
  if (!id) return fail_errno(EINVAL);
  IdPriv* p = priv(id);
  std::unique_lock lk(g_mu);
  if (p->id.event) {  // a synchronous ID's last event
    CmaEvent* ev = reinterpret_cast<CmaEvent*>(p->id.event);
    p->id.event = nullptr;
    if (ev->owner) ++ev->owner->events_completed;
    delete ev;
  }
  p->state = IdState::kDestroying;
  // Requests that reached a listener but were never fetched die with it (REJ).
  std::vector<IdPriv*> orphans;
  for (IdPriv* other : ids())
    if (other->listener == p) orphans.push_back(other);
  for (IdPriv* child : orphans) {
    unqueue_events_locked(child);
    child->listener = nullptr;
    free_id_locked(child);
  }
  unqueue_events_locked(p);
  release_connection_locked(p);
  // Wait until every event the application fetched for this ID is acknowledged.
  g_cv.wait(lk, [p] { return p->events_completed >= p->events_reported; });
  free_id_locked(p);
  return 0;
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  uint32_t ip = 0;
  uint16_t port = 0;
  if (!id) return fail_errno(EINVAL);
  if (int e = ipv4_of(addr, ip, port)) return fail_errno(e);
  std::lock_guard lk(g_mu);
  IdPriv* p = priv(id);
  if (p->state != IdState::kIdle) return fail_errno(EINVAL);
  if (ip != 0 && !owned_locked(ip)) {
    // An address of this host that no device of the process owns: bound, with no device
    // (id.verbs NULL), as the kernel's rdma_cm does. Its port is held on the default device;
    // a listen there hears only requests addressed to `ip`.
    if (!is_local_address(ip)) return fail_errno(EADDRNOTAVAIL);
    if (int e = bind_locked(p, 0, port, /*wildcard=*/true)) return fail_errno(e);
    p->wildcard = false;
    p->unattached = true;
    p->src_ip = ip;
    publish_addresses_locked(p);
    log().debug("bound to {}:{} with no device (none of the process's devices owns {})",
                ip_string(ip), p->src_port, ip_string(ip));
    return 0;
  }
  if (int e = bind_locked(p, ip, port, ip == 0)) return fail_errno(e);
  return 0;
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
  (void)timeout_ms;  // resolution is immediate: there is no ARP on a softrdma path
  uint32_t dst = 0, src = 0;
  uint16_t dst_port = 0, src_port = 0;
  if (!id) return fail_errno(EINVAL);
  if (int e = ipv4_of(dst_addr, dst, dst_port)) return fail_errno(e);
  if (src_addr)
    if (int e = ipv4_of(src_addr, src, src_port)) return fail_errno(e);
  std::unique_lock lk(g_mu);
  IdPriv* p = priv(id);
  if (p->state == IdState::kIdle) {
    int err = 0;
    uint32_t via = src ? src : source_for(dst, err);
    if (err) return fail_errno(err);
    if (int e = bind_locked(p, via, src_port, via == 0)) return fail_errno(e);
  }
  if (p->state != IdState::kAddrBound) return fail_errno(EINVAL);
  // The source becomes the device's address (the kernel's route source), never the wildcard
  // nor an address no device of the process owns.
  p->wildcard = false;
  p->unattached = false;
  p->src_ip = p->dev->ip();
  p->id.verbs = p->dev->verbs();
  p->id.pd = p->dev->pd();
  p->id.port_num = 1;
  p->dst_ip = dst ? dst : p->dev->ip();  // 0.0.0.0: this host (Linux resolves it to loopback)
  p->dst_port = dst_port;
  p->state = IdState::kAddrQuery;
  publish_addresses_locked(p);
  // On this host the peer must be a RoCEv2 endpoint (a softrdma device's UDP port 4791);
  // elsewhere nothing can be asked before the CM's REQ (no ARP on a UDP path).
  if (is_local_address(p->dst_ip) && !endpoint_open_locked(p->dst_ip) &&
      !roce_endpoint_at(p->dst_ip)) {
    log().info("no RoCEv2 endpoint (UDP port 4791) at {}: RDMA_CM_EVENT_ADDR_ERROR",
               ip_string(p->dst_ip));
    p->state = IdState::kAddrBound;
    queue_event_locked(p, make_event(p, RDMA_CM_EVENT_ADDR_ERROR, -EHOSTUNREACH));
  } else {
    p->state = IdState::kAddrResolved;
    queue_event_locked(p, make_event(p, RDMA_CM_EVENT_ADDR_RESOLVED));
  }
  return p->sync ? complete_sync_locked(p, lk) : 0;
}

int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  (void)timeout_ms;  // the route is computed locally (RoCE: no SA query)
  if (!id) return fail_errno(EINVAL);
  std::unique_lock lk(g_mu);
  IdPriv* p = priv(id);
  if (p->state != IdState::kAddrResolved) return fail_errno(EINVAL);
  build_path_locked(p);
  p->state = IdState::kRouteResolved;
  queue_event_locked(p, make_event(p, RDMA_CM_EVENT_ROUTE_RESOLVED));
  return p->sync ? complete_sync_locked(p, lk) : 0;
}

int rdma_listen(rdma_cm_id* id, int backlog) {
  (void)backlog;  // requests are never dropped for want of room
  if (!id) return fail_errno(EINVAL);
  std::lock_guard lk(g_mu);
  IdPriv* p = priv(id);
  if (p->state == IdState::kListen) return 0;
  if (p->state == IdState::kIdle)
    if (int e = bind_locked(p, 0, 0, true)) return fail_errno(e);
  if (p->state != IdState::kAddrBound) return fail_errno(EINVAL);
  const auto* holders = p->dev->port_holders(uint16_t(p->id.ps), p->src_port);
  if (holders && holders->size() > 1) return fail_errno(EADDRINUSE);  // shared by REUSEADDR
  CommManager& cm = p->dev->cm();
  p->comm_id = cm.create_id(id_handler(p));
  p->state = IdState::kListen;  // before: requests held for this port are delivered at once
  if (int e = cm.listen(p->comm_id, ip_service_id(uint16_t(p->id.ps), p->src_port))) {
    p->state = IdState::kAddrBound;
    cm.destroy_id(p->comm_id);
    p->comm_id = 0;
    return fail_errno(e);
  }
  p->dev->set_listening(uint16_t(p->id.ps), p->src_port, true);
  log().info("listening on {}:{} ({})", p->wildcard ? "0.0.0.0" : ip_string(p->src_ip), p->src_port,
             ps_name(p->id.ps));
  return 0;
}

int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  if (!id || !optval) return fail_errno(EINVAL);
  std::unique_lock lk(g_mu);
  IdPriv* p = priv(id);
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS:
        if (optlen != sizeof(uint8_t)) return fail_errno(EINVAL);
        p->tos = *static_cast<uint8_t*>(optval);
        p->tos_set = true;
        return 0;
      case RDMA_OPTION_ID_REUSEADDR:
        if (optlen != sizeof(int)) return fail_errno(EINVAL);
        if (p->state != IdState::kIdle) return fail_errno(EINVAL);
        p->reuseaddr = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_AFONLY:
        if (optlen != sizeof(int)) return fail_errno(EINVAL);
        if (p->state != IdState::kIdle) return fail_errno(EINVAL);
        p->afonly = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        if (optlen != sizeof(uint8_t)) return fail_errno(EINVAL);
        p->ack_timeout = std::min<uint8_t>(*static_cast<uint8_t*>(optval), 31);
        return 0;
      default:
        return fail_errno(ENOSYS);
    }
  }
  if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) {
    // A route given by the application (rdma_create_ep's ai_route): its first path.
    if (optlen < sizeof(ibv_path_data) || optlen % sizeof(ibv_path_data)) return fail_errno(EINVAL);
    if (p->state != IdState::kAddrResolved) return fail_errno(EINVAL);
    const ibv_path_record& r = static_cast<ibv_path_data*>(optval)->path;
    build_path_locked(p);
    if (r.mtu & 0x1f) p->path.mtu = uint8_t(r.mtu & 0x1f);
    p->path_mtu = p->path.mtu;
    p->path.hop_limit = uint8_t(be32toh(r.flowlabel_hoplimit));
    p->hop_limit = p->path.hop_limit ? p->path.hop_limit : p->hop_limit;
    p->state = IdState::kRouteResolved;
    queue_event_locked(p, make_event(p, RDMA_CM_EVENT_ROUTE_RESOLVED));
    return 0;
  }
  return fail_errno(ENOSYS);
}

__be16 rdma_get_src_port(rdma_cm_id* id) {
  return id && id->route.addr.src_addr.sa_family == AF_INET ? id->route.addr.src_sin.sin_port : 0;
}

__be16 rdma_get_dst_port(rdma_cm_id* id) {
  return id && id->route.addr.dst_addr.sa_family == AF_INET ? id->route.addr.dst_sin.sin_port : 0;
}

ibv_context** rdma_get_devices(int* num_devices) {
  if (num_devices) *num_devices = 0;
  if (int e = library_init()) {
    errno = e;
    return nullptr;
  }
  std::lock_guard lk(g_mu);
  int err = 0;
  if (!CmDevice::get_locked(0, err)) {
    errno = err;
    return nullptr;
  }
  std::vector<CmDevice*> devs = CmDevice::all_locked();
  auto** list = static_cast<ibv_context**>(std::calloc(devs.size() + 1, sizeof(ibv_context*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < devs.size(); ++i) list[i] = devs[i]->verbs();
  if (num_devices) *num_devices = int(devs.size());
  return list;
}

void rdma_free_devices(ibv_context** list) {
  std::free(list);
}

}  // extern "C"
