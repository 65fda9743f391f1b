// The RDMA-CM's bind rule when the process has declared its devices (SOFTRDMA_ADDR set, as
// `softrdma run --addr` does; ctest runs this with SOFTRDMA_ADDR=127.0.63.70): a bind to an
// address of this host outside that list attaches no device (id->verbs NULL, source GID zero),
// as the kernel's rdma_cm binds an address whose net device has no RDMA device; a listen there
// hears only requests addressed to it; binding a declared address attaches its device; and
// an ID resolved from an unattached one gets the default device. libfabric's verbs provider
// depends on it (issue 22 item 4: its listener bound 127.0.0.1, got a second device and
// fi_enable failed with EINVAL). Every wait is bounded (poll with a timeout).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr const char* kDeclared = "127.0.63.70";  // SOFTRDMA_ADDR of this process
constexpr const char* kUndeclared = "127.0.63.71";
constexpr int kWaitMs = 10'000;

sockaddr_in addr(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

/// One event channel and one RC ID on it, destroyed at scope exit.
struct Id {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  Id() {
    if (ch) rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP);
  }
  ~Id() {
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
  }
  int bind(const char* ip, uint16_t port) {
    sockaddr_in a = addr(ip, port);
    return rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a));
  }
  /// The next event's type within kWaitMs, or -1.
  int next_event() {
    pollfd p{ch->fd, POLLIN, 0};
    if (poll(&p, 1, kWaitMs) != 1) return -1;
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) != 0) return -1;
    const int type = ev->event;
    rdma_ack_cm_event(ev);
    return type;
  }
};

bool gid_is_zero(const ibv_gid& g) {
  static const ibv_gid zero{};
  return std::memcmp(&g, &zero, sizeof g) == 0;
}

class DeclaredAddress : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* a = std::getenv("SOFTRDMA_ADDR");
    if (!a || std::string(a) != kDeclared)
      GTEST_SKIP() << "run with SOFTRDMA_ADDR=" << kDeclared << " (ctest does)";
  }
};

TEST_F(DeclaredAddress, BindingTheDeclaredAddressAttachesItsDevice) {
  Id x;
  ASSERT_TRUE(x.id);
  ASSERT_EQ(x.bind(kDeclared, 0), 0) << strerror(errno);
  EXPECT_NE(x.id->verbs, nullptr);
  EXPECT_FALSE(gid_is_zero(x.id->route.addr.addr.ibaddr.sgid));
}

TEST_F(DeclaredAddress, BindingAnotherLocalAddressAttachesNoDevice) {
  for (const char* ip : {"127.0.0.1", kUndeclared}) {
    Id x;
    ASSERT_TRUE(x.id);
    ASSERT_EQ(x.bind(ip, 0), 0) << ip << ": " << strerror(errno);
    EXPECT_EQ(x.id->verbs, nullptr) << ip;
    EXPECT_TRUE(gid_is_zero(x.id->route.addr.addr.ibaddr.sgid)) << ip;
    // The source address is the one bound, with a port.
    auto* src = reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(x.id));
    char buf[INET_ADDRSTRLEN];
    EXPECT_STREQ(inet_ntop(AF_INET, &src->sin_addr, buf, sizeof buf), ip);
    EXPECT_NE(src->sin_port, 0);
    EXPECT_EQ(rdma_listen(x.id, 4), 0) << strerror(errno);
  }
  // An address that is not this host's stays EADDRNOTAVAIL.
  Id y;
  errno = 0;
  EXPECT_EQ(y.bind("198.51.100.7", 0), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
}

TEST_F(DeclaredAddress, ListenerOnAnUndeclaredAddressHearsOnlyRequestsToIt) {
  // A client connecting to the declared address on the port that the unattached listener
  // holds is refused (nobody listens on kDeclared:port): REJECTED with status 8.
  constexpr uint16_t kPort = 18347;
  Id listener;
  ASSERT_EQ(listener.bind("127.0.0.1", kPort), 0) << strerror(errno);
  ASSERT_EQ(rdma_listen(listener.id, 4), 0) << strerror(errno);
  Id client;
  sockaddr_in dst = addr(kDeclared, kPort);
  ASSERT_EQ(rdma_resolve_addr(client.id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0)
      << strerror(errno);
  ASSERT_EQ(client.next_event(), RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(rdma_resolve_route(client.id, 2000), 0) << strerror(errno);
  ASSERT_EQ(client.next_event(), RDMA_CM_EVENT_ROUTE_RESOLVED);
  // The resolved ID has the declared device.
  ASSERT_NE(client.id->verbs, nullptr);
  ibv_qp_init_attr qa{};
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.qp_type = IBV_QPT_RC;
  ASSERT_EQ(rdma_create_qp(client.id, nullptr, &qa), 0) << strerror(errno);
  rdma_conn_param cp{};
  cp.retry_count = 1;
  ASSERT_EQ(rdma_connect(client.id, &cp), 0) << strerror(errno);
  EXPECT_EQ(client.next_event(), RDMA_CM_EVENT_REJECTED);
  // The listener heard nothing.
  pollfd p{listener.ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  rdma_destroy_qp(client.id);
}

TEST_F(DeclaredAddress, ResolvingFromAnUnattachedIdUsesTheDeclaredDevice) {
  Id x;
  ASSERT_EQ(x.bind("127.0.0.1", 0), 0) << strerror(errno);
  ASSERT_EQ(x.id->verbs, nullptr);
  sockaddr_in dst = addr(kDeclared, 18348);
  ASSERT_EQ(rdma_resolve_addr(x.id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0)
      << strerror(errno);
  ASSERT_EQ(x.next_event(), RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_NE(x.id->verbs, nullptr);
  Id d;
  ASSERT_EQ(d.bind(kDeclared, 0), 0);
  EXPECT_EQ(x.id->verbs, d.id->verbs);  // one device, one context: libfabric's domain
  auto* src = reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(x.id));
  char buf[INET_ADDRSTRLEN];
  EXPECT_STREQ(inet_ntop(AF_INET, &src->sin_addr, buf, sizeof buf), kDeclared);
}

}  // namespace
