// VerbsTransport over softrdma on loopback: every rank is a forked process with its own
// srdma0 (its own 127.0.0.x), connected through the TCP bootstrap of a unique id made by a
// helper process (test::RootProcess: the gtest process stays single-threaded for fork()).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ccl/bootstrap.h"
#include "ccl/tests/verbs/ranks.h"
#include "ccl/verbs_transport.h"

namespace softrdma::ccl {
namespace {

using test::EnvList;
using test::require;
using test::run_ranks;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

uint8_t pattern(int src, int dst, uint64_t i) {
  return static_cast<uint8_t>((i * 2654435761u) >> 13 ^ (src * 37 + dst * 11));
}

void fill(std::vector<uint8_t>& b, size_t off, size_t n, int src, int dst) {
  for (size_t i = 0; i < n; ++i) b[off + i] = pattern(src, dst, i);
}

void verify(const std::vector<uint8_t>& b, size_t off, size_t n, int src, int dst,
            const std::string& what) {
  for (size_t i = 0; i < n; ++i)
    if (b[off + i] != pattern(src, dst, i))
      throw std::runtime_error(what + ": byte " + std::to_string(i) + " of " + std::to_string(n) +
                               " from rank " + std::to_string(src) + " is wrong");
}

// Runs fn(transport) on n forked ranks connected through a fresh unique id and expects
// every rank to succeed.
void run_ok(int n, const std::function<void(Transport&)>& fn, EnvList env = {},
            std::chrono::seconds deadline = 120s) {
  test::RootProcess root;
  const UniqueId id = root.id();
  auto res = run_ranks(
      n,
      [&](int r) {
        auto t = connect_transport(id, n, r);
        require(t->rank() == r && t->size() == n, "rank/size");
        fn(*t);
      },
      deadline, env);
  for (const auto& r : res) ASSERT_EQ(0, r.exit_code) << test::describe(res);
}

TEST(VerbsTransport, PingPongSizes) {
  run_ok(2, [](Transport& t) {
    const std::vector<size_t> sizes = {0, 1, 7, 4096, 4097, 65536, 1 << 20, (3 << 20) + 5};
    const size_t max = sizes.back();
    std::vector<uint8_t> a(max), b(max);
    auto A = t.register_buffer(a.data(), a.size());
    auto B = t.register_buffer(b.data(), b.size());
    const int me = t.rank(), other = 1 - me;
    for (size_t s : sizes) {
      const uint64_t tag = s;
      if (me == 0) {
        fill(a, 0, s, 0, 1);
        std::memset(b.data(), 0, s);
        RequestId rr = t.recv(other, *B, 0, s, tag);
        t.wait(t.send(other, *A, 0, s, tag), "pingpong");
        t.wait(rr, "pingpong");
        verify(b, 0, s, 0, 1, "echo of " + std::to_string(s));
      } else {
        t.wait(t.recv(other, *B, 0, s, tag), "pingpong");
        verify(b, 0, s, 0, 1, "ping of " + std::to_string(s));
        t.wait(t.send(other, *B, 0, s, tag), "pingpong");
      }
    }
  });
}

// Sizes at and around the eager limit (SOFTRDMA_CCL_EAGER_BYTES=4096 here), both ways, at
// odd offsets, with the recv posted before and after the send: the first two go eagerly
// (into the posted recv, or kept until the late recv takes them), the rest by rendezvous.
// With the limit 0 everything goes by rendezvous and still arrives.
TEST(VerbsTransport, EagerAndRendezvousAroundTheLimit) {
  for (const char* limit : {"4096", "0"}) {
    SCOPED_TRACE(std::string("SOFTRDMA_CCL_EAGER_BYTES=") + limit);
    run_ok(2,
           [](Transport& t) {
             const std::vector<size_t> sizes = {0, 1, 4095, 4096, 4097, 8192, 65536};
             std::vector<uint8_t> a(70000), b(70000);
             auto A = t.register_buffer(a.data(), a.size());
             auto B = t.register_buffer(b.data(), b.size());
             const int me = t.rank(), other = 1 - me;
             uint64_t tag = 1;
             for (bool late_recv : {false, true}) {
               for (size_t s : sizes) {
                 ++tag;
                 if (me == 0) {
                   fill(a, 3, s, 0, static_cast<int>(tag));
                   const RequestId id = t.send(other, *A, 3, s, tag);
                   if (late_recv) t.barrier("late");  // posted before the recv
                   t.wait(id, "eager");
                 } else {
                   std::memset(b.data(), 0, b.size());
                   if (late_recv) t.barrier("late");  // the send is posted first
                   t.wait(t.recv(other, *B, 5, s, tag), "eager");
                   verify(b, 5, s, 0, static_cast<int>(tag), "size " + std::to_string(s));
                   require(b[4] == 0 && b[5 + s] == 0, "wrote outside the recv");
                 }
               }
             }
             t.barrier("end");
           },
           {{"SOFTRDMA_CCL_EAGER_BYTES", limit}});
  }
}

// More unexpected eager transfers than the receiver has credits for (kCredits = 128): the
// sender runs ahead by at most that many, the rest wait in its queue until the receiver's
// recvs take the early ones and return their credits. Nothing is lost or reordered.
TEST(VerbsTransport, UnexpectedEagerTransfersWaitForCredits) {
  run_ok(2, [](Transport& t) {
    constexpr int kN = 400;
    constexpr size_t kLen = 1000;
    std::vector<uint8_t> buf(kN * kLen);
    auto B = t.register_buffer(buf.data(), buf.size());
    std::vector<RequestId> ids;
    if (t.rank() == 0) {
      for (int i = 0; i < kN; ++i) {
        fill(buf, i * kLen, kLen, 0, i);
        ids.push_back(t.send(1, *B, i * kLen, kLen, 7));  // one tag: FIFO order
      }
      for (RequestId id : ids) t.wait(id, "unexpected");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all arrive first
      for (int i = 0; i < kN; ++i) ids.push_back(t.recv(0, *B, i * kLen, kLen, 7));
      for (RequestId id : ids) t.wait(id, "unexpected");
      for (int i = 0; i < kN; ++i)
        verify(buf, i * kLen, kLen, 0, i, "message " + std::to_string(i));
    }
    t.barrier("end");
  });
}

// Transfers longer than one RDMA WRITE go as several writes (SOFTRDMA_CCL_IB_MAX_WRITE).
TEST(VerbsTransport, SplitWrites) {
  run_ok(2,
         [](Transport& t) {
           const size_t n = (1 << 20) + 123;
           std::vector<uint8_t> buf(n + 64);
           auto B = t.register_buffer(buf.data(), buf.size());
           if (t.rank() == 0) {
             fill(buf, 64, n, 0, 1);
             t.wait(t.send(1, *B, 64, n, 5), "split");
           } else {
             t.wait(t.recv(0, *B, 32, n, 5), "split");
             verify(buf, 32, n, 0, 1, "split");
           }
           t.barrier("split");
         },
         {{"SOFTRDMA_CCL_IB_MAX_WRITE", "4096"}});
}

// Channels (SOFTRDMA_CCL_CHANNELS): rank 0 asks for 1..4 QPs per peer, rank 1 for 4, so the
// pair uses rank 0's count (rank 1 drops its extra QPs). With the eager limit at 4096, stripes
// of at least 16 KiB and RDMA WRITEs of at most 12 KiB (so stripes go as several pieces),
// transfers at and around each threshold — eager, one stripe, exactly 2 and 4 stripes,
// 3 stripes plus a byte, and sizes the channel count does not divide — cross in both
// directions at odd offsets, all in flight at once so stripes of different transfers
// interleave on every channel.
TEST(VerbsTransport, ChannelsStripeLargeTransfers) {
  for (int channels = 1; channels <= 4; ++channels) {
    SCOPED_TRACE("SOFTRDMA_CCL_CHANNELS=" + std::to_string(channels) + " on rank 0");
    test::RootProcess root;
    const UniqueId id = root.id();
    auto res = run_ranks(
        2,
        [&](int r) {
          setenv("SOFTRDMA_CCL_CHANNELS", r == 0 ? std::to_string(channels).c_str() : "4", 1);
          auto t = connect_transport(id, 2, r);
          constexpr size_t kMin = 16384;
          const std::vector<size_t> sizes = {4095,     4096,         4097,     2 * kMin - 1,
                                             2 * kMin, 3 * kMin + 1, 4 * kMin, 1000003};
          std::vector<size_t> at;  // each transfer's offset in both buffers
          size_t total = 3;
          for (size_t s : sizes) {
            at.push_back(total);
            total += s + 16;
          }
          std::vector<uint8_t> out(total), in(total);
          auto O = t->register_buffer(out.data(), out.size());
          auto I = t->register_buffer(in.data(), in.size());
          const int other = 1 - r;
          for (int round = 0; round < 2; ++round) {
            std::vector<RequestId> ids;
            for (size_t i = 0; i < sizes.size(); ++i) {
              fill(out, at[i], sizes[i], r, static_cast<int>(i));
              ids.push_back(t->recv(other, *I, at[i] + 5, sizes[i], i));
            }
            for (size_t i = 0; i < sizes.size(); ++i)
              ids.push_back(t->send(other, *O, at[i], sizes[i], i));
            for (RequestId rid : ids) t->wait(rid, "channels");
            for (size_t i = 0; i < sizes.size(); ++i)
              verify(in, at[i] + 5, sizes[i], other, static_cast<int>(i),
                     "size " + std::to_string(sizes[i]));
            std::memset(in.data(), 0, in.size());
          }
          t->barrier("end");
        },
        60s,
        {{"SOFTRDMA_CCL_EAGER_BYTES", "4096"},
         {"SOFTRDMA_CCL_CHANNEL_MIN_BYTES", "16384"},
         {"SOFTRDMA_CCL_IB_MAX_WRITE", "12288"}});
    for (const auto& r : res) ASSERT_EQ(0, r.exit_code) << test::describe(res);
  }
}

TEST(VerbsTransport, FullMeshFourRanks) {
  run_ok(4, [](Transport& t) {
    const int n = t.size(), me = t.rank();
    const size_t s = 256 << 10;
    std::vector<uint8_t> out(s * n), in(s * n);
    for (int q = 0; q < n; ++q) fill(out, q * s, s, me, q);
    auto O = t.register_buffer(out.data(), out.size());
    auto I = t.register_buffer(in.data(), in.size());
    for (int iter = 0; iter < 4; ++iter) {
      std::memset(in.data(), 0, in.size());
      std::vector<RequestId> ids;
      for (int q = 0; q < n; ++q)
        if (q != me) ids.push_back(t.recv(q, *I, q * s, s, 100 + iter));
      for (int q = 0; q < n; ++q)
        if (q != me) ids.push_back(t.send(q, *O, q * s, s, 100 + iter));
      for (RequestId id : ids) t.wait(id, "mesh");
      for (int q = 0; q < n; ++q)
        if (q != me) verify(in, q * s, s, q, me, "mesh");
    }
    for (int i = 0; i < 100; ++i) t.barrier("barrier");
  });
}

// Far more transfers in flight than control credits (128), send-queue slots (128) and the
// per-peer request bound (512, beyond which posting waits for completions), with tags
// reused: same-tag transfers match in posting order.
TEST(VerbsTransport, FlowControlManyOutstanding) {
  run_ok(2, [](Transport& t) {
    const int count = 1500;
    const size_t s = 64;
    std::vector<uint8_t> buf(count * s);
    auto B = t.register_buffer(buf.data(), buf.size());
    for (int round = 0; round < 2; ++round) {
      const bool sender = (t.rank() == round);
      const int other = 1 - t.rank();
      std::vector<RequestId> ids;
      if (sender) {
        for (int i = 0; i < count; ++i)
          for (size_t k = 0; k < s; ++k) buf[i * s + k] = static_cast<uint8_t>(i * 7 + k + round);
        for (int i = 0; i < count; ++i) ids.push_back(t.send(other, *B, i * s, s, i % 5));
      } else {
        std::memset(buf.data(), 0, buf.size());
        for (int i = 0; i < count; ++i) ids.push_back(t.recv(other, *B, i * s, s, i % 5));
      }
      for (RequestId id : ids) t.wait(id, "flow");
      if (!sender)
        for (int i = 0; i < count; ++i)
          for (size_t k = 0; k < s; ++k)
            require(buf[i * s + k] == static_cast<uint8_t>(i * 7 + k + round),
                    "transfer " + std::to_string(i) + " landed in the wrong place");
      t.barrier("flow");
    }
  });
}

// test() polls without blocking; sends posted before the matching recv wait for its advert.
TEST(VerbsTransport, TestPollsAndLateRecv) {
  run_ok(2, [](Transport& t) {
    std::vector<uint8_t> buf(4096);
    auto B = t.register_buffer(buf.data(), buf.size());
    if (t.rank() == 0) {
      fill(buf, 0, 4096, 0, 1);
      RequestId id = t.send(1, *B, 0, 4096, 9);
      const auto until = Clock::now() + 20s;
      while (!t.test(id, "test")) require(Clock::now() < until, "send never completed");
    } else {
      std::this_thread::sleep_for(200ms);  // the send waits for this recv's advert
      RequestId id = t.recv(0, *B, 0, 4096, 9);
      const auto until = Clock::now() + 20s;
      while (!t.test(id, "test")) require(Clock::now() < until, "recv never completed");
      verify(buf, 0, 4096, 0, 1, "late recv");
    }
    t.barrier("done");
  });
}

TEST(VerbsTransport, SelfTransfersAndBadArguments) {
  run_ok(2, [](Transport& t) {
    std::vector<uint8_t> buf(1024);
    auto B = t.register_buffer(buf.data(), 512);
    fill(buf, 0, 100, t.rank(), t.rank());
    RequestId s = t.send(t.rank(), *B, 0, 100, 1);
    RequestId r = t.recv(t.rank(), *B, 200, 100, 1);
    t.wait(s, "self");
    t.wait(r, "self");
    verify(buf, 200, 100, t.rank(), t.rank(), "self");

    auto throws_invalid = [](auto f, const char* what) {
      try {
        f();
      } catch (const std::invalid_argument&) {
        return;
      }
      throw std::runtime_error(std::string("no std::invalid_argument for ") + what);
    };
    throws_invalid([&] { t.send(2, *B, 0, 1, 1); }, "peer out of range");
    throws_invalid([&] { t.recv(-1, *B, 0, 1, 1); }, "negative peer");
    throws_invalid([&] { t.send(1 - t.rank(), *B, 500, 13, 1); }, "range past the buffer");
    throws_invalid([&] { t.recv(1 - t.rank(), *B, 513, 0, 1); }, "offset past the buffer");
    throws_invalid([&] { t.wait(987654, "x"); }, "unknown request");
    auto empty = t.register_buffer(nullptr, 0);
    require(empty->size() == 0, "empty buffer size");
    t.barrier("done");
  });
}

// A send and a recv of one tag with different sizes fail both sides, naming each other —
// for every combination of the eager (≤ 8 KiB) and rendezvous paths, never a hang:
//  - rendezvous into rendezvous: the sender finds it when the advert arrives;
//  - eager into eager, eager into a rendezvous recv: the send completes when posted (its
//    payload travels with the message), the receiver finds the mismatch and the sender
//    learns it at its next call (the barrier);
//  - rendezvous into an eager recv: the send waits for an advert that never comes, and both
//    sides report the stall after the timeout.
TEST(VerbsTransport, SizeMismatchFailsBothSides) {
  struct Case {
    size_t send, recv;
    const char* expect;
    bool recv_late = false;  // the receiver posts 300 ms late: an eager send arrives first
  };
  for (const Case c : {Case{100000, 200000, "matched a recv of 200000 bytes"},
                       Case{100, 200, "matched a recv of 200 bytes"},
                       Case{100, 100000, "matched a recv of 100000 bytes"},
                       Case{100, 100000, "matched a recv of 100000 bytes", true},
                       Case{100000, 100, "no progress within 3000 ms"}}) {
    SCOPED_TRACE("send " + std::to_string(c.send) + " recv " + std::to_string(c.recv) +
                 (c.recv_late ? " posted late" : ""));
    test::RootProcess root;
    const UniqueId id = root.id();
    auto res = run_ranks(2,
                         [&](int r) {
                           auto t = connect_transport(id, 2, r);
                           std::vector<uint8_t> buf(1 << 20);
                           auto B = t->register_buffer(buf.data(), buf.size());
                           try {
                             if (r == 0)
                               t->wait(t->send(1, *B, 0, c.send, 3), "Mismatch");
                             else {
                               if (c.recv_late) std::this_thread::sleep_for(300ms);
                               t->wait(t->recv(0, *B, 0, c.recv, 3), "Mismatch");
                             }
                             t->barrier("after");
                           } catch (const PeerError& e) {
                             require(e.peer() == 1 - r, std::string("wrong peer in: ") + e.what());
                             std::printf("ok: %s\n", e.what());
                             return;
                           }
                           throw std::runtime_error("no PeerError");
                         },
                         60s, {{"SOFTRDMA_CCL_TIMEOUT_MS", "3000"}});
    std::printf("%s", test::describe(res).c_str());
    for (const auto& r : res) ASSERT_EQ(0, r.exit_code) << test::describe(res);
    for (const auto& r : res)
      EXPECT_NE(std::string::npos, r.output.find(c.expect)) << test::describe(res);
  }
}

// A rank dies (SIGKILL) in the middle of a ring exchange: every other rank raises PeerError
// naming it, well within the timeout, including ranks that never talk to it — with one
// channel and eager-sized transfers, and with three channels and transfers striped over all
// of them (so the error completions may come from any of the peer's QPs).
class DeadPeer : public ::testing::TestWithParam<std::pair<int, size_t>> {};

TEST_P(DeadPeer, NamedByEveryRank) {
  const int n = 4, victim = 2;
  const auto [channels, bytes] = GetParam();
  test::RootProcess root;
  const UniqueId id = root.id();
  auto res = run_ranks(
      n,
      [&](int r) {
        auto t = connect_transport(id, n, r);
        std::vector<uint8_t> buf(2 * bytes);
        auto B = t->register_buffer(buf.data(), buf.size());
        t->barrier("start");
        if (r == victim) {
          std::this_thread::sleep_for(100ms);
          raise(SIGKILL);
        }
        const auto t0 = Clock::now();
        try {
          for (uint64_t i = 0;; ++i) {
            // Ring: receive from the left, send to the right.
            RequestId rr = t->recv((r + n - 1) % n, *B, 0, bytes, i);
            RequestId sr = t->send((r + 1) % n, *B, bytes, bytes, i);
            t->wait(rr, "AllReduce");
            t->wait(sr, "AllReduce");
          }
        } catch (const PeerError& e) {
          const double s = std::chrono::duration<double>(Clock::now() - t0).count();
          std::printf("after %.2f s: %s\n", s, e.what());
          require(e.peer() == victim, std::string("blamed the wrong peer: ") + e.what());
          require(std::string(e.what()).find("peer rank 2 (127.0.0.") != std::string::npos,
                  std::string("message does not name the peer: ") + e.what());
          require(std::string(e.what()).rfind("AllReduce: rank ", 0) == 0,
                  std::string("message does not name the operation: ") + e.what());
          require(s < 3.0, "took longer than the timeout");
          return;
        }
      },
      60s,
      {{"SOFTRDMA_CCL_TIMEOUT_MS", "3000"}, {"SOFTRDMA_CCL_CHANNELS", std::to_string(channels)}});
  std::printf("%s", test::describe(res).c_str());  // each rank's error and timing
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(0, res[r].exit_code) << test::describe(res);
  }
}

INSTANTIATE_TEST_SUITE_P(VerbsTransport, DeadPeer,
                         ::testing::Values(std::pair<int, size_t>{1, 4096},
                                           std::pair<int, size_t>{3, 384 * 1024}),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "Channels" +
                                  std::to_string(info.param.second) + "Bytes";
                         });

// A peer that is alive (its device answers) but never posts the matching operation: the
// waiting rank gives up after the timeout with "no progress".
TEST(VerbsTransport, StalledPeerTimesOut) {
  test::RootProcess root;
  const UniqueId id = root.id();
  auto res = run_ranks(
      2,
      [&](int r) {
        auto t = connect_transport(id, 2, r);
        std::vector<uint8_t> buf(4096);
        auto B = t->register_buffer(buf.data(), buf.size());
        if (r == 1) {
          std::this_thread::sleep_for(2500ms);
          return;
        }
        const auto t0 = Clock::now();
        try {
          t->wait(t->recv(1, *B, 0, 64, 1), "Broadcast");
        } catch (const PeerError& e) {
          const double s = std::chrono::duration<double>(Clock::now() - t0).count();
          std::printf("after %.2f s: %s\n", s, e.what());
          require(e.peer() == 1, "wrong peer");
          require(std::string(e.what()).find("no progress within 1000 ms") != std::string::npos,
                  "wrong reason");
          require(s >= 0.9 && s < 2.0, "timeout not honoured");
          return;
        }
        throw std::runtime_error("no PeerError");
      },
      60s, {{"SOFTRDMA_CCL_TIMEOUT_MS", "1000"}});
  for (const auto& r : res) ASSERT_EQ(0, r.exit_code) << test::describe(res);
}

// Ranks that finish and close their transport say goodbye: the others, still busy with each
// other past several probe intervals, must not mistake them for dead peers.
TEST(VerbsTransport, CleanExitIsNotDeath) {
  run_ok(4,
         [](Transport& t) {
           t.barrier("start");
           if (t.rank() == 0 || t.rank() == 3) return;  // closes its transport and exits
           std::vector<uint8_t> buf(4096);
           auto B = t.register_buffer(buf.data(), buf.size());
           if (t.rank() == 2) {
             std::this_thread::sleep_for(1200ms);
             fill(buf, 0, 4096, 2, 1);
             t.wait(t.send(1, *B, 0, 4096, 1), "late");
           } else {
             t.wait(t.recv(2, *B, 0, 4096, 1), "late");
             verify(buf, 0, 4096, 2, 1, "late");
           }
         },
         {{"SOFTRDMA_CCL_TIMEOUT_MS", "2000"}});
}

}  // namespace
}  // namespace softrdma::ccl

namespace softrdma::ccl {
namespace {

// path_bytes: the RTT timed at connect × softrdma's port rate (4X EDR, 100 Gbit/s). Over an
// emulated 25 ms each way (SOFTRDMA_WAN) the RTT is at least 50 ms, so at least 625 MB; on
// loopback it is well under that even on a loaded machine (the smallest of five probes).
TEST(VerbsTransport, PathBytesIsTheMeasuredRoundTripTimesThePortRate) {
  constexpr uint64_t kBdp50ms = 100'000'000'000 / 8 / 20;  // 100 Gbit/s × 50 ms, bytes
  for (const bool wan : {false, true}) {
    SCOPED_TRACE(wan ? "25 ms each way" : "loopback");
    EnvList env;
    if (wan) env.emplace_back("SOFTRDMA_WAN", "delay=25ms");
    run_ok(
        2,
        [wan](Transport& t) {
          const uint64_t b = t.path_bytes(1 - t.rank());
          const std::string got = "path_bytes " + std::to_string(b);
          require(t.path_bytes(t.rank()) == 0, "path_bytes to self is not 0");
          if (wan)
            require(b >= kBdp50ms && b < 20 * kBdp50ms, got + ": not an RTT of 50 ms..1 s");
          else
            require(b > 0 && b < kBdp50ms, got + ": not an RTT under 50 ms");
        },
        env);
  }
}

}  // namespace
}  // namespace softrdma::ccl
