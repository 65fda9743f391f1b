// A client process for the C API tests that misbehaves on purpose, run by
// rdma_cm_api_test.cpp (posix_spawn) so that a peer can die without taking the test with it:
//
//   cm_peer_helper MODE SERVER_IP PORT CLIENT_IP
//
// MODE:
//   exit-after-connect   connects (RC, a QP), then exit(0) without disconnecting or
//                        destroying anything: the library's unload must say goodbye (DREQ)
//   die-before-rtu       connects, lets the REP arrive but never fetches the
//                        CONNECT_RESPONSE (so never sends RTU), then SIGKILLs itself: the
//                        server's REP goes unanswered
// Exit status 0 when it got as far as it should (die-before-rtu never returns), 1 otherwise.
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "cm_peer_helper: %s: %s\n", what, std::strerror(errno));
  return 1;
}

bool next_event(rdma_event_channel* ch, rdma_cm_event_type want) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, 10'000) != 1) return false;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev)) return false;
  const bool ok = ev->event == want && ev->status == 0;
  if (!ok) std::fprintf(stderr, "cm_peer_helper: %s (%d)\n", rdma_event_str(ev->event), ev->status);
  rdma_ack_cm_event(ev);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s exit-after-connect|die-before-rtu SERVER PORT CLIENT\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  sockaddr_in dst{}, src{};
  dst.sin_family = src.sin_family = AF_INET;
  dst.sin_port = htons(uint16_t(std::atoi(argv[3])));
  inet_pton(AF_INET, argv[2], &dst.sin_addr);
  inet_pton(AF_INET, argv[4], &src.sin_addr);

  rdma_event_channel* ch = rdma_create_event_channel();
  if (!ch) return fail("rdma_create_event_channel");
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return fail("rdma_create_id");
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        2000) ||
      !next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED))
    return fail("rdma_resolve_addr");
  if (rdma_resolve_route(id, 2000) || !next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED))
    return fail("rdma_resolve_route");
  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, nullptr, &qa)) return fail("rdma_create_qp");
  rdma_conn_param p{};
  p.responder_resources = p.initiator_depth = 1;
  p.retry_count = p.rnr_retry_count = 7;
  if (rdma_connect(id, &p)) return fail("rdma_connect");

  if (mode == "die-before-rtu") {
    // The REP arrives and waits, unfetched, in the channel: no RTU ever leaves.
    pollfd w{ch->fd, POLLIN, 0};
    if (poll(&w, 1, 10'000) != 1) return fail("no CONNECT_RESPONSE");
    raise(SIGKILL);
  }
  if (!next_event(ch, RDMA_CM_EVENT_ESTABLISHED)) return fail("not established");
  std::printf("cm_peer_helper: established, exiting without cleaning up\n");
  std::fflush(stdout);
  std::exit(0);  // no rdma_disconnect, no rdma_destroy_id
}
