// Group calls (ccl.h group_start/group_end, NCCL "Group Calls") over the loopback transport,
// which is rendezvous: a send completes only once its recv was posted, so every pattern
// below that would need concurrency deadlocks (and times out) unless the group posts all of
// its transfers before waiting. Ranks 1..8; small chunks and depths make transfers span many
// chunks and windows.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ccl/tests/test_util.h"

namespace softrdma::ccl {
namespace {

using std::chrono::milliseconds;
using testing::run_ranks;
constexpr auto I32 = DataType::kInt32;

// Element i of message `msg` from rank `src` to rank `dst`.
int32_t value(int src, int dst, int msg, size_t i) {
  return src * 1000003 + dst * 7919 + msg * 131 + static_cast<int32_t>(i % 100000);
}

std::vector<int32_t> message(int src, int dst, int msg, size_t count) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value(src, dst, msg, i);
  return v;
}

// Wrong elements of `got` against message(src, dst, msg, ·) (all of it when none).
size_t wrong(const std::vector<int32_t>& got, int src, int dst, int msg) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != value(src, dst, msg, i);
  return bad;
}

Config small_chunks(size_t chunk_bytes, int depth) {
  Config c;
  c.chunk_bytes = chunk_bytes;
  c.depth = depth;
  return c;
}

struct Shape {
  size_t chunk_bytes;
  int depth;
};
// One chunk per message; many chunks, one in flight; many chunks, a few in flight.
constexpr Shape kShapes[] = {{512 * 1024, 4}, {64, 1}, {256, 3}};

TEST(Group, RingExchangeOfEveryRankCompletes) {
  // Every rank: {send to next, recv from prev} — blocking calls in this order deadlock.
  for (const Shape& sh : kShapes) {
    for (int n = 1; n <= 8; ++n) {
      for (size_t count : {size_t{1}, size_t{1000}}) {
        const std::string err =
            run_ranks(n, small_chunks(sh.chunk_bytes, sh.depth), [&](Communicator& c) {
              const int r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
              std::vector<int32_t> out = message(r, next, 0, count), in(count, -1);
              c.group_start();
              c.send(out.data(), count, I32, next);
              c.recv(in.data(), count, I32, prev);
              c.group_end();
              if (wrong(in, prev, r, 0) != 0)
                throw std::runtime_error("wrong data from " + std::to_string(prev));
            });
        EXPECT_EQ(err, "") << "n=" << n << " count=" << count << " chunk=" << sh.chunk_bytes;
      }
    }
  }
}

TEST(Group, AllToAllOfSendsAndRecvsWithSizesPerPeerIncludingZero) {
  // count(src → dst) differs per pair, is 0 for some pairs (and for src == dst when n is
  // odd), and each rank calls its sends and recvs in its own order: the recvs first and in
  // reverse on odd ranks, the sends first and rotated on even ones.
  auto count = [](int src, int dst) -> size_t {
    return (src + 2 * dst) % 4 == 0 ? 0 : static_cast<size_t>(37 * src + 101 * dst + 5);
  };
  for (const Shape& sh : kShapes) {
    for (int n = 1; n <= 8; ++n) {
      const std::string err =
          run_ranks(n, small_chunks(sh.chunk_bytes, sh.depth), [&](Communicator& c) {
            const int r = c.rank();
            std::vector<std::vector<int32_t>> out(static_cast<size_t>(n)),
                in(static_cast<size_t>(n));
            for (int p = 0; p < n; ++p) {
              out[static_cast<size_t>(p)] = message(r, p, 1, count(r, p));
              in[static_cast<size_t>(p)].assign(count(p, r), -1);
            }
            auto sends = [&] {
              for (int k = 0; k < n; ++k) {
                const int p = (r + k) % n;
                auto& v = out[static_cast<size_t>(p)];
                c.send(v.data(), v.size(), I32, p);
              }
            };
            auto recvs = [&] {
              for (int k = n - 1; k >= 0; --k) {
                auto& v = in[static_cast<size_t>(k)];
                c.recv(v.data(), v.size(), I32, k);
              }
            };
            c.group_start();
            if (r % 2 == 0) {
              sends();
              recvs();
            } else {
              recvs();
              sends();
            }
            c.group_end();
            for (int p = 0; p < n; ++p)
              if (wrong(in[static_cast<size_t>(p)], p, r, 1) != 0)
                throw std::runtime_error("wrong data from " + std::to_string(p));
          });
      EXPECT_EQ(err, "") << "n=" << n << " chunk=" << sh.chunk_bytes;
    }
  }
}

TEST(Group, SeveralMessagesToOnePeerKeepCallOrder) {
  // Three sends of different sizes to the next rank in one group: one stream, matched by
  // the recvs in the same order with their own sequence numbers.
  const size_t counts[] = {300, 1, 77};
  for (int n = 2; n <= 4; ++n) {
    const std::string err = run_ranks(n, small_chunks(64, 2), [&](Communicator& c) {
      const int r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      std::vector<std::vector<int32_t>> out, in;
      for (int m = 0; m < 3; ++m) {
        out.push_back(message(r, next, m, counts[m]));
        in.emplace_back(counts[m], -1);
      }
      c.group_start();
      for (int m = 0; m < 3; ++m) c.recv(in[static_cast<size_t>(m)].data(), counts[m], I32, prev);
      for (int m = 0; m < 3; ++m) c.send(out[static_cast<size_t>(m)].data(), counts[m], I32, next);
      c.group_end();
      for (int m = 0; m < 3; ++m)
        if (wrong(in[static_cast<size_t>(m)], prev, r, m) != 0)
          throw std::runtime_error("message " + std::to_string(m) + " wrong");
    });
    EXPECT_EQ(err, "") << "n=" << n;
  }
}

TEST(Group, NestedGroupsIssueOnlyAtTheOutermostEnd) {
  constexpr int n = 2;
  LoopbackFabric f(n, milliseconds(20000));
  std::mutex mu;
  std::vector<uint64_t> after_inner(n, 99);
  const std::string err = run_ranks(
      n, Config{},
      [&](Communicator& c) {
        const int r = c.rank(), peer = 1 - r;
        std::vector<int32_t> out = message(r, peer, 2, 500), in(500, -1);
        c.group_start();
        c.group_start();
        c.send(out.data(), out.size(), I32, peer);
        c.group_end();  // inner: nothing issued; a blocking send here would never complete
        {
          std::lock_guard lk(mu);
          after_inner[static_cast<size_t>(r)] = f.transfers(r, peer);
        }
        c.group_start();
        c.recv(in.data(), in.size(), I32, peer);
        c.group_end();
        c.group_end();
        if (wrong(in, peer, r, 2) != 0) throw std::runtime_error("wrong data");
      },
      milliseconds(20000), &f);
  EXPECT_EQ(err, "");
  EXPECT_EQ(after_inner[0], 0u);
  EXPECT_EQ(after_inner[1], 0u);
  EXPECT_EQ(f.transfers(0, 1), 1u);
  EXPECT_EQ(f.transfers(1, 0), 1u);
}

TEST(Group, CollectivesInsideAGroupMixWithPointToPoint) {
  // The collectives (in the same order everywhere) sit before, between or after the ring
  // exchange depending on the rank; aggregated AllReduces as nccl-tests' -m issues them.
  for (int n = 1; n <= 8; ++n) {
    for (Algorithm algo : {Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
      Config cfg = small_chunks(128, 2);
      cfg.algorithm = algo;
      const std::string err = run_ranks(n, cfg, [&](Communicator& c) {
        const int r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
        constexpr size_t kCount = 300;
        std::vector<int32_t> out = message(r, next, 3, kCount), in(kCount, -1);
        std::vector<std::vector<int32_t>> sums(4, std::vector<int32_t>(kCount, 0));
        std::vector<int32_t> mine(kCount), bcast(kCount, -1);
        std::iota(mine.begin(), mine.end(), r);
        if (r == 0) bcast = mine;
        c.group_start();
        if (r % 3 == 0) c.send(out.data(), kCount, I32, next);
        for (int k = 0; k < 2; ++k)
          c.all_reduce(mine.data(), sums[static_cast<size_t>(k)].data(), kCount, I32, RedOp::kSum);
        if (r % 3 == 1) {
          c.recv(in.data(), kCount, I32, prev);
          c.send(out.data(), kCount, I32, next);
        }
        c.broadcast(bcast.data(), bcast.data(), kCount, I32, 0);
        for (int k = 2; k < 4; ++k)
          c.all_reduce(mine.data(), sums[static_cast<size_t>(k)].data(), kCount, I32, RedOp::kSum);
        if (r % 3 == 0) c.recv(in.data(), kCount, I32, prev);
        if (r % 3 == 2) {
          c.send(out.data(), kCount, I32, next);
          c.recv(in.data(), kCount, I32, prev);
        }
        c.group_end();
        if (wrong(in, prev, r, 3) != 0) throw std::runtime_error("wrong p2p data");
        for (size_t i = 0; i < kCount; ++i) {
          const auto want = static_cast<int32_t>(n * static_cast<int>(i) + n * (n - 1) / 2);
          for (const auto& s : sums)
            if (s[i] != want) throw std::runtime_error("wrong AllReduce at " + std::to_string(i));
          if (bcast[i] != static_cast<int32_t>(i)) throw std::runtime_error("wrong Broadcast");
        }
      });
      EXPECT_EQ(err, "") << "n=" << n << " algo=" << static_cast<int>(algo);
    }
  }
}

TEST(Group, GroupedAndUngroupedPointToPointInterleave) {
  // Rank 0: group{send m0, send m1}, then a blocking send m2. Rank 1: a blocking recv m0,
  // then group{recv m1, recv m2}. Matched by per-pair sequence numbers in call order.
  const size_t counts[] = {1000, 333, 2000};
  for (const Shape& sh : kShapes) {
    const std::string err =
        run_ranks(2, small_chunks(sh.chunk_bytes, sh.depth), [&](Communicator& c) {
          std::vector<std::vector<int32_t>> v;
          for (int m = 0; m < 3; ++m)
            v.push_back(c.rank() == 0 ? message(0, 1, m, counts[m])
                                      : std::vector<int32_t>(counts[m], -1));
          auto buf = [&](int m) { return v[static_cast<size_t>(m)].data(); };
          if (c.rank() == 0) {
            c.group_start();
            c.send(buf(0), counts[0], I32, 1);
            c.send(buf(1), counts[1], I32, 1);
            c.group_end();
            c.send(buf(2), counts[2], I32, 1);
          } else {
            c.recv(buf(0), counts[0], I32, 0);
            c.group_start();
            c.recv(buf(1), counts[1], I32, 0);
            c.recv(buf(2), counts[2], I32, 0);
            c.group_end();
            for (int m = 0; m < 3; ++m)
              if (wrong(v[static_cast<size_t>(m)], 0, 1, m) != 0)
                throw std::runtime_error("message " + std::to_string(m) + " wrong");
          }
        });
    EXPECT_EQ(err, "") << "chunk=" << sh.chunk_bytes;
  }
}

TEST(Group, EndWithoutStartIsInvalid) {
  LoopbackFabric f(2, milliseconds(1000));
  Communicator c(f.transport(0), Config{});
  try {
    c.group_end();
    ADD_FAILURE() << "group_end without group_start accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "GroupEnd: rank 0: group_end without group_start");
  }
  c.group_start();
  c.group_end();  // an empty group issues nothing
  EXPECT_THROW(c.group_end(), std::invalid_argument);
}

TEST(Group, InvalidCallInsideAGroupEndsItAndIssuesNothing) {
  constexpr int n = 2;
  LoopbackFabric f(n, milliseconds(20000));
  const std::string err = run_ranks(
      n, Config{},
      [&](Communicator& c) {
        const int r = c.rank(), peer = 1 - r;
        std::vector<int32_t> out = message(r, peer, 4, 64), in(64, -1);
        c.group_start();
        c.group_start();
        c.send(out.data(), out.size(), I32, peer);  // valid, then dropped with the group
        try {
          c.recv(nullptr, 64, I32, peer);
          throw std::runtime_error("null recv buffer accepted in a group");
        } catch (const std::invalid_argument& e) {
          if (std::string(e.what()).rfind("Recv: rank " + std::to_string(r) + ": null", 0) != 0)
            throw std::runtime_error(std::string("unexpected message: ") + e.what());
        }
        // Both levels ended: no group is open and nothing was sent.
        bool open = true;
        try {
          c.group_end();
        } catch (const std::invalid_argument&) {
          open = false;
        }
        if (open) throw std::runtime_error("the group stayed open after an invalid call");
        // Sequence numbers untouched: a fresh exchange matches the peer's.
        c.group_start();
        c.send(out.data(), out.size(), I32, peer);
        c.recv(in.data(), in.size(), I32, peer);
        c.group_end();
        if (wrong(in, peer, r, 4) != 0) throw std::runtime_error("wrong data after the error");
      },
      milliseconds(20000), &f);
  EXPECT_EQ(err, "");
  EXPECT_EQ(f.transfers(0, 1), 1u);
  EXPECT_EQ(f.transfers(1, 0), 1u);
}

TEST(Group, SelfSendAndRecvOnlyInsideAGroup) {
  LoopbackFabric f(1, milliseconds(5000));
  Communicator c(f.transport(0), small_chunks(64, 2));
  std::vector<int32_t> out = message(0, 0, 5, 100), in(100, -1);
  EXPECT_THROW(c.send(out.data(), out.size(), I32, 0), std::invalid_argument);
  c.group_start();
  c.recv(in.data(), in.size(), I32, 0);
  c.send(out.data(), out.size(), I32, 0);
  c.group_end();
  EXPECT_EQ(wrong(in, 0, 0, 5), 0u);
}

TEST(Group, DeadPeerAtGroupEndIsNamed) {
  constexpr int n = 3;
  constexpr int dead = 2;
  LoopbackFabric f(n, milliseconds(3000));
  f.kill(dead);
  std::mutex mu;
  std::vector<std::string> messages(n);
  std::vector<int> peers(n, -2);
  std::vector<std::thread> threads;
  for (int r = 0; r < dead; ++r) {
    threads.emplace_back([&, r] {
      Communicator c(f.transport(r), Config{});
      std::vector<int32_t> out(1000, r), in(1000);
      try {
        c.group_start();
        c.send(out.data(), out.size(), I32, dead);
        c.recv(in.data(), in.size(), I32, dead);
        c.group_end();
      } catch (const PeerError& e) {
        std::lock_guard lk(mu);
        messages[static_cast<size_t>(r)] = e.what();
        peers[static_cast<size_t>(r)] = e.peer();
      }
      // The group ended with the error: a new one may start (and fails as unusable).
      try {
        c.group_start();
        c.group_end();
      } catch (const std::exception& e) {
        std::lock_guard lk(mu);
        messages[static_cast<size_t>(r)] += std::string(" | then: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < dead; ++r) {
    const std::string& m = messages[static_cast<size_t>(r)];
    EXPECT_EQ(m.rfind("GroupEnd: rank " + std::to_string(r) + ": ", 0), 0u) << m;
    EXPECT_NE(m.find("rank 2 (loopback)"), std::string::npos) << m;
    EXPECT_EQ(peers[static_cast<size_t>(r)], dead) << m;
    EXPECT_EQ(m.find(" | then: "), std::string::npos) << m;  // an empty group issues nothing
  }
}

}  // namespace
}  // namespace softrdma::ccl
