// The synchronous endpoint API of librdmacm (rdma_getaddrinfo, rdma_create_ep, rdma_get_request,
// rdma_destroy_ep): an rdma_addrinfo names the addresses, port space and QP type; an endpoint
// is an ID without an application channel, whose calls wait for their own events.
//
// rdma_getaddrinfo resolves names with getaddrinfo(3) as librdmacm does, keeping the first
// result — the first IPv4 one when the family is left open, softrdma devices being IPv4
// addresses. No ACM/IB service resolution (there is no IB SA on RoCE).
#include <netdb.h>

#include <cstdlib>
#include <cstring>

#include <rdma/rdma_verbs.h>

#include "cm/cm_device.h"
#include "cm/cma.h"

using namespace softrdma::cm;

namespace {

const rdma_addrinfo kNoHints{};

addrinfo to_addrinfo_hints(const rdma_addrinfo& rai) {
  addrinfo ai{};
  if (rai.ai_flags & RAI_PASSIVE) ai.ai_flags = AI_PASSIVE;
  if (rai.ai_flags & RAI_NUMERICHOST) ai.ai_flags |= AI_NUMERICHOST;
  if (rai.ai_family != AF_IB) ai.ai_family = rai.ai_family;
  switch (rai.ai_qp_type) {
    case IBV_QPT_RC:
    case IBV_QPT_UC:
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      ai.ai_socktype = SOCK_STREAM;
      break;
    case IBV_QPT_UD:
      ai.ai_socktype = SOCK_DGRAM;
      break;
    default:
      break;
  }
  switch (rai.ai_port_space) {
    case RDMA_PS_TCP:
      ai.ai_protocol = IPPROTO_TCP;
      break;
    case RDMA_PS_IPOIB:
    case RDMA_PS_UDP:
      ai.ai_protocol = IPPROTO_UDP;
      break;
    case RDMA_PS_IB:
      ai.ai_protocol = ai.ai_socktype == SOCK_DGRAM ? IPPROTO_UDP : IPPROTO_TCP;
      break;
    default:
      break;
  }
  return ai;
}

int copy_addr(sockaddr** dst, socklen_t* dst_len, const sockaddr* src, socklen_t len) {
  *dst = static_cast<sockaddr*>(std::malloc(len));
  if (!*dst) return fail_errno(ENOMEM);
  std::memcpy(*dst, src, len);
  *dst_len = len;
  return 0;
}

}  // namespace

extern "C" {

void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_connect);
    std::free(res->ai_route);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res);
    res = next;
  }
}

int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                     rdma_addrinfo** res) {
  if ((!service && !node && !hints) || !res) return fail_errno(EINVAL);
  if (int e = library_init()) return fail_errno(e);
  auto* rai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  if (!rai) return fail_errno(ENOMEM);
  if (!hints) hints = &kNoHints;
  int ret = 0;
  if (node || service) {
    addrinfo ah = to_addrinfo_hints(*hints);
    addrinfo* list = nullptr;
    ret = ::getaddrinfo(node, service, hints == &kNoHints ? nullptr : &ah, &list);
    if (ret) {
      std::free(rai);
      return ret;  // an EAI_* code, as librdmacm returns it (gai_strerror explains it)
    }
    const addrinfo* ai = list;
    if (hints->ai_family == AF_UNSPEC)  // prefer IPv4: a softrdma device is an IPv4 address
      for (const addrinfo* a = list; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
          ai = a;
          break;
        }
    rai->ai_qp_type = hints->ai_qp_type               ? hints->ai_qp_type
                      : ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD
                                                      : IBV_QPT_RC;
    rai->ai_port_space = hints->ai_port_space             ? hints->ai_port_space
                         : ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP
                                                          : RDMA_PS_TCP;
    rai->ai_family = ai->ai_family;
    if (ai->ai_flags & AI_PASSIVE) {
      rai->ai_flags = RAI_PASSIVE;
      if (ai->ai_canonname) rai->ai_src_canonname = strdup(ai->ai_canonname);
      ret = copy_addr(&rai->ai_src_addr, &rai->ai_src_len, ai->ai_addr, ai->ai_addrlen);
    } else {
      if (ai->ai_canonname) rai->ai_dst_canonname = strdup(ai->ai_canonname);
      ret = copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
    }
    ::freeaddrinfo(list);
  } else {
    rai->ai_flags = hints->ai_flags;
    rai->ai_family = hints->ai_family;
    rai->ai_qp_type = hints->ai_qp_type;
    rai->ai_port_space = hints->ai_port_space;
    if (hints->ai_dst_len)
      ret = copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, hints->ai_dst_addr, hints->ai_dst_len);
  }
  if (!ret && !rai->ai_src_len && hints->ai_src_len)
    ret = copy_addr(&rai->ai_src_addr, &rai->ai_src_len, hints->ai_src_addr, hints->ai_src_len);
  if (ret) {
    rdma_freeaddrinfo(rai);
    return ret;
  }
  *res = rai;
  return 0;
}

int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd,
                   ibv_qp_init_attr* qp_init_attr) {
  if (!id || !res) return fail_errno(EINVAL);
  if (int e = library_init()) return fail_errno(e);
  rdma_cm_id* cm_id = nullptr;
  {
    std::lock_guard lk(g_mu);
    IdPriv* p = alloc_id_locked(nullptr, nullptr, rdma_port_space(res->ai_port_space),
                                ibv_qp_type(res->ai_qp_type));
    if (!p) return -1;
    cm_id = &p->id;
  }
  IdPriv* p = priv(cm_id);
  auto fail = [&] {
    int e = errno;
    rdma_destroy_ep(cm_id);
    return fail_errno(e);
  };
  if (res->ai_flags & RAI_PASSIVE) {
    if (rdma_bind_addr(cm_id, res->ai_src_addr)) return fail();
    std::lock_guard lk(g_mu);
    if (pd) cm_id->pd = pd;
    if (qp_init_attr) {
      p->qp_init_attr = std::make_unique<ibv_qp_init_attr>(*qp_init_attr);
      p->qp_init_attr->qp_type = ibv_qp_type(res->ai_qp_type);
    }
    *id = cm_id;
    return 0;
  }
  if (rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000)) return fail();
  if (res->ai_route_len) {
    if (rdma_set_option(cm_id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, res->ai_route,
                        res->ai_route_len))
      return fail();
    std::unique_lock lk(g_mu);
    if (complete_sync_locked(p, lk)) return fail();
  } else if (rdma_resolve_route(cm_id, 2000)) {
    return fail();
  }
  if (qp_init_attr) {
    qp_init_attr->qp_type = ibv_qp_type(res->ai_qp_type);
    if (rdma_create_qp(cm_id, pd, qp_init_attr)) return fail();
  }
  if (res->ai_connect_len) {
    std::lock_guard lk(g_mu);
    const auto* c = static_cast<const uint8_t*>(res->ai_connect);
    p->connect_data.assign(c, c + res->ai_connect_len);
  }
  *id = cm_id;
  return 0;
}

void rdma_destroy_ep(rdma_cm_id* id) {
  if (!id) return;
  if (id->qp) rdma_destroy_qp(id);
  if (id->srq) rdma_destroy_srq(id);
  rdma_destroy_id(id);
}

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (!listen || !id) return fail_errno(EINVAL);
  std::unique_lock lk(g_mu);
  IdPriv* l = priv(listen);
  if (!l->sync) return fail_errno(EINVAL);
  if (listen->event) {
    auto* old = reinterpret_cast<CmaEvent*>(listen->event);
    listen->event = nullptr;
    ++old->owner->events_completed;
    delete old;
    g_cv.notify_all();
  }
  rdma_cm_event* event = nullptr;
  if (get_event_locked(l->channel(), &event, lk)) return -1;
  int err = 0;
  if (event->event == RDMA_CM_EVENT_REJECTED)
    err = ECONNREFUSED;
  else if (event->status)
    err = event->status < 0 ? -event->status : event->status;
  else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST)
    err = EINVAL;
  if (err) {
    listen->event = event;
    return fail_errno(err);
  }
  std::unique_ptr<ibv_qp_init_attr> attr;
  if (l->qp_init_attr) attr = std::make_unique<ibv_qp_init_attr>(*l->qp_init_attr);
  ibv_pd* pd = listen->pd;
  lk.unlock();
  if (attr && rdma_create_qp(event->id, pd, attr.get())) {
    int e = errno;
    lk.lock();
    listen->event = event;
    return fail_errno(e);
  }
  *id = event->id;
  (*id)->event = event;
  return 0;
}

}  // extern "C"
