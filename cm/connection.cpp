// Connections: rdma_connect / rdma_accept / rdma_reject / rdma_disconnect / rdma_notify /
// rdma_establish, and the CM events of each ID turned into rdma_cm events (Linux cma.c's
// cma_ib_handler, cma_ib_req_handler, cma_sidr_rep_handler). RC connections use REQ/REP/RTU
// and DREQ/DREP; UD "connections" (RDMA_PS_UDP) resolve the peer's QPN and Q_Key with
// SIDR_REQ/SIDR_REP. The private data of REQ and SIDR_REQ starts with the RDMA IP CM header
// (IBTA annex A11) naming both addresses and the active side's port.
#include <endian.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "cm/address.h"
#include "cm/cm_device.h"
#include "cm/cma.h"
#include "cm/log.h"

using namespace softrdma::cm;

namespace softrdma::cm {
namespace {

uint32_t random_psn() {
  static thread_local std::minstd_rand rng{std::random_device{}()};
  return rng() & 0xffffff;
}

std::array<uint8_t, 16> gid_bytes(uint32_t ip) {
  std::array<uint8_t, 16> b;
  ibv_gid g = ipv4_gid(ip);
  std::memcpy(b.data(), g.raw, 16);
  return b;
}

/// librdmacm's ucma_valid_param: RC IDs need a QP or parameters; depths within the device's.
int check_conn_param(const IdPriv* id, const rdma_conn_param* param) {
  if (id->id.ps != RDMA_PS_TCP) return 0;
  if (!id->id.qp && !param) return EINVAL;
  if (!param) return 0;
  const ibv_device_attr& a = id->dev->attr();
  if (param->responder_resources != RDMA_MAX_RESP_RES &&
      param->responder_resources > uint8_t(a.max_qp_rd_atom))
    return EINVAL;
  if (param->initiator_depth != RDMA_MAX_INIT_DEPTH &&
      param->initiator_depth > uint8_t(a.max_qp_init_rd_atom))
    return EINVAL;
  return 0;
}

void fill_conn_param(CmaEvent* ev, std::span<const uint8_t> pdata, uint8_t resp_res,
                     uint8_t init_depth, bool flow_control, uint8_t retry, uint8_t rnr_retry,
                     bool srq, uint32_t qpn) {
  rdma_conn_param& c = ev->event.param.conn;
  if (pdata.size() != 0) std::memcpy(ev->private_data, pdata.data(), pdata.size());
  c.private_data = ev->private_data;
  c.private_data_len = uint8_t(pdata.size());
  c.responder_resources = resp_res;
  c.initiator_depth = init_depth;
  c.flow_control = flow_control;
  c.retry_count = retry;
  c.rnr_retry_count = rnr_retry;
  c.srq = srq;
  c.qp_num = qpn;
}

void fill_ud_param(CmaEvent* ev, std::span<const uint8_t> pdata, const ibv_ah_attr& ah,
                   uint32_t qpn, uint32_t qkey) {
  rdma_ud_param& u = ev->event.param.ud;
  if (pdata.size() != 0) std::memcpy(ev->private_data, pdata.data(), pdata.size());
  u.private_data = ev->private_data;
  u.private_data_len = uint8_t(pdata.size());
  u.ah_attr = ah;
  u.qp_num = qpn;
  u.qkey = qkey;
}

/// A REQ or SIDR_REQ reached `listener`: make the new ID and report CONNECT_REQUEST (or
/// reject, as Linux's cma_ib_req_handler does, when the request does not fit the listener).
void on_request_locked(IdPriv* listener, const CmEvent& e) {
  CommManager& cm = listener->dev->cm();
  const bool sidr = e.type == CmEventType::kSidrReqReceived;
  auto refuse = [&](const char* why) {
    log().info("request from {} refused: {}", ip_string(e.peer.ip), why);
    if (sidr) {
      SidrRep rep;
      rep.status = SidrStatus::kReject;
      cm.send_sidr_rep(e.id, rep);
    } else {
      cm.send_rej(e.id, RejReason::kConsumerDefined, {});
    }
    cm.destroy_id(e.id);
  };
  if (listener->state != IdState::kListen) return refuse("the listener is going away");
  if (sidr != (listener->id.qp_type == IBV_QPT_UD))
    return refuse("RC request to a UD listener or the other way round");
  std::span<const uint8_t> pdata;
  if (sidr)
    pdata = std::get<SidrReq>(e.mad->message).private_data;
  else
    pdata = std::get<Req>(e.mad->message).private_data;
  std::optional<IpCmHeader> hdr = decode_ip_cm_header(pdata);
  if (!hdr) return refuse("no IPv4 RDMA IP CM header (annex A11) in the private data");
  if (!listener->wildcard && hdr->dst_ip != listener->src_ip)
    return refuse("addressed to another IP address");

  IdPriv* child = alloc_id_locked(listener->channel(), listener->id.context,
                                  rdma_port_space(listener->id.ps), listener->id.qp_type);
  if (!child) return refuse("out of memory");
  child->dev = listener->dev;
  child->listener = listener;
  child->comm_id = e.id;
  child->src_ip = listener->dev->ip();
  child->src_port = listener->src_port;
  child->dst_ip = e.peer.ip;
  child->dst_port = hdr->src_port;
  child->tos = listener->tos;
  child->state = IdState::kConnect;
  child->id.verbs = child->dev->verbs();
  child->id.pd = child->dev->pd();
  child->id.port_num = 1;
  cm.set_handler(e.id, id_handler(child));

  auto ev = make_event(child, RDMA_CM_EVENT_CONNECT_REQUEST);
  ev->event.listen_id = &listener->id;
  ev->owner = listener;  // counted against the listener (librdmacm: the event's id_priv)
  if (sidr) {
    init_path_locked(child);
    fill_ud_param(ev.get(), pdata.subspan(kIpCmHeaderBytes), peer_ah_attr(child), 0, 0);
  } else {
    const Req& req = std::get<Req>(e.mad->message);
    child->remote_qpn = req.local_qpn;
    child->remote_psn = req.starting_psn;
    // Chosen now, not in rdma_accept: an application that moves its own QP to RTS with
    // rdma_init_qp_attr before accepting (pyverbs' external QP) must get the PSN the REP
    // will carry.
    child->seq_num = random_psn();
    child->path_mtu = std::min(req.path_mtu, child->dev->active_mtu());
    child->retry_count = req.retry_count;
    child->rnr_retry_count = req.rnr_retry_count;
    child->local_ack_timeout = req.primary.local_ack_timeout;
    child->hop_limit = req.primary.hop_limit ? req.primary.hop_limit : 64;
    child->tos = req.primary.traffic_class;
    // The passive side's depths are the active side's, crossed (Linux cm_format_req_event).
    child->responder_resources = req.initiator_depth;
    child->initiator_depth = req.responder_resources;
    child->remote_ece.vendor_id = req.vendor_id;
    child->remote_ece.options = e.mad->header.attr_mod;
    uint8_t gid[16];
    std::memcpy(gid, req.primary.local_gid.data(), sizeof gid);
    if (const uint32_t gid_ip = gid_ipv4(gid); gid_ip && gid_ip != e.peer.ip)
      child->dst_ip = gid_ip;  // the QP's peer is the REQ's GID (the same for softrdma peers)
    init_path_locked(child);
    fill_conn_param(ev.get(), pdata.subspan(kIpCmHeaderBytes), req.initiator_depth,
                    req.responder_resources, req.flow_control, req.retry_count, req.rnr_retry_count,
                    req.srq, req.local_qpn);
  }
  publish_addresses_locked(child);
  build_path_locked(child);  // rdma_cm_id::route of a passive ID, as the kernel fills it
  queue_event_locked(child, std::move(ev));
}

void on_cm_event_locked(IdPriv* id, const CmEvent& e) {
  if (id->state == IdState::kDestroying) return;
  switch (e.type) {
    case CmEventType::kReqReceived:
    case CmEventType::kSidrReqReceived:
      on_request_locked(id, e);
      return;
    case CmEventType::kRepReceived: {
      if (id->state != IdState::kConnect) return;
      const Rep& rep = std::get<Rep>(e.mad->message);
      id->remote_qpn = rep.local_qpn;
      id->remote_psn = rep.starting_psn;
      id->rnr_retry_count = rep.rnr_retry_count;
      id->responder_resources = rep.initiator_depth;  // crossed (Linux cm_rep_handler)
      id->initiator_depth = rep.responder_resources;
      id->remote_ece.vendor_id = rep.vendor_id;
      auto ev = make_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE);
      fill_conn_param(ev.get(), rep.private_data, rep.initiator_depth, rep.responder_resources,
                      rep.flow_control, 0, rep.rnr_retry_count, rep.srq, rep.local_qpn);
      ev->needs_rtu = true;
      queue_event_locked(id, std::move(ev));
      return;
    }
    case CmEventType::kRtuReceived:
    case CmEventType::kUserEstablished:
      if (id->state != IdState::kConnect) return;
      queue_event_locked(id, make_event(id, RDMA_CM_EVENT_ESTABLISHED));
      return;
    case CmEventType::kRejReceived: {
      if (id->state != IdState::kConnect) return;
      const Rej& rej = std::get<Rej>(e.mad->message);
      auto ev = make_event(id, RDMA_CM_EVENT_REJECTED, rej.reason);
      fill_conn_param(ev.get(), rej.private_data, 0, 0, false, 0, 0, false, 0);
      queue_event_locked(id, std::move(ev));
      return;
    }
    case CmEventType::kReqError:
    case CmEventType::kRepError:
    case CmEventType::kSidrReqError:
      if (id->state != IdState::kConnect) return;
      queue_event_locked(id, make_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT));
      return;
    case CmEventType::kSidrRepReceived: {
      if (id->state != IdState::kConnect) return;
      const SidrRep& rep = std::get<SidrRep>(e.mad->message);
      if (rep.status != SidrStatus::kSuccess) {
        auto ev = make_event(id, RDMA_CM_EVENT_UNREACHABLE, int(rep.status));
        fill_ud_param(ev.get(), rep.private_data, {}, 0, 0);
        queue_event_locked(id, std::move(ev));
        return;
      }
      if (rep.qkey != id->qkey) {  // Linux cma_sidr_rep_handler: the Q_Keys must agree
        queue_event_locked(id, make_event(id, RDMA_CM_EVENT_UNREACHABLE, -EINVAL));
        return;
      }
      id->remote_qpn = rep.qpn;
      auto ev = make_event(id, RDMA_CM_EVENT_ESTABLISHED);
      fill_ud_param(ev.get(), rep.private_data, peer_ah_attr(id), rep.qpn, rep.qkey);
      queue_event_locked(id, std::move(ev));
      return;
    }
    case CmEventType::kDreqReceived:
    case CmEventType::kDrepReceived:
    case CmEventType::kDreqError:
      if (id->state != IdState::kConnect) return;
      id->state = IdState::kDisconnect;
      queue_event_locked(id, make_event(id, RDMA_CM_EVENT_DISCONNECTED,
                                        e.type == CmEventType::kDreqError ? -ETIMEDOUT : 0));
      return;
    case CmEventType::kTimeWaitExit:
      if (id->state != IdState::kDisconnect) return;
      queue_event_locked(id, make_event(id, RDMA_CM_EVENT_TIMEWAIT_EXIT));
      return;
  }
}

/// Private data behind the RDMA IP CM header: [connect_data][the application's].
template <size_t N>
int build_private_data(const IdPriv* id, const rdma_conn_param* param, bool with_header,
                       std::array<uint8_t, N>& out) {
  size_t at = 0;
  if (with_header) {
    IpCmHeader h;
    h.src_port = id->src_port;
    h.src_ip = id->src_ip;
    h.dst_ip = id->dst_ip;
    encode_ip_cm_header(h, out);
    at = kIpCmHeaderBytes;
  }
  const size_t user =
      id->connect_data.size() + (param && param->private_data ? param->private_data_len : 0);
  if (at + user > N) return EINVAL;
  if (id->connect_data.size() != 0)
    std::memcpy(out.data() + at, id->connect_data.data(), id->connect_data.size());
  at += id->connect_data.size();
  if (param && param->private_data && param->private_data_len)
    std::memcpy(out.data() + at, param->private_data, param->private_data_len);
  return 0;
}

}  // namespace

CmHandler id_handler(IdPriv* id) {
  return [id](const CmEvent& e) { on_cm_event_locked(id, e); };
}

void release_connection_locked(IdPriv* id) {
  if (!id->comm_id || !id->dev) return;
  id->dev->cm().destroy_id(id->comm_id);
  id->comm_id = 0;
  id->dev->kick();
}

int send_rtu_locked(IdPriv* id) {
  if (!id->comm_id) return fail_errno(EINVAL);
  if (int e = id->dev->cm().send_rtu(id->comm_id, {})) return fail_errno(e);
  return 0;
}

ibv_ah_attr ah_attr_to(const IdPriv* id, const ibv_gid& dgid, uint8_t hop_limit) {
  ibv_ah_attr a{};
  a.is_global = 1;
  a.port_num = 1;
  a.grh.dgid = dgid;
  a.grh.sgid_index = 0;
  a.grh.hop_limit = hop_limit;
  a.grh.traffic_class = id->tos;
  a.sl = id->tos >> 5;
  return a;
}

ibv_ah_attr peer_ah_attr(const IdPriv* id) {
  return ah_attr_to(id, ipv4_gid(id->dst_ip), id->hop_limit);
}

void init_path_locked(IdPriv* id) {
  if (!id->path_mtu) id->path_mtu = id->dev->active_mtu();
  if (!id->local_ack_timeout)
    id->local_ack_timeout = id->ack_timeout ? id->ack_timeout
                                            : ack_timeout(id->dev->cm().config().ca_ack_delay,
                                                          id->dev->cm().config().packet_life_time);
}

}  // namespace softrdma::cm

extern "C" {

int rdma_connect(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (!id) return fail_errno(EINVAL);
  std::unique_lock lk(g_mu);
  IdPriv* p = priv(id);
  if (p->state != IdState::kRouteResolved || !p->dev) return fail_errno(EINVAL);
  if (int e = check_conn_param(p, conn_param)) return fail_errno(e);
  const ibv_device_attr& a = p->dev->attr();
  p->initiator_depth = conn_param && conn_param->initiator_depth != RDMA_MAX_INIT_DEPTH
                           ? conn_param->initiator_depth
                           : uint8_t(a.max_qp_init_rd_atom);
  p->responder_resources = conn_param && conn_param->responder_resources != RDMA_MAX_RESP_RES
                               ? conn_param->responder_resources
                               : uint8_t(a.max_qp_rd_atom);
  const uint32_t qpn = p->id.qp ? p->id.qp->qp_num : (conn_param ? conn_param->qp_num : 0);
  const bool srq = p->id.qp ? p->id.qp->srq != nullptr : (conn_param && conn_param->srq);
  CommManager& cm = p->dev->cm();
  init_path_locked(p);

  if (p->id.qp_type == IBV_QPT_UD) {
    SidrReq req;
    req.service_id = ip_service_id(uint16_t(p->id.ps), p->dst_port);
    if (build_private_data(p, conn_param, true, req.private_data)) return fail_errno(EINVAL);
    p->comm_id = cm.create_id(id_handler(p));
    cm.send_sidr_req(p->comm_id, {p->dst_ip}, req);
  } else {
    Req req;
    if (build_private_data(p, conn_param, true, req.private_data)) return fail_errno(EINVAL);
    req.service_id = ip_service_id(uint16_t(p->id.ps), p->dst_port);
    req.local_qpn = qpn;
    req.initiator_depth = p->initiator_depth;
    req.flow_control = conn_param && conn_param->flow_control;
    p->seq_num = random_psn();
    req.starting_psn = p->seq_num;
    p->retry_count = conn_param ? std::min<uint8_t>(conn_param->retry_count, 7) : 7;
    if (p->id.qp_type == IBV_QPT_XRC_SEND) {
      // An XRC initiator (Linux cm_format_req: transport 3, extended type XRC; it has no
      // receive side: no responder resources, retry counts or SRQ in the REQ).
      req.transport = ReqTransport::kExtended;
      req.extended_transport = kExtendedTransportXrc;
    } else {
      req.transport = ReqTransport::kRc;
      req.responder_resources = p->responder_resources;
      req.retry_count = p->retry_count;
      req.rnr_retry_count = conn_param ? std::min<uint8_t>(conn_param->rnr_retry_count, 7) : 7;
      req.srq = srq;
    }
    req.pkey = 0xffff;
    req.path_mtu = p->path_mtu;
    req.vendor_id = p->local_ece.vendor_id & 0xffffff;
    req.primary.local_gid = gid_bytes(p->dev->ip());
    req.primary.remote_gid = gid_bytes(p->dst_ip);
    req.primary.packet_rate = p->dev->rate();
    req.primary.traffic_class = p->tos;
    req.primary.hop_limit = p->hop_limit;
    req.primary.sl = p->tos >> 5;
    req.primary.local_ack_timeout = p->local_ack_timeout;
    p->comm_id = cm.create_id(id_handler(p));
    cm.send_req(p->comm_id, {p->dst_ip}, req);
  }
  p->state = IdState::kConnect;
  p->dev->kick();
  log().debug("connecting {}:{} → {}:{}", ip_string(p->src_ip), p->src_port, ip_string(p->dst_ip),
              p->dst_port);
  return p->sync ? complete_sync_locked(p, lk) : 0;
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (!id) return fail_errno(EINVAL);
  std::unique_lock lk(g_mu);
  IdPriv* p = priv(id);
  if (p->state != IdState::kConnect || !p->comm_id || !p->dev) return fail_errno(EINVAL);
  if (!p->id.qp && !conn_param) return fail_errno(EINVAL);
  if (int e = check_conn_param(p, conn_param)) return fail_errno(e);
  CommManager& cm = p->dev->cm();
  const uint32_t qpn = p->id.qp ? p->id.qp->qp_num : conn_param->qp_num;

  if (p->id.qp_type == IBV_QPT_UD) {
    SidrRep rep;
    rep.status = SidrStatus::kSuccess;
    rep.qpn = qpn;
    rep.qkey = p->qkey;
    if (build_private_data(p, conn_param, false, rep.private_data)) return fail_errno(EINVAL);
    if (int e = cm.send_sidr_rep(p->comm_id, rep)) return fail_errno(e);
    return 0;
  }

  const ibv_device_attr& a = p->dev->attr();
  if (!conn_param || conn_param->initiator_depth == RDMA_MAX_INIT_DEPTH)
    p->initiator_depth = std::min(p->initiator_depth, uint8_t(a.max_qp_init_rd_atom));
  else
    p->initiator_depth = conn_param->initiator_depth;
  if (!conn_param || conn_param->responder_resources == RDMA_MAX_RESP_RES)
    p->responder_resources = std::min(p->responder_resources, uint8_t(a.max_qp_rd_atom));
  else
    p->responder_resources = conn_param->responder_resources;

  Rep rep;
  if (build_private_data(p, conn_param, false, rep.private_data)) return fail_errno(EINVAL);
  if (modify_qp_rtr_rts_locked(p, p->responder_resources, p->initiator_depth)) return -1;
  rep.local_qpn = qpn;
  rep.starting_psn = p->seq_num;
  rep.responder_resources = p->responder_resources;
  rep.initiator_depth = p->initiator_depth;
  rep.flow_control = conn_param && conn_param->flow_control;
  rep.rnr_retry_count = conn_param ? std::min<uint8_t>(conn_param->rnr_retry_count, 7) : 7;
  rep.srq = p->id.qp ? p->id.qp->srq != nullptr : conn_param->srq;
  rep.vendor_id = p->remote_ece.vendor_id & 0xffffff;
  if (int e = cm.send_rep(p->comm_id, rep)) {
    modify_qp_err_locked(p);
    return fail_errno(e);
  }
  p->dev->kick();
  return p->sync ? complete_sync_locked(p, lk) : 0;
}

static int reject_with_reason(rdma_cm_id* id, const void* private_data, uint8_t len,
                              RejReason reason) {
  if (!id) return fail_errno(EINVAL);
  std::lock_guard lk(g_mu);
  IdPriv* p = priv(id);
  if (!p->comm_id || !p->dev) return fail_errno(EINVAL);
  std::span<const uint8_t> pdata(static_cast<const uint8_t*>(private_data), private_data ? len : 0);
  CommManager& cm = p->dev->cm();
  if (p->id.qp_type == IBV_QPT_UD) {
    if (pdata.size() > kSidrRepPrivateBytes) return fail_errno(EINVAL);
    SidrRep rep;
    rep.status = SidrStatus::kReject;
    if (pdata.size() != 0) std::memcpy(rep.private_data.data(), pdata.data(), pdata.size());
    if (int e = cm.send_sidr_rep(p->comm_id, rep)) return fail_errno(e);
    return 0;
  }
  if (pdata.size() > kRejPrivateBytes) return fail_errno(EINVAL);
  if (int e = cm.send_rej(p->comm_id, reason, pdata)) return fail_errno(e);
  return 0;
}

int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return reject_with_reason(id, private_data, private_data_len, RejReason::kConsumerDefined);
}

int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return reject_with_reason(id, private_data, private_data_len,
                            RejReason::kVendorOptionNotSupported);
}

int rdma_disconnect(rdma_cm_id* id) {
  if (!id) return fail_errno(EINVAL);
  std::unique_lock lk(g_mu);
  IdPriv* p = priv(id);
  if (!p->id.verbs || !p->comm_id || !p->dev) return fail_errno(EINVAL);
  if (modify_qp_err_locked(p)) return -1;
  // Initiate, or answer the peer's DREQ (Linux rdma_disconnect); in other states a no-op.
  CommManager& cm = p->dev->cm();
  if (cm.send_dreq(p->comm_id, {}) != 0) cm.send_drep(p->comm_id, {});
  p->dev->kick();
  return p->sync ? complete_sync_locked(p, lk) : 0;
}

int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
  if (!id) return fail_errno(EINVAL);
  std::lock_guard lk(g_mu);
  IdPriv* p = priv(id);
  if (!p->comm_id || !p->dev) return fail_errno(EINVAL);
  if (event != IBV_EVENT_COMM_EST) return 0;
  if (int e = p->dev->cm().establish(p->comm_id)) return fail_errno(e);
  return 0;
}

int rdma_establish(rdma_cm_id* id) {
  if (!id || id->qp) return fail_errno(EINVAL);
  std::lock_guard lk(g_mu);
  return send_rtu_locked(priv(id));
}

int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (!id || id->qp || !ece || !ece->vendor_id || ece->comp_mask) return fail_errno(EINVAL);
  std::lock_guard lk(g_mu);
  priv(id)->local_ece.vendor_id = ece->vendor_id;
  priv(id)->local_ece.options = ece->options;
  return 0;
}

int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (!id || id->qp || !ece) return fail_errno(EINVAL);
  std::lock_guard lk(g_mu);
  ece->vendor_id = priv(id)->remote_ece.vendor_id;
  ece->options = priv(id)->remote_ece.options;
  ece->comp_mask = 0;
  return 0;
}

}  // extern "C"
