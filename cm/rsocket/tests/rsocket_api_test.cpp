// rsockets' C API in one process with two softrdma devices (127.0.100.21 and .22, ports
// 19520-19529): the errno values rsocket(7)/socket(7) give for bad input, a connected pair
// (data, MSG_PEEK, MSG_WAITALL, rpoll/rselect, half-close, riomap/riowrite), and the wire
// format of cm/rsocket/protocol.h against the bytes rdma-core's rsocket.c sends.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "cm/rsocket/protocol.h"

namespace {

using namespace softrdma::rsocket;

constexpr const char* kServer = "127.0.100.21";
constexpr const char* kClient = "127.0.100.22";

sockaddr_in addr_of(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

int errno_of(int ret) {
  return ret == -1 ? errno : 0;
}

/// A listening rsocket at kServer:port and a client connected to it; `accepted` is the
/// server's side. Fails the test if setup fails.
struct Pair {
  int listener = -1, client = -1, accepted = -1;
  explicit Pair(uint16_t port, int iomap_size = 0) {
    listener = rsocket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(listener, 0);
    if (iomap_size) {
      EXPECT_EQ(rsetsockopt(listener, SOL_RDMA, RDMA_IOMAPSIZE, &iomap_size, sizeof iomap_size), 0);
    }
    sockaddr_in s = addr_of(kServer, port);
    EXPECT_EQ(rbind(listener, reinterpret_cast<sockaddr*>(&s), sizeof s), 0) << strerror(errno);
    EXPECT_EQ(rlisten(listener, 4), 0);
    // The accepting thread waits at most 30 s for the connection, so that a failed connect
    // fails the test instead of hanging it in raccept.
    std::thread t([&] {
      pollfd p{listener, POLLIN, 0};
      if (rpoll(&p, 1, 30'000) == 1) accepted = raccept(listener, nullptr, nullptr);
    });
    client = rsocket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(client, 0);
    if (iomap_size) {
      EXPECT_EQ(rsetsockopt(client, SOL_RDMA, RDMA_IOMAPSIZE, &iomap_size, sizeof iomap_size), 0);
    }
    sockaddr_in c = addr_of(kClient, 0);
    EXPECT_EQ(rbind(client, reinterpret_cast<sockaddr*>(&c), sizeof c), 0);
    EXPECT_EQ(rconnect(client, reinterpret_cast<sockaddr*>(&s), sizeof s), 0) << strerror(errno);
    t.join();
    EXPECT_GE(accepted, 0);
  }
  ~Pair() {
    if (client >= 0) rclose(client);
    if (accepted >= 0) rclose(accepted);
    if (listener >= 0) rclose(listener);
  }
};

TEST(RsocketProtocol, ImmediateAndConnData) {
  EXPECT_EQ(make_msg(Op::kData, 65536), 65536u);
  EXPECT_EQ(make_msg(Op::kSgl, 0x1234), 0x80001234u);
  EXPECT_EQ(make_msg(Op::kCtrl, static_cast<uint32_t>(Ctrl::kShutdown)), 0xE0000002u);
  EXPECT_EQ(msg_op(0xC0000003u), Op::kIomapSgl);
  EXPECT_EQ(msg_data(0xFFFFFFFFu), 0x1FFFFFFFu);
  EXPECT_EQ(scale_encode(128, 8), 128);
  EXPECT_EQ(scale_decode(scale_encode(512, 8), 8), 512);
  EXPECT_EQ(scale_encode(512, 8), 0x82);

  const LocalBuffers b{384, 0, 0x1000, 0x11, 0x20000, 1u << 17, 0x22};
  const ConnData cd = format_conn_data(b);
  const auto* raw = reinterpret_cast<const uint8_t*>(&cd);
  // version 1, flags IOMAP (little-endian host), credits 384 big-endian, then the SGEs.
  EXPECT_EQ(raw[0], 1);
  EXPECT_EQ(raw[1], kConnFlagIomap);
  EXPECT_EQ(raw[2], 0x01);
  EXPECT_EQ(raw[3], 0x80);
  EXPECT_EQ(raw[8 + 7], 0x00);  // target_sgl.addr = 0x1000, big-endian
  EXPECT_EQ(raw[8 + 6], 0x10);
  EXPECT_EQ(raw[8 + 12 + 3], kSglSize);  // target_sgl.length
  EXPECT_EQ(raw[24 + 12 + 1], 0x01);     // data_buf.length = 64 KiB (half of 128 KiB)

  PeerBuffers p{};
  ASSERT_TRUE(parse_conn_data(&cd, sizeof cd, &p));
  EXPECT_EQ(p.credits, 384);
  EXPECT_EQ(p.remote_sgl.addr, 0x1000u);
  EXPECT_EQ(p.remote_sgl.length, kSglSize);
  EXPECT_EQ(p.remote_iomap.addr, 0x1000u + 2 * sizeof(Sge));
  EXPECT_EQ(p.first_target.length, 1u << 16);
  EXPECT_FALSE(p.swap);
  ConnData bad = cd;
  bad.version = 2;
  EXPECT_FALSE(parse_conn_data(&bad, sizeof bad, &p));
  EXPECT_FALSE(parse_conn_data(&cd, sizeof cd - 1, &p));
}

TEST(RsocketErrno, BadDescriptorAndArguments) {
  char buf[8] = {};
  EXPECT_EQ(errno_of(rsend(12345, buf, 1, 0)), EBADF);
  EXPECT_EQ(errno_of(static_cast<int>(rrecv(12345, buf, 1, 0))), EBADF);
  EXPECT_EQ(errno_of(rlisten(12345, 1)), EBADF);
  EXPECT_EQ(errno_of(raccept(12345, nullptr, nullptr)), EBADF);
  EXPECT_EQ(errno_of(rclose(12345)), EBADF);
  EXPECT_EQ(errno_of(rshutdown(12345, SHUT_RDWR)), EBADF);
  EXPECT_EQ(errno_of(rfcntl(12345, F_GETFL)), EBADF);
  EXPECT_EQ(errno_of(rsocket(AF_INET6, SOCK_STREAM, 0)), EAFNOSUPPORT);
  EXPECT_EQ(errno_of(rsocket(AF_INET, SOCK_DGRAM, 0)), ESOCKTNOSUPPORT);
  EXPECT_EQ(errno_of(rsocket(AF_INET, SOCK_STREAM, IPPROTO_UDP)), EPROTONOSUPPORT);
  EXPECT_EQ(errno_of(rsocket(AF_INET, SOCK_RAW, 0)), ENOTSUP);

  const int s = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  EXPECT_EQ(errno_of(rsend(s, buf, 1, 0)), ENOTCONN);
  EXPECT_EQ(errno_of(static_cast<int>(rrecv(s, buf, 1, 0))), ENOTCONN);
  EXPECT_EQ(errno_of(raccept(s, nullptr, nullptr)), EINVAL);  // not listening
  EXPECT_EQ(errno_of(rshutdown(s, 7)), EINVAL);
  EXPECT_EQ(errno_of(rshutdown(s, SHUT_RDWR)), ENOTCONN);
  EXPECT_EQ(errno_of(rbind(s, nullptr, 0)), EINVAL);
  EXPECT_EQ(errno_of(rfcntl(s, F_DUPFD, 0)), ENOTSUP);
  int v = 1;
  EXPECT_EQ(errno_of(rsetsockopt(s, SOL_SOCKET, SO_BROADCAST, &v, sizeof v)), ENOTSUP);
  EXPECT_EQ(errno_of(rsetsockopt(s, SOL_SOCKET, SO_KEEPALIVE, nullptr, 0)), EINVAL);
  EXPECT_EQ(rsetsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v), 0);
  socklen_t len = sizeof v;
  v = 0;
  EXPECT_EQ(rgetsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &len), 0);
  EXPECT_EQ(v, 1);
  EXPECT_EQ(rgetsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, &len), 0);
  EXPECT_EQ(v, 1 << 17);
  sockaddr_in6 a6{};
  a6.sin6_family = AF_INET6;
  EXPECT_EQ(errno_of(rconnect(s, reinterpret_cast<sockaddr*>(&a6), sizeof a6)), EAFNOSUPPORT);
  EXPECT_EQ(errno_of(static_cast<int>(riomap(s, buf, sizeof buf, PROT_READ | PROT_EXEC, 0, 0))),
            EINVAL);
  EXPECT_EQ(rclose(s), 0);
  EXPECT_EQ(errno_of(rclose(s)), EBADF);
}

TEST(RsocketErrno, RefusedAndNonBlocking) {
  // A device at kServer (the listener of another port), nobody on 19521.
  const int l = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(l, 0);
  sockaddr_in s = addr_of(kServer, 19522);
  ASSERT_EQ(rbind(l, reinterpret_cast<sockaddr*>(&s), sizeof s), 0);
  ASSERT_EQ(rlisten(l, 1), 0);
  EXPECT_EQ(errno_of(raccept(l, nullptr, nullptr)), EAGAIN);  // O_NONBLOCK, none pending
  pollfd p{l, POLLIN, 0};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rpoll(&p, 1, 200), 0);  // times out, no event
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(190));

  const int c = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(c, 0);
  sockaddr_in ca = addr_of(kClient, 0);
  ASSERT_EQ(rbind(c, reinterpret_cast<sockaddr*>(&ca), sizeof ca), 0);
  sockaddr_in nobody = addr_of(kServer, 19521);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(errno_of(rconnect(c, reinterpret_cast<sockaddr*>(&nobody), sizeof nobody)),
            ECONNREFUSED);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(5));  // a REJ, at once
  int err = -1;
  socklen_t len = sizeof err;
  EXPECT_EQ(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  EXPECT_EQ(err, ECONNREFUSED);
  rclose(c);
  rclose(l);
}

TEST(RsocketPair, DataPeekWaitallPollAndHalfClose) {
  Pair pr(19523);
  ASSERT_GE(pr.accepted, 0);
  sockaddr_in peer{};
  socklen_t plen = sizeof peer;
  ASSERT_EQ(rgetpeername(pr.accepted, reinterpret_cast<sockaddr*>(&peer), &plen), 0);
  char ip[32];
  EXPECT_STREQ(inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof ip), kClient);
  ASSERT_EQ(rgetsockname(pr.client, reinterpret_cast<sockaddr*>(&peer), &plen), 0);
  EXPECT_STREQ(inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof ip), kClient);

  // Non-blocking receive with nothing there: EAGAIN; rpoll: writable, not readable.
  char c;
  EXPECT_EQ(errno_of(static_cast<int>(rrecv(pr.accepted, &c, 1, MSG_DONTWAIT))), EAGAIN);
  pollfd p{pr.client, POLLIN | POLLOUT, 0};
  ASSERT_EQ(rpoll(&p, 1, 1000), 1);
  EXPECT_EQ(p.revents, POLLOUT);

  // 4 MiB through a 128 KiB buffer: credits granted and used many times over.
  std::vector<uint8_t> out(4 << 20), in(out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + (i >> 12));
  std::thread sender([&] {
    size_t off = 0;
    while (off < out.size()) {
      const ssize_t n = rsend(pr.client, out.data() + off, out.size() - off, 0);
      ASSERT_GT(n, 0) << strerror(errno);
      off += static_cast<size_t>(n);
    }
  });
  // rselect says readable, MSG_PEEK leaves the bytes, MSG_WAITALL takes them all.
  fd_set rd;
  FD_ZERO(&rd);
  FD_SET(pr.accepted, &rd);
  timeval tv{5, 0};
  ASSERT_EQ(rselect(pr.accepted + 1, &rd, nullptr, nullptr, &tv), 1);
  EXPECT_TRUE(FD_ISSET(pr.accepted, &rd));
  uint8_t peek[16];
  ASSERT_GT(rrecv(pr.accepted, peek, sizeof peek, MSG_PEEK), 0);
  EXPECT_EQ(peek[0], out[0]);
  ASSERT_EQ(rrecv(pr.accepted, in.data(), in.size(), MSG_WAITALL), static_cast<ssize_t>(in.size()));
  sender.join();
  EXPECT_EQ(in, out);

  // Half-close: the client's SHUT_WR ends the server's stream (0 = end of file) while the
  // server can still send back.
  ASSERT_EQ(rshutdown(pr.client, SHUT_WR), 0);
  EXPECT_EQ(errno_of(static_cast<int>(rsend(pr.client, "x", 1, 0))), EPIPE);
  EXPECT_EQ(rrecv(pr.accepted, &c, 1, 0), 0);
  ASSERT_EQ(rsend(pr.accepted, "ok", 2, 0), 2);
  char back[2];
  ASSERT_EQ(rrecv(pr.client, back, 2, MSG_WAITALL), 2);
  EXPECT_EQ(std::memcmp(back, "ok", 2), 0);
  // SOL_RDMA options are fixed once connected.
  int v = 64;
  EXPECT_EQ(errno_of(rsetsockopt(pr.client, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v)), EINVAL);
}

TEST(RsocketPair, IomapWindowWrittenByRiowrite) {
  Pair pr(19524, /*iomap_size=*/4);
  ASSERT_GE(pr.accepted, 0);
  std::vector<uint8_t> window(256 << 10, 0);
  ASSERT_EQ(riomap(pr.accepted, window.data(), window.size(), PROT_WRITE, 0, 0), 0);
  // The window's announcement travels with the next send on the mapping side.
  ASSERT_EQ(rsend(pr.accepted, "m", 1, 0), 1);
  char c;
  ASSERT_EQ(rrecv(pr.client, &c, 1, 0), 1);
  std::vector<uint8_t> data(window.size());
  std::iota(data.begin(), data.end(), 1);
  ASSERT_EQ(riowrite(pr.client, data.data(), data.size(), 0, 0), data.size());
  // An offset beyond every window writes nothing.
  EXPECT_EQ(riowrite(pr.client, data.data(), 16, static_cast<off_t>(window.size()), 0), 0u);
  // A message after the writes: RC ordering puts the data in place before it.
  ASSERT_EQ(rsend(pr.client, "d", 1, 0), 1);
  ASSERT_EQ(rrecv(pr.accepted, &c, 1, 0), 1);
  EXPECT_EQ(window, data);
  EXPECT_EQ(riounmap(pr.accepted, window.data(), window.size()), 0);
  EXPECT_EQ(errno_of(riounmap(pr.accepted, window.data(), window.size())), EINVAL);
}

}  // namespace
