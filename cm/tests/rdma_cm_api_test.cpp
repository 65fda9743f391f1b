// softrdma's librdmacm.so.1 through its C API, in one process holding two softrdma devices
// (127.0.63.60 and 127.0.63.61, opened by rdma_bind_addr / rdma_resolve_addr): event channels
// as fds, the errno of invalid calls (as librdmacm over the kernel's rdma_cm), RC connections
// with data, rejects, UD over SIDR, the synchronous endpoint API, and ID migration; and, with
// a client process that misbehaves (cm_peer_helper, 127.0.63.62-65), a peer that exits
// without cleaning up and one that dies mid-handshake. Every wait is bounded (poll with a
// timeout); nothing sleeps blindly.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <spawn.h>
#include <sys/wait.h>

#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

constexpr const char* kServerIp = "127.0.63.60";
constexpr const char* kClientIp = "127.0.63.61";
constexpr int kWaitMs = 10'000;

sockaddr_in addr(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}
sockaddr* sa(sockaddr_in& a) {
  return reinterpret_cast<sockaddr*>(&a);
}

/// The next event on `ch` within kWaitMs; nullptr on timeout (a test failure, not a hang).
rdma_cm_event* next_event(rdma_event_channel* ch) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, kWaitMs) != 1) return nullptr;
  rdma_cm_event* ev = nullptr;
  return rdma_get_cm_event(ch, &ev) == 0 ? ev : nullptr;
}

/// Waits for an event of `type` (any other is a failure); acknowledges it unless `keep`.
rdma_cm_event* expect_event(rdma_event_channel* ch, rdma_cm_event_type type, int status = 0,
                            bool keep = false) {
  rdma_cm_event* ev = next_event(ch);
  EXPECT_NE(ev, nullptr) << "no event within " << kWaitMs << " ms, expected "
                         << rdma_event_str(type);
  if (!ev) return nullptr;
  EXPECT_EQ(ev->event, type) << rdma_event_str(ev->event) << " instead of " << rdma_event_str(type);
  EXPECT_EQ(ev->status, status) << rdma_event_str(ev->event);
  if (!keep) {
    rdma_ack_cm_event(ev);
    return nullptr;
  }
  return ev;
}

struct Channel {
  rdma_event_channel* ch = rdma_create_event_channel();
  ~Channel() {
    if (ch) rdma_destroy_event_channel(ch);
  }
};

/// The errno of a failed call (-1 expected).
#define EXPECT_ERRNO(call, e)                                  \
  do {                                                         \
    errno = 0;                                                 \
    EXPECT_EQ((call), -1) << #call;                            \
    EXPECT_EQ(errno, (e)) << #call << ": " << strerror(errno); \
  } while (0)

TEST(RdmaCmApi, EventChannelIsAPollableFdAndNonBlockingGetFailsWithEagain) {
  Channel c;
  ASSERT_NE(c.ch, nullptr) << strerror(errno);
  int fl = fcntl(c.ch->fd, F_GETFL);
  ASSERT_EQ(fcntl(c.ch->fd, F_SETFL, fl | O_NONBLOCK), 0);
  rdma_cm_event* ev = nullptr;
  EXPECT_ERRNO(rdma_get_cm_event(c.ch, &ev), EAGAIN);
  pollfd p{c.ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);  // nothing to read

  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(c.ch, &id, nullptr, RDMA_PS_TCP), 0);
  auto src = addr(kClientIp, 0), dst = addr(kServerIp, 18340);
  ASSERT_EQ(rdma_bind_addr(id, sa(src)), 0) << strerror(errno);
  EXPECT_NE(rdma_get_src_port(id), 0);  // an ephemeral port
  // The server address has a device only once something opens it: open it here.
  rdma_cm_id* srv = nullptr;
  ASSERT_EQ(rdma_create_id(c.ch, &srv, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_bind_addr(srv, sa(dst)), 0) << strerror(errno);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0) << strerror(errno);
  EXPECT_EQ(poll(&p, 1, kWaitMs), 1);
  EXPECT_TRUE(p.revents & POLLIN);
  ASSERT_EQ(rdma_get_cm_event(c.ch, &ev), 0);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(ev->id, id);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(poll(&p, 1, 0), 0);  // drained again
  EXPECT_NE(id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(id->verbs->device), "srdma0");
  EXPECT_EQ(rdma_get_dst_port(id), htons(18340));
  EXPECT_EQ(rdma_destroy_id(id), 0);
  EXPECT_EQ(rdma_destroy_id(srv), 0);
}

// A signal interrupts a blocking rdma_get_cm_event: -1 with errno EINTR, as librdmacm's
// read() of the kernel's channel (a program's timer or Ctrl-C handler ends its wait).
TEST(RdmaCmApi, ASignalInterruptsABlockingGetWithEintr) {
  Channel c;
  ASSERT_NE(c.ch, nullptr) << strerror(errno);
  struct sigaction sa{}, old{};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART
  ASSERT_EQ(sigaction(SIGALRM, &sa, &old), 0);
  ualarm(100'000, 0);
  rdma_cm_event* ev = nullptr;
  EXPECT_ERRNO(rdma_get_cm_event(c.ch, &ev), EINTR);
  ualarm(0, 0);
  ASSERT_EQ(sigaction(SIGALRM, &old, nullptr), 0);
}

TEST(RdmaCmApi, InvalidCallsFailWithLibrdmacmsErrno) {
  Channel c;
  rdma_cm_id* id = nullptr;
  EXPECT_ERRNO(rdma_create_id(c.ch, &id, nullptr, static_cast<rdma_port_space>(0x1234)), EINVAL);
  ASSERT_EQ(rdma_create_id(c.ch, &id, nullptr, RDMA_PS_TCP), 0);
  EXPECT_ERRNO(rdma_bind_addr(id, nullptr), EINVAL);
  sockaddr bad{};
  bad.sa_family = AF_UNIX;
  EXPECT_ERRNO(rdma_bind_addr(id, &bad), EINVAL);
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "2001:db8::1", &v6.sin6_addr);
  EXPECT_ERRNO(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&v6)), EAFNOSUPPORT);
  auto far = addr("192.0.2.1", 18341);  // TEST-NET-1: not this host's
  EXPECT_ERRNO(rdma_bind_addr(id, sa(far)), EADDRNOTAVAIL);
  EXPECT_ERRNO(rdma_resolve_route(id, 2000), EINVAL);  // no address yet
  rdma_conn_param p{};
  p.responder_resources = 1;
  EXPECT_ERRNO(rdma_connect(id, &p), EINVAL);  // no route
  EXPECT_ERRNO(rdma_accept(id, &p), EINVAL);   // no request
  EXPECT_ERRNO(rdma_reject(id, nullptr, 0), EINVAL);
  EXPECT_ERRNO(rdma_disconnect(id), EINVAL);
  EXPECT_ERRNO(rdma_notify(id, IBV_EVENT_COMM_EST), EINVAL);
  EXPECT_ERRNO(rdma_establish(id), EINVAL);
  uint8_t tos = 0;
  EXPECT_ERRNO(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 4), EINVAL);
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1), 0);
  EXPECT_ERRNO(rdma_set_option(id, RDMA_OPTION_ID, 99, &tos, 1), ENOSYS);
  EXPECT_ERRNO(rdma_set_option(id, 7, 0, &tos, 1), ENOSYS);
  ibv_qp_attr qa{};
  int mask = 0;
  qa.qp_state = IBV_QPS_RTR;
  EXPECT_ERRNO(rdma_init_qp_attr(id, &qa, &mask), EINVAL);  // no device, no connection

  auto here = addr(kServerIp, 18341);
  ASSERT_EQ(rdma_bind_addr(id, sa(here)), 0) << strerror(errno);
  EXPECT_ERRNO(rdma_bind_addr(id, sa(here)), EINVAL);  // bound already
  rdma_cm_id* other = nullptr;
  ASSERT_EQ(rdma_create_id(c.ch, &other, nullptr, RDMA_PS_TCP), 0);
  EXPECT_ERRNO(rdma_bind_addr(other, sa(here)), EADDRINUSE);
  ASSERT_EQ(rdma_listen(id, 1), 0);
  EXPECT_EQ(rdma_listen(id, 4), 0);  // listening again only changes the backlog
  rdma_cm_id* req = nullptr;
  EXPECT_ERRNO(rdma_get_request(id, &req), EINVAL);  // not a synchronous ID
  EXPECT_ERRNO(rdma_ack_cm_event(nullptr), EINVAL);
  auto group = addr("239.1.1.1", 0);
  EXPECT_ERRNO(rdma_join_multicast(id, sa(group), nullptr), EINVAL);  // a listening ID
  rdma_addrinfo* res = nullptr;
  EXPECT_ERRNO(rdma_getaddrinfo(nullptr, nullptr, nullptr, &res), EINVAL);
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_REJECTED), "RDMA_CM_EVENT_REJECTED");
  EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(99)), "UNKNOWN EVENT");
  int n = 0;
  ibv_context** devs = rdma_get_devices(&n);
  ASSERT_NE(devs, nullptr);
  EXPECT_GE(n, 1);
  EXPECT_EQ(devs[n], nullptr);
  rdma_free_devices(devs);
  EXPECT_EQ(rdma_destroy_id(other), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

/// A client and a server ID pair, connected (RC) with QPs made by rdma_create_qp.
struct RcPair {
  Channel sc, cc;
  rdma_cm_id* listen = nullptr;
  rdma_cm_id* server = nullptr;
  rdma_cm_id* client = nullptr;
  uint16_t port;

  explicit RcPair(uint16_t p) : port(p) {}

  ibv_qp_init_attr qp_attr() {
    ibv_qp_init_attr a{};
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = a.cap.max_recv_wr = 8;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.sq_sig_all = 1;
    return a;
  }

  /// Listen, resolve, connect: up to the server's CONNECT_REQUEST (returned, unacked).
  rdma_cm_event* request(const rdma_conn_param* cp) {
    auto s = addr(kServerIp, port), src = addr(kClientIp, 0);
    EXPECT_EQ(rdma_create_id(sc.ch, &listen, nullptr, RDMA_PS_TCP), 0);
    EXPECT_EQ(rdma_bind_addr(listen, sa(s)), 0) << strerror(errno);
    EXPECT_EQ(rdma_listen(listen, 1), 0) << strerror(errno);
    EXPECT_EQ(rdma_create_id(cc.ch, &client, nullptr, RDMA_PS_TCP), 0);
    EXPECT_EQ(rdma_resolve_addr(client, sa(src), sa(s), 2000), 0) << strerror(errno);
    expect_event(cc.ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    EXPECT_EQ(rdma_resolve_route(client, 2000), 0) << strerror(errno);
    expect_event(cc.ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    EXPECT_NE(client->route.path_rec, nullptr);
    EXPECT_EQ(client->route.num_paths, 1);
    ibv_qp_init_attr a = qp_attr();
    EXPECT_EQ(rdma_create_qp(client, nullptr, &a), 0) << strerror(errno);
    rdma_conn_param p{};
    if (cp) p = *cp;
    p.responder_resources = p.initiator_depth = 1;
    p.retry_count = p.rnr_retry_count = 7;
    EXPECT_EQ(rdma_connect(client, &p), 0) << strerror(errno);
    rdma_cm_event* ev = expect_event(sc.ch, RDMA_CM_EVENT_CONNECT_REQUEST, 0, true);
    if (ev) {
      server = ev->id;
      EXPECT_EQ(ev->listen_id, listen);
    }
    return ev;
  }

  void accept() {
    ibv_qp_init_attr a = qp_attr();
    ASSERT_EQ(rdma_create_qp(server, nullptr, &a), 0) << strerror(errno);
    rdma_conn_param p{};
    p.responder_resources = p.initiator_depth = 1;
    const char hello[] = "welcome";
    p.private_data = hello;
    p.private_data_len = sizeof hello;
    ASSERT_EQ(rdma_accept(server, &p), 0) << strerror(errno);
    rdma_cm_event* est = expect_event(cc.ch, RDMA_CM_EVENT_ESTABLISHED, 0, true);
    ASSERT_NE(est, nullptr);
    EXPECT_STREQ(static_cast<const char*>(est->param.conn.private_data), "welcome");
    EXPECT_EQ(est->param.conn.qp_num, server->qp->qp_num);
    rdma_ack_cm_event(est);
    expect_event(sc.ch, RDMA_CM_EVENT_ESTABLISHED);
  }

  ~RcPair() {
    for (rdma_cm_id* id : {client, server}) {
      if (!id) continue;
      if (id->qp) rdma_destroy_qp(id);
      rdma_destroy_id(id);
    }
    if (listen) rdma_destroy_id(listen);
  }
};

TEST(RdmaCmApi, RcConnectExchangesPrivateDataCarriesTrafficAndDisconnects) {
  RcPair x(18342);
  const char hi[] = "hello from the client";
  rdma_conn_param cp{};
  cp.private_data = hi;
  cp.private_data_len = sizeof hi;
  rdma_cm_event* req = x.request(&cp);
  ASSERT_NE(req, nullptr);
  EXPECT_STREQ(static_cast<const char*>(req->param.conn.private_data), hi);
  EXPECT_EQ(req->param.conn.private_data_len, 56);  // REQ's 92 bytes less the IP CM header
  EXPECT_EQ(req->param.conn.qp_num, x.client->qp->qp_num);
  sockaddr_in* peer = reinterpret_cast<sockaddr_in*>(rdma_get_peer_addr(x.server));
  char buf[INET_ADDRSTRLEN];
  EXPECT_STREQ(inet_ntop(AF_INET, &peer->sin_addr, buf, sizeof buf), kClientIp);
  EXPECT_EQ(peer->sin_port, rdma_get_src_port(x.client));
  rdma_ack_cm_event(req);
  x.accept();
  if (HasFatalFailure()) return;

  // One SEND each way through librdmacm's inline helpers (rdma_verbs.h).
  char rx[64] = {}, tx[64] = "ping";
  ibv_mr* rmr = rdma_reg_msgs(x.server, rx, sizeof rx);
  ibv_mr* smr = rdma_reg_msgs(x.client, tx, sizeof tx);
  ASSERT_TRUE(rmr && smr);
  ASSERT_EQ(rdma_post_recv(x.server, nullptr, rx, sizeof rx, rmr), 0);
  ASSERT_EQ(rdma_post_send(x.client, nullptr, tx, sizeof tx, smr, 0), 0);
  ibv_wc wc{};
  ASSERT_EQ(rdma_get_send_comp(x.client, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(rdma_get_recv_comp(x.server, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(rx, "ping");
  rdma_dereg_mr(rmr);
  rdma_dereg_mr(smr);

  ASSERT_EQ(rdma_disconnect(x.client), 0) << strerror(errno);
  expect_event(x.sc.ch, RDMA_CM_EVENT_DISCONNECTED);
  ASSERT_EQ(rdma_disconnect(x.server), 0) << strerror(errno);  // answers the DREQ
  expect_event(x.cc.ch, RDMA_CM_EVENT_DISCONNECTED);
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(x.client->qp, &qa, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_ERR);  // rdma_disconnect moved it
}

TEST(RdmaCmApi, RejectReachesTheClientWithReasonAndPrivateData) {
  RcPair x(18343);
  rdma_cm_event* req = x.request(nullptr);
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  const char why[] = "not today";
  ASSERT_EQ(rdma_reject(x.server, why, sizeof why), 0) << strerror(errno);
  rdma_cm_event* ev = expect_event(x.cc.ch, RDMA_CM_EVENT_REJECTED, 28, true);
  ASSERT_NE(ev, nullptr);
  EXPECT_STREQ(static_cast<const char*>(ev->param.conn.private_data), why);
  rdma_ack_cm_event(ev);
}

TEST(RdmaCmApi, ConnectToAPortNobodyListensOnIsRejectedStatus8) {
  Channel c;
  rdma_cm_id* srv = nullptr;  // a device at the server address, listening elsewhere
  auto s = addr(kServerIp, 18345), other = addr(kServerIp, 18346), src = addr(kClientIp, 0);
  ASSERT_EQ(rdma_create_id(c.ch, &srv, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_bind_addr(srv, sa(other)), 0) << strerror(errno);
  ASSERT_EQ(rdma_listen(srv, 1), 0);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(c.ch, &id, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_resolve_addr(id, sa(src), sa(s), 2000), 0);
  expect_event(c.ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  expect_event(c.ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  rdma_conn_param p{};
  p.qp_num = 0x123;  // no QP on the ID: the REQ names this one
  ASSERT_EQ(rdma_connect(id, &p), 0) << strerror(errno);
  expect_event(c.ch, RDMA_CM_EVENT_REJECTED, 8);  // IB_CM_REJ_INVALID_SERVICE_ID
  EXPECT_EQ(rdma_destroy_id(id), 0);
  EXPECT_EQ(rdma_destroy_id(srv), 0);
}

TEST(RdmaCmApi, UdResolvesThePeersQpnAndQkeyWithSidr) {
  Channel sc, cc;
  rdma_cm_id *listen = nullptr, *client = nullptr;
  auto s = addr(kServerIp, 18347), src = addr(kClientIp, 0);
  ASSERT_EQ(rdma_create_id(sc.ch, &listen, nullptr, RDMA_PS_UDP), 0);
  ASSERT_EQ(rdma_bind_addr(listen, sa(s)), 0) << strerror(errno);
  ASSERT_EQ(rdma_listen(listen, 1), 0);
  ASSERT_EQ(rdma_create_id(cc.ch, &client, nullptr, RDMA_PS_UDP), 0);
  ASSERT_EQ(rdma_resolve_addr(client, sa(src), sa(s), 2000), 0);
  expect_event(cc.ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  expect_event(cc.ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  rdma_conn_param p{};
  p.qp_num = 0x456;
  ASSERT_EQ(rdma_connect(client, &p), 0) << strerror(errno);
  rdma_cm_event* req = expect_event(sc.ch, RDMA_CM_EVENT_CONNECT_REQUEST, 0, true);
  ASSERT_NE(req, nullptr);
  EXPECT_EQ(req->param.ud.private_data_len, 180);
  rdma_cm_id* server = req->id;
  rdma_ack_cm_event(req);
  rdma_conn_param a{};
  a.qp_num = 0x789;
  ASSERT_EQ(rdma_accept(server, &a), 0) << strerror(errno);
  rdma_cm_event* est = expect_event(cc.ch, RDMA_CM_EVENT_ESTABLISHED, 0, true);
  ASSERT_NE(est, nullptr);
  EXPECT_EQ(est->param.ud.qp_num, 0x789u);
  EXPECT_EQ(est->param.ud.qkey, uint32_t(RDMA_UDP_QKEY));
  EXPECT_EQ(est->param.ud.ah_attr.is_global, 1);
  rdma_ack_cm_event(est);
  EXPECT_EQ(rdma_destroy_id(server), 0);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(listen), 0);
}

// Multicast (RoCE: no SA): the join event at once, with the group's GID, QPN 0xFFFFFF,
// RDMA_UDP_QKEY and the join's context; the ID's QP is attached when the event is fetched, so
// a datagram from the other device to the group arrives (GRH first); after
// rdma_leave_multicast the QP is detached and a second datagram does not. And the errno of the
// calls that cannot be made (librdmacm over the kernel's rdma_cm).
TEST(RdmaCmApi, MulticastJoinAttachesTheQpAndLeaveDetachesIt) {
  Channel rc, sc;
  rdma_cm_id *rx = nullptr, *tx = nullptr;
  auto group = addr("239.63.0.60", 0), unicast = addr(kClientIp, 0);
  auto rx_addr = addr(kServerIp, 0), tx_addr = addr(kClientIp, 0);
  ASSERT_EQ(rdma_create_id(rc.ch, &rx, nullptr, RDMA_PS_UDP), 0);
  EXPECT_ERRNO(rdma_join_multicast(rx, sa(group), nullptr), EINVAL);  // not bound yet
  ASSERT_EQ(rdma_bind_addr(rx, sa(rx_addr)), 0) << strerror(errno);
  EXPECT_ERRNO(rdma_join_multicast(rx, sa(unicast), nullptr), EINVAL);  // not a group
  EXPECT_ERRNO(rdma_leave_multicast(rx, sa(group)), EADDRNOTAVAIL);     // never joined
  rdma_cm_join_mc_attr_ex bad{};
  bad.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;  // no join flags
  bad.addr = sa(group);
  EXPECT_ERRNO(rdma_join_multicast_ex(rx, &bad, nullptr), EINVAL);
  bad.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
  EXPECT_ERRNO(rdma_join_multicast_ex(rx, &bad, nullptr), ENOTSUP);

  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_UD;
  qa.cap = {4, 4, 1, 1, 0};
  ASSERT_EQ(rdma_create_qp(rx, nullptr, &qa), 0) << strerror(errno);
  int context = 0;
  ASSERT_EQ(rdma_join_multicast(rx, sa(group), &context), 0) << strerror(errno);
  rdma_cm_event* join = expect_event(rc.ch, RDMA_CM_EVENT_MULTICAST_JOIN, 0, true);
  ASSERT_NE(join, nullptr);
  EXPECT_EQ(join->param.ud.private_data, &context);
  EXPECT_EQ(join->param.ud.qp_num, 0xffffffu);
  EXPECT_EQ(join->param.ud.qkey, uint32_t(RDMA_UDP_QKEY));
  const ibv_ah_attr group_ah = join->param.ud.ah_attr;
  EXPECT_EQ(group_ah.is_global, 1);
  const uint8_t mgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 63, 0, 60};
  EXPECT_EQ(std::memcmp(group_ah.grh.dgid.raw, mgid, 16), 0) << "::ffff:239.63.0.60";
  rdma_ack_cm_event(join);

  // A sender on the other device: a UD QP, an AH to the group, QPN 0xFFFFFF.
  ASSERT_EQ(rdma_create_id(sc.ch, &tx, nullptr, RDMA_PS_UDP), 0);
  ASSERT_EQ(rdma_bind_addr(tx, sa(tx_addr)), 0) << strerror(errno);
  qa.send_cq = qa.recv_cq = nullptr;  // rdma_create_qp filled in rx's
  ASSERT_EQ(rdma_create_qp(tx, nullptr, &qa), 0) << strerror(errno);
  ibv_ah_attr ah_attr = group_ah;
  ibv_ah* ah = ibv_create_ah(tx->pd, &ah_attr);
  ASSERT_NE(ah, nullptr) << strerror(errno);
  std::vector<char> rbuf(40 + 64), sbuf(64, 'm');
  ibv_mr* rmr = rdma_reg_msgs(rx, rbuf.data(), rbuf.size());
  ibv_mr* smr = rdma_reg_msgs(tx, sbuf.data(), sbuf.size());
  ASSERT_TRUE(rmr && smr);
  auto poll_one = [](ibv_cq* cq, ibv_wc& wc, int ms) {
    for (int i = 0; i < ms; ++i) {
      if (ibv_poll_cq(cq, 1, &wc) == 1) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  };
  ibv_wc wc{};
  for (int round = 0; round < 2; ++round) {  // joined, then left
    ASSERT_EQ(rdma_post_recv(rx, nullptr, rbuf.data(), rbuf.size(), rmr), 0);
    ASSERT_EQ(rdma_post_ud_send(tx, nullptr, sbuf.data(), sbuf.size(), smr, IBV_SEND_SIGNALED, ah,
                                0xffffff),
              0);
    ASSERT_TRUE(poll_one(tx->send_cq, wc, kWaitMs));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    if (round == 0) {
      ASSERT_TRUE(poll_one(rx->recv_cq, wc, kWaitMs)) << "the group's datagram did not arrive";
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_EQ(wc.byte_len, 40u + 64u);
      EXPECT_EQ(wc.src_qp, tx->qp->qp_num);
      EXPECT_EQ(std::memcmp(rbuf.data() + 40, sbuf.data(), 64), 0);
      EXPECT_EQ(ibv_destroy_qp(rx->qp), EBUSY) << "a QP attached to a group";
      ASSERT_EQ(rdma_leave_multicast(rx, sa(group)), 0) << strerror(errno);
      EXPECT_ERRNO(rdma_leave_multicast(rx, sa(group)), EADDRNOTAVAIL);
    } else {
      EXPECT_FALSE(poll_one(rx->recv_cq, wc, 100)) << "received after leaving the group";
    }
  }
  ibv_destroy_ah(ah);
  rdma_dereg_mr(rmr);
  rdma_dereg_mr(smr);
  rdma_destroy_qp(tx);
  rdma_destroy_qp(rx);
  EXPECT_EQ(rdma_destroy_id(tx), 0);
  EXPECT_EQ(rdma_destroy_id(rx), 0);
}

TEST(RdmaCmApi, SynchronousEndpointsConnectThroughCreateEpAndGetRequest) {
  rdma_addrinfo hints{}, *res = nullptr;
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo(kServerIp, "18348", &hints, &res), 0);
  ibv_qp_init_attr attr{};
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.sq_sig_all = 1;
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_ep(&listen, res, nullptr, &attr), 0) << strerror(errno);
  rdma_freeaddrinfo(res);
  ASSERT_EQ(rdma_listen(listen, 1), 0);

  int client_rc = -1;
  std::thread client([&] {
    rdma_addrinfo h{}, *r = nullptr;
    h.ai_port_space = RDMA_PS_TCP;
    auto src = addr(kClientIp, 0);
    h.ai_src_addr = sa(src);
    h.ai_src_len = sizeof src;
    if (rdma_getaddrinfo(kServerIp, "18348", &h, &r)) return;
    ibv_qp_init_attr a{};
    a.cap.max_send_wr = a.cap.max_recv_wr = 2;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.sq_sig_all = 1;
    rdma_cm_id* id = nullptr;
    if (rdma_create_ep(&id, r, nullptr, &a) == 0) {
      client_rc = rdma_connect(id, nullptr);
      if (client_rc == 0) client_rc = rdma_disconnect(id);
      rdma_destroy_ep(id);
    }
    rdma_freeaddrinfo(r);
  });
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_get_request(listen, &id), 0) << strerror(errno);
  ASSERT_NE(id->qp, nullptr);  // made from the endpoint's qp_init_attr
  EXPECT_EQ(rdma_accept(id, nullptr), 0) << strerror(errno);
  EXPECT_EQ(rdma_disconnect(id), 0) << strerror(errno);
  client.join();
  EXPECT_EQ(client_rc, 0) << strerror(errno);
  rdma_destroy_ep(id);
  rdma_destroy_ep(listen);
}

TEST(RdmaCmApi, MigratedIdReportsOnItsNewChannel) {
  Channel a, b;
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(a.ch, &id, nullptr, RDMA_PS_TCP), 0);
  auto src = addr(kClientIp, 0), dst = addr(kServerIp, 18349);
  rdma_cm_id* srv = nullptr;
  ASSERT_EQ(rdma_create_id(a.ch, &srv, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_bind_addr(srv, sa(dst)), 0);
  ASSERT_EQ(rdma_migrate_id(id, b.ch), 0);
  EXPECT_EQ(id->channel, b.ch);
  ASSERT_EQ(rdma_resolve_addr(id, sa(src), sa(dst), 2000), 0);
  expect_event(b.ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  pollfd p{a.ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);  // nothing on the old channel
  EXPECT_EQ(rdma_destroy_id(id), 0);
  EXPECT_EQ(rdma_destroy_id(srv), 0);
}

/// Runs cm_peer_helper (a client that misbehaves) with `extra_env` added; returns its pid.
pid_t spawn_helper(std::vector<std::string> args, std::vector<std::string> extra_env = {}) {
  args.insert(args.begin(), CM_PEER_HELPER);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env(extra_env);
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, CM_PEER_HELPER, nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  return pid;
}

/// A listening ID on ip:port (its device opened there).
void listen_on(rdma_event_channel* ch, rdma_cm_id** listen, const char* ip, uint16_t port) {
  auto s = addr(ip, port);
  EXPECT_EQ(rdma_create_id(ch, listen, nullptr, RDMA_PS_TCP), 0);
  EXPECT_EQ(rdma_bind_addr(*listen, sa(s)), 0) << strerror(errno);
  EXPECT_EQ(rdma_listen(*listen, 1), 0);
}

TEST(RdmaCmApi, PeerThatExitsWithoutCleaningUpStillDisconnects) {
  Channel c;
  rdma_cm_id* listen = nullptr;
  listen_on(c.ch, &listen, "127.0.63.62", 18350);
  pid_t pid = spawn_helper({"exit-after-connect", "127.0.63.62", "18350", "127.0.63.63"});
  ASSERT_GT(pid, 0);
  rdma_cm_event* req = expect_event(c.ch, RDMA_CM_EVENT_CONNECT_REQUEST, 0, true);
  ASSERT_NE(req, nullptr);
  rdma_cm_id* id = req->id;
  rdma_ack_cm_event(req);
  ibv_qp_init_attr a{};
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  ASSERT_EQ(rdma_create_qp(id, nullptr, &a), 0);
  rdma_conn_param p{};
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_accept(id, &p), 0);
  expect_event(c.ch, RDMA_CM_EVENT_ESTABLISHED);
  // The helper exits without rdma_disconnect: its library's unload sends the DREQ.
  expect_event(c.ch, RDMA_CM_EVENT_DISCONNECTED);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  rdma_destroy_qp(id);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  EXPECT_EQ(rdma_destroy_id(listen), 0);
}

TEST(RdmaCmApi, PeerThatDiesBeforeItsRtuEndsInUnreachable) {
  Channel c;
  rdma_cm_id* listen = nullptr;
  listen_on(c.ch, &listen, "127.0.63.64", 18351);
  // The helper's REQ asks for short CM timeouts (2 × 268 ms + 4 ms per try, 3 tries).
  pid_t pid = spawn_helper({"die-before-rtu", "127.0.63.64", "18351", "127.0.63.65"},
                           {"SOFTRDMA_CM_RESPONSE_TIMEOUT=10", "SOFTRDMA_CM_RETRIES=2"});
  ASSERT_GT(pid, 0);
  rdma_cm_event* req = expect_event(c.ch, RDMA_CM_EVENT_CONNECT_REQUEST, 0, true);
  ASSERT_NE(req, nullptr);
  rdma_cm_id* id = req->id;
  rdma_ack_cm_event(req);
  ibv_qp_init_attr a{};
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  ASSERT_EQ(rdma_create_qp(id, nullptr, &a), 0);
  rdma_conn_param p{};
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_accept(id, &p), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  // The REP is resent, then given up: UNREACHABLE, -ETIMEDOUT — not a hang.
  expect_event(c.ch, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
  rdma_destroy_qp(id);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  EXPECT_EQ(rdma_destroy_id(listen), 0);
}

}  // namespace
