// LoopbackTransport semantics: rendezvous matching by (source, destination, tag), bounds
// and tag checks, size mismatches, bounded waits, kill and close, barrier, counters.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "ccl/loopback_transport.h"

namespace softrdma::ccl {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(Loopback, SendCompletesOnlyOnceTheRecvIsPosted) {
  LoopbackFabric f(2);
  auto t0 = f.transport(0);
  auto t1 = f.transport(1);
  char src[16] = "hello, loopback";
  char dst[16] = {};
  auto b0 = t0->register_buffer(src, sizeof src);
  auto b1 = t1->register_buffer(dst, sizeof dst);
  const RequestId s = t0->send(1, *b0, 0, sizeof src, 7);
  EXPECT_FALSE(t0->test(s, "Test"));
  EXPECT_EQ(f.transfers(0, 1), 0u);
  const RequestId r = t1->recv(0, *b1, 0, sizeof dst, 7);
  EXPECT_TRUE(t0->test(s, "Test"));
  t1->wait(r, "Test");
  EXPECT_STREQ(dst, "hello, loopback");
  EXPECT_EQ(f.transfers(0, 1), 1u);
  EXPECT_THROW(t0->wait(s, "Test"), std::invalid_argument);  // already completed by test()
}

TEST(Loopback, MatchesByTagInAnyOrder) {
  LoopbackFabric f(2);
  auto t0 = f.transport(0);
  auto t1 = f.transport(1);
  int src[2] = {10, 20};
  int dst[2] = {};
  auto b0 = t0->register_buffer(src, sizeof src);
  auto b1 = t1->register_buffer(dst, sizeof dst);
  const RequestId r20 = t1->recv(0, *b1, 4, 4, 2);
  const RequestId r10 = t1->recv(0, *b1, 0, 4, 1);
  const RequestId s10 = t0->send(1, *b0, 0, 4, 1);
  const RequestId s20 = t0->send(1, *b0, 4, 4, 2);
  for (RequestId id : {r20, r10}) t1->wait(id, "Test");
  for (RequestId id : {s10, s20}) t0->wait(id, "Test");
  EXPECT_EQ(dst[0], 10);
  EXPECT_EQ(dst[1], 20);
}

TEST(Loopback, ZeroByteTransfers) {
  LoopbackFabric f(2);
  auto t0 = f.transport(0);
  auto t1 = f.transport(1);
  char c = 0;
  auto b0 = t0->register_buffer(&c, 1);
  auto b1 = t1->register_buffer(&c, 1);
  const RequestId s = t0->send(1, *b0, 1, 0, 3);  // offset == size is fine for 0 bytes
  const RequestId r = t1->recv(0, *b1, 0, 0, 3);
  t0->wait(s, "Test");
  t1->wait(r, "Test");
}

TEST(Loopback, RejectsBadArguments) {
  LoopbackFabric f(2);
  auto t0 = f.transport(0);
  char buf[8];
  auto b = t0->register_buffer(buf, sizeof buf);
  EXPECT_THROW(t0->send(2, *b, 0, 1, 0), std::invalid_argument);
  EXPECT_THROW(t0->send(-1, *b, 0, 1, 0), std::invalid_argument);
  EXPECT_THROW(t0->send(1, *b, 4, 5, 0), std::invalid_argument);
  EXPECT_THROW(t0->recv(1, *b, 9, 0, 0), std::invalid_argument);
  EXPECT_THROW(t0->recv(1, *b, SIZE_MAX, 2, 0), std::invalid_argument);
  t0->send(1, *b, 0, 1, 5);
  EXPECT_THROW(t0->send(1, *b, 0, 1, 5), std::invalid_argument);  // tag still in flight
  EXPECT_THROW(t0->wait(12345, "Test"), std::invalid_argument);
  EXPECT_THROW(f.transport(0), std::logic_error);
  EXPECT_THROW(f.transport(2), std::invalid_argument);
  EXPECT_THROW(LoopbackFabric(0), std::invalid_argument);
}

TEST(Loopback, SizeMismatchFailsBothSides) {
  LoopbackFabric f(2);
  auto t0 = f.transport(0);
  auto t1 = f.transport(1);
  char buf[8] = {};
  auto b0 = t0->register_buffer(buf, sizeof buf);
  auto b1 = t1->register_buffer(buf, sizeof buf);
  const RequestId s = t0->send(1, *b0, 0, 8, 1);
  const RequestId r = t1->recv(0, *b1, 0, 4, 1);
  try {
    t0->wait(s, "Op");
    FAIL();
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("size mismatch"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t1->wait(r, "Op"), PeerError);
}

TEST(Loopback, WaitTimesOutNamingTheSilentPeer) {
  LoopbackFabric f(2, milliseconds(200));
  auto t0 = f.transport(0);
  auto t1 = f.transport(1);  // never posts anything
  char buf[4];
  auto b = t0->register_buffer(buf, sizeof buf);
  const RequestId r = t0->recv(1, *b, 0, 4, 9);
  const auto start = Clock::now();
  try {
    t0->wait(r, "AllReduce");
    FAIL();
  } catch (const PeerError& e) {
    const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    EXPECT_GE(ms, 150);
    EXPECT_LT(ms, 5000);
    EXPECT_EQ(e.peer(), 1);
    EXPECT_EQ(std::string(e.what()),
              "AllReduce: rank 0: peer rank 1 (loopback): no progress within 200 ms");
  }
}

TEST(Loopback, KillWakesWaitersAtOnce) {
  LoopbackFabric f(3, milliseconds(20000));
  auto t0 = f.transport(0);
  char buf[4];
  auto b = t0->register_buffer(buf, sizeof buf);
  const RequestId r = t0->recv(2, *b, 0, 4, 1);
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    f.kill(2);
  });
  const auto start = Clock::now();
  try {
    t0->wait(r, "Broadcast");
    FAIL();
  } catch (const PeerError& e) {
    EXPECT_LT(Clock::now() - start, milliseconds(5000));
    EXPECT_EQ(e.peer(), 2);
    EXPECT_EQ(std::string(e.what()), "Broadcast: rank 0: peer rank 2 (loopback): killed");
  }
  killer.join();
  // Later transfers to the dead rank fail too, and the dead rank itself cannot go on.
  const RequestId s = t0->send(2, *b, 0, 4, 2);
  EXPECT_THROW(t0->wait(s, "Op"), PeerError);
  auto t2 = f.transport(2);
  EXPECT_THROW(t2->register_buffer(buf, 4), PeerError);
}

TEST(Loopback, ClosingATransportFailsItsPeers) {
  LoopbackFabric f(2, milliseconds(20000));
  auto t0 = f.transport(0);
  auto t1 = f.transport(1);
  char buf[4];
  auto b = t0->register_buffer(buf, sizeof buf);
  const RequestId r = t0->recv(1, *b, 0, 4, 1);
  t1.reset();
  try {
    t0->wait(r, "Op");
    FAIL();
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("closed its transport"), std::string::npos);
  }
}

TEST(Loopback, BarrierWaitsForEveryRankAndFailsOnADeadOne) {
  constexpr int n = 4;
  LoopbackFabric f(n, milliseconds(20000));
  std::vector<std::unique_ptr<Transport>> ts;
  for (int r = 0; r < n; ++r) ts.push_back(f.transport(r));
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (int round = 1; round <= 20; ++round) {
        arrived.fetch_add(1);
        ts[static_cast<size_t>(r)]->barrier("Barrier");
        EXPECT_GE(arrived.load(), n * round);
      }
    });
  }
  for (auto& t : threads) t.join();

  std::thread waiter([&] {
    try {
      ts[0]->barrier("Barrier");
      ADD_FAILURE() << "barrier passed without rank 3";
    } catch (const PeerError& e) {
      EXPECT_EQ(e.peer(), 3);
    }
  });
  std::this_thread::sleep_for(milliseconds(30));
  f.kill(3);
  waiter.join();
}

TEST(Loopback, CountsRegistrations) {
  LoopbackFabric f(1);
  auto t = f.transport(0);
  char buf[4];
  {
    auto a = t->register_buffer(buf, 4);
    auto b = t->register_buffer(buf, 2);
    EXPECT_EQ(f.registrations(0), 2u);
    EXPECT_EQ(f.live_buffers(0), 2u);
  }
  EXPECT_EQ(f.live_buffers(0), 0u);
  EXPECT_EQ(t->size(), 1);
  EXPECT_EQ(t->peer_description(0), "rank 0 (loopback)");
}

}  // namespace
}  // namespace softrdma::ccl
