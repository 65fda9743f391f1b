// Communicator errors and resources: argument validation (std::invalid_argument, the
// communicator stays usable), PeerError when a rank dies or stalls (naming operation, local
// rank and peer, within the transport timeout; the communicator is unusable afterwards),
// and the registration cache.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ccl/tests/test_util.h"

namespace softrdma::ccl {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using testing::run_ranks;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Expects std::invalid_argument whose message starts with `prefix`.
template <class F>
void expect_invalid(F&& f, const std::string& prefix) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected " << prefix;
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(starts_with(e.what(), prefix)) << e.what();
  }
}

TEST(Validation, RejectsBadArguments) {
  // Validation happens before any communication, so rank 0 alone of a 2-rank fabric.
  LoopbackFabric f(2, milliseconds(1000));
  Communicator c(f.transport(0), Config{});
  const auto F32 = DataType::kFloat32;
  float a[16] = {};
  float b[16] = {};
  const auto bad_type = static_cast<DataType>(17);
  const auto bad_op = static_cast<RedOp>(9);
  const size_t huge = SIZE_MAX / 2;

  expect_invalid([&] { c.all_reduce(nullptr, b, 4, F32, RedOp::kSum); }, "AllReduce: rank 0: null");
  expect_invalid([&] { c.all_reduce(a, nullptr, 4, F32, RedOp::kSum); }, "AllReduce: rank 0: null");
  expect_invalid([&] { c.all_reduce(a, a + 1, 4, F32, RedOp::kSum); },
                 "AllReduce: rank 0: send and recv buffers overlap");
  expect_invalid([&] { c.all_reduce(a, b, 4, bad_type, RedOp::kSum); },
                 "AllReduce: rank 0: unknown DataType");
  expect_invalid([&] { c.all_reduce(a, b, 4, F32, bad_op); }, "AllReduce: rank 0: unknown RedOp");
  expect_invalid([&] { c.all_reduce(a, b, huge, F32, RedOp::kSum); }, "AllReduce: rank 0: count");

  expect_invalid([&] { c.broadcast(a, b, 4, F32, 2); }, "Broadcast: rank 0: root 2 out of range");
  expect_invalid([&] { c.broadcast(a, b, 4, F32, -1); }, "Broadcast: rank 0: root -1");
  expect_invalid([&] { c.broadcast(nullptr, b, 4, F32, 0); },
                 "Broadcast: rank 0: null send buffer on the root");
  expect_invalid([&] { c.broadcast(a, nullptr, 4, F32, 1); }, "Broadcast: rank 0: null recv");

  expect_invalid([&] { c.reduce(a, b, 4, F32, RedOp::kMax, 5); }, "Reduce: rank 0: root 5");
  expect_invalid([&] { c.reduce(nullptr, b, 4, F32, RedOp::kMax, 1); },
                 "Reduce: rank 0: null send");
  expect_invalid([&] { c.reduce(a, nullptr, 4, F32, RedOp::kMax, 0); },
                 "Reduce: rank 0: null recv buffer on the root");
  expect_invalid([&] { c.reduce(a, b, 4, F32, bad_op, 0); }, "Reduce: rank 0: unknown RedOp");

  // AllGather: recv holds size()·count; in place is send == recv + rank·count (rank 0: recv).
  expect_invalid([&] { c.all_gather(a + 1, a, 4, F32); },
                 "AllGather: rank 0: send buffer overlaps");
  expect_invalid([&] { c.all_gather(a, b, huge, F32); }, "AllGather: rank 0: count");
  expect_invalid([&] { c.all_gather(nullptr, b, 1, F32); }, "AllGather: rank 0: null");

  expect_invalid([&] { c.reduce_scatter(a, a + 1, 4, F32, RedOp::kSum); },
                 "ReduceScatter: rank 0: recv buffer overlaps");
  expect_invalid([&] { c.reduce_scatter(a, b, huge, F32, RedOp::kSum); },
                 "ReduceScatter: rank 0: count");

  expect_invalid([&] { c.all_to_all(a, a + 2, 4, F32); },
                 "AllToAll: rank 0: send and recv buffers overlap");
  expect_invalid([&] { c.all_to_all(a, nullptr, 4, F32); }, "AllToAll: rank 0: null");

  expect_invalid([&] { c.send(a, 4, F32, 0); }, "Send: rank 0: peer is this rank");
  expect_invalid([&] { c.send(a, 4, F32, 2); }, "Send: rank 0: peer 2 out of range");
  expect_invalid([&] { c.send(nullptr, 4, F32, 1); }, "Send: rank 0: null");
  expect_invalid([&] { c.recv(a, 4, F32, -3); }, "Recv: rank 0: peer -3");
  expect_invalid([&] { c.recv(a, 4, bad_type, 1); }, "Recv: rank 0: unknown DataType");

  // Count 0 accepts null buffers and does nothing.
  c.all_reduce(nullptr, nullptr, 0, F32, RedOp::kSum);
  c.send(nullptr, 0, F32, 1);
}

TEST(Validation, CommunicatorStaysUsableAfterAnInvalidCall) {
  LoopbackFabric f(1);
  Communicator c(f.transport(0), Config{});
  float x[2] = {1, 2};
  float y[2] = {};
  EXPECT_THROW(c.all_reduce(nullptr, y, 2, DataType::kFloat32, RedOp::kSum), std::invalid_argument);
  c.all_reduce(x, y, 2, DataType::kFloat32, RedOp::kAvg);
  EXPECT_EQ(y[1], 2.0f);
  c.all_gather(x, y, 2, DataType::kFloat32);
  EXPECT_EQ(y[0], 1.0f);
  c.barrier();
}

TEST(Validation, RejectsBadConfigAndTransport) {
  LoopbackFabric f(3);
  Config c;
  c.depth = 0;
  EXPECT_THROW(Communicator(f.transport(0), c), std::invalid_argument);
  c = Config{};
  c.chunk_bytes = 0;
  EXPECT_THROW(Communicator(f.transport(1), c), std::invalid_argument);
  c = Config{};
  c.algorithm = static_cast<Algorithm>(7);
  EXPECT_THROW(Communicator(f.transport(2), c), std::invalid_argument);
  EXPECT_THROW(Communicator(nullptr, Config{}), std::invalid_argument);
}

// One rank is dead before the operation starts. Every survivor whose result depends on the
// dead rank (all of them when `all_fail`; a Broadcast/Reduce rank upstream of it may finish)
// fails within the timeout with a PeerError starting "<op>: rank <r>: ", at least one names
// the dead rank, and a failed communicator refuses further calls. `op` runs the collective.
struct DeadRankCase {
  const char* name;
  int ranks;
  Algorithm algo;
  bool all_fail;
  std::function<void(Communicator&, std::vector<float>&, std::vector<float>&)> op;
};

class DeadRankTest : public ::testing::TestWithParam<DeadRankCase> {};

TEST_P(DeadRankTest, SurvivorsGetPeerErrorNamingOpRankAndPeer) {
  const DeadRankCase& k = GetParam();
  constexpr milliseconds kTimeout(3000);
  const int dead = k.ranks - 1;
  LoopbackFabric f(k.ranks, kTimeout);
  Config cfg;
  cfg.algorithm = k.algo;
  cfg.chunk_bytes = 256;
  std::mutex mu;
  std::vector<std::string> messages(static_cast<size_t>(k.ranks));
  std::vector<int> peers(static_cast<size_t>(k.ranks), -2);
  std::vector<double> seconds(static_cast<size_t>(k.ranks), 0);
  std::vector<std::string> second_call(static_cast<size_t>(k.ranks));
  f.kill(dead);
  std::vector<std::thread> threads;
  for (int r = 0; r < dead; ++r) {
    threads.emplace_back([&, r] {
      Communicator c(f.transport(r), cfg);
      std::vector<float> x(4096, 1.0f), y(4096 * static_cast<size_t>(k.ranks), 0.0f);
      const auto start = Clock::now();
      try {
        k.op(c, x, y);
      } catch (const PeerError& e) {
        std::lock_guard lk(mu);
        messages[static_cast<size_t>(r)] = e.what();
        peers[static_cast<size_t>(r)] = e.peer();
      }
      seconds[static_cast<size_t>(r)] = std::chrono::duration<double>(Clock::now() - start).count();
      if (!messages[static_cast<size_t>(r)].empty()) {
        try {
          c.barrier();
        } catch (const PeerError& e) {
          second_call[static_cast<size_t>(r)] = e.what();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  int named = 0;
  for (int r = 0; r < dead; ++r) {
    const auto i = static_cast<size_t>(r);
    EXPECT_LT(seconds[i], std::chrono::duration<double>(kTimeout).count() + 1.0) << "rank " << r;
    if (!k.all_fail && messages[i].empty()) {
      EXPECT_EQ(second_call[i], "") << "rank " << r;  // finished fine, still usable
      continue;
    }
    const std::string prefix = std::string(k.name) + ": rank " + std::to_string(r) + ": ";
    EXPECT_TRUE(starts_with(messages[i], prefix)) << "rank " << r << ": '" << messages[i] << "'";
    EXPECT_GE(peers[i], 0) << messages[i];
    if (peers[i] == dead) {
      ++named;
      EXPECT_NE(messages[i].find("rank " + std::to_string(dead)), std::string::npos) << messages[i];
    }
    EXPECT_TRUE(starts_with(second_call[i], "Barrier: rank " + std::to_string(r) +
                                                ": communicator unusable after an earlier failure"))
        << second_call[i];
  }
  EXPECT_GE(named, 1);
}

void all_reduce(Communicator& c, std::vector<float>& x, std::vector<float>& y) {
  c.all_reduce(x.data(), y.data(), x.size(), DataType::kFloat32, RedOp::kSum);
}

INSTANTIATE_TEST_SUITE_P(
    All, DeadRankTest,
    ::testing::Values(
        DeadRankCase{"AllReduce", 3, Algorithm::kRing, true, all_reduce},
        DeadRankCase{"AllReduce", 4, Algorithm::kRing, true, all_reduce},
        DeadRankCase{"AllReduce", 3, Algorithm::kRecursiveDoubling, true, all_reduce},
        DeadRankCase{"AllReduce", 8, Algorithm::kRecursiveDoubling, true, all_reduce},
        DeadRankCase{"AllReduce", 5, Algorithm::kRabenseifner, true, all_reduce},
        DeadRankCase{"Broadcast", 4, Algorithm::kRing, false,
                     [](Communicator& c, std::vector<float>& x, std::vector<float>&) {
                       c.broadcast(x.data(), x.data(), x.size(), DataType::kFloat32, 0);
                     }},
        DeadRankCase{"Reduce", 3, Algorithm::kRecursiveDoubling, false,
                     [](Communicator& c, std::vector<float>& x, std::vector<float>& y) {
                       c.reduce(x.data(), y.data(), x.size(), DataType::kFloat32, RedOp::kMax, 0);
                     }},
        DeadRankCase{"AllGather", 3, Algorithm::kAuto, true,
                     [](Communicator& c, std::vector<float>& x, std::vector<float>& y) {
                       c.all_gather(x.data(), y.data(), x.size(), DataType::kFloat32);
                     }},
        DeadRankCase{"ReduceScatter", 3, Algorithm::kAuto, true,
                     [](Communicator& c, std::vector<float>&, std::vector<float>& y) {
                       std::vector<float> out(y.size() / 3);
                       c.reduce_scatter(y.data(), out.data(), out.size(), DataType::kFloat32,
                                        RedOp::kSum);
                     }},
        DeadRankCase{"AllGather", 3, Algorithm::kRecursiveDoubling, true,
                     [](Communicator& c, std::vector<float>& x, std::vector<float>& y) {
                       c.all_gather(x.data(), y.data(), x.size(), DataType::kFloat32);
                     }},
        DeadRankCase{"ReduceScatter", 5, Algorithm::kRecursiveDoubling, true,
                     [](Communicator& c, std::vector<float>&, std::vector<float>& y) {
                       std::vector<float> out(y.size() / 5);
                       c.reduce_scatter(y.data(), out.data(), out.size(), DataType::kFloat32,
                                        RedOp::kSum);
                     }},
        DeadRankCase{"AllToAll", 4, Algorithm::kAuto, true,
                     [](Communicator& c, std::vector<float>&, std::vector<float>& y) {
                       std::vector<float> out(y.size());
                       c.all_to_all(y.data(), out.data(), y.size() / 4, DataType::kFloat32);
                     }},
        DeadRankCase{
            "Barrier", 5, Algorithm::kAuto, true,
            [](Communicator& c, std::vector<float>&, std::vector<float>&) { c.barrier(); }},
        DeadRankCase{"Recv", 2, Algorithm::kAuto, true,
                     [](Communicator& c, std::vector<float>& x, std::vector<float>&) {
                       c.recv(x.data(), x.size(), DataType::kFloat32, 1);
                     }}),
    [](const ::testing::TestParamInfo<DeadRankCase>& i) {
      return std::string(i.param.name) + "_" + std::to_string(i.param.ranks) + "ranks_" +
             std::to_string(i.index);
    });

// A rank that dies in the middle of a sequence of operations, and a rank that simply stops
// calling (no kill): the survivors fail within the timeout, the silent one is named with
// "no progress".
TEST(PeerFailure, RankDiesBetweenOperations) {
  constexpr int n = 4;
  LoopbackFabric f(n, milliseconds(3000));
  Config cfg;
  cfg.algorithm = Algorithm::kRing;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Communicator c(f.transport(r), cfg);
      std::vector<int32_t> x(100000, r), y(100000);
      try {
        for (int i = 0; i < 5; ++i) {
          if (r == 1 && i == 3) {
            f.kill(1);
            return;
          }
          c.all_reduce(x.data(), y.data(), x.size(), DataType::kInt32, RedOp::kSum);
          if (y[0] != n * (n - 1) / 2) throw std::runtime_error("wrong sum");
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r : {0, 2, 3})
    EXPECT_TRUE(starts_with(errors[static_cast<size_t>(r)], "AllReduce: rank " + std::to_string(r)))
        << errors[static_cast<size_t>(r)];
  EXPECT_NE(errors[2].find("peer rank 1 (loopback): killed"), std::string::npos) << errors[2];
}

TEST(PeerFailure, SilentRankTimesOut) {
  LoopbackFabric f(2, milliseconds(300));
  std::string error;
  int peer = -2;
  double elapsed = 0;
  std::thread silent([&] {
    auto t = f.transport(1);  // joins, then never calls
    std::this_thread::sleep_for(milliseconds(1500));
  });
  {
    Communicator c(f.transport(0), Config{});
    float x = 1, y = 0;
    const auto start = Clock::now();
    try {
      c.all_reduce(&x, &y, 1, DataType::kFloat32, RedOp::kSum);
    } catch (const PeerError& e) {
      error = e.what();
      peer = e.peer();
    }
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  silent.join();
  EXPECT_EQ(error, "AllReduce: rank 0: peer rank 1 (loopback): no progress within 300 ms");
  EXPECT_EQ(peer, 1);
  EXPECT_GE(elapsed, 0.25);
  EXPECT_LT(elapsed, 1.4);
}

// Repeated operations on the same buffers register nothing; a buffer containing a cached
// one registers once, after which its sub-ranges hit; partially overlapping ranges never
// reuse a registration that does not cover them; the cache stays bounded.
TEST(RegistrationCache, RepeatedCallsRegisterNothing) {
  constexpr int n = 3;
  LoopbackFabric f(n);
  std::vector<uint64_t> after_first(n), after_repeat(n), after_bigger(n), after_sub(n),
      after_overlap(n), live(n);
  Config cfg;
  cfg.algorithm = Algorithm::kRing;
  const std::string err = run_ranks(
      n, cfg,
      [&](Communicator& c) {
        const auto r = static_cast<size_t>(c.rank());
        const int rank = c.rank();
        std::vector<float> big(300000, 1.0f), out(300000);
        const size_t count = 100000;
        c.all_reduce(big.data(), out.data(), count, DataType::kFloat32, RedOp::kSum);
        c.barrier();
        after_first[r] = f.registrations(rank);
        for (int i = 0; i < 10; ++i) {
          c.all_reduce(big.data(), out.data(), count, DataType::kFloat32, RedOp::kSum);
          c.all_reduce(out.data(), out.data(), count, DataType::kFloat32, RedOp::kMax);
        }
        c.barrier();
        after_repeat[r] = f.registrations(rank);
        // Twice the length at the same address: not covered by the cached registration.
        c.all_reduce(big.data(), out.data(), 2 * count, DataType::kFloat32, RedOp::kSum);
        c.barrier();
        after_bigger[r] = f.registrations(rank);
        // Inside the bigger ranges: hits.
        c.all_reduce(big.data() + 10, out.data() + 10, count, DataType::kFloat32, RedOp::kSum);
        c.barrier();
        after_sub[r] = f.registrations(rank);
        // Reaching past both cached ranges: new registrations.
        c.all_reduce(big.data() + count, out.data() + count, 2 * count, DataType::kFloat32,
                     RedOp::kSum);
        c.barrier();
        after_overlap[r] = f.registrations(rank);
        if (out[count] != static_cast<float>(c.size()))
          throw std::runtime_error("wrong result after re-registration");
        // Many distinct buffers: the cache evicts.
        std::vector<float> many(200 * 64);
        for (int i = 0; i < 200; ++i)
          c.all_reduce(many.data() + i * 64, many.data() + i * 64, 64, DataType::kFloat32,
                       RedOp::kSum);
        live[r] = f.live_buffers(rank);
      },
      std::chrono::seconds(60), &f);
  ASSERT_EQ(err, "");
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    EXPECT_GE(after_first[i], 2u);  // send, recv (+ scratch)
    EXPECT_EQ(after_repeat[i], after_first[i]) << "rank " << r;
    EXPECT_EQ(after_bigger[i], after_repeat[i] + 2) << "rank " << r;
    EXPECT_EQ(after_sub[i], after_bigger[i]) << "rank " << r;
    EXPECT_EQ(after_overlap[i], after_sub[i] + 2) << "rank " << r;
    EXPECT_LE(live[i], 64u + 1u) << "rank " << r;  // cache entries + the scratch arena
  }
}

}  // namespace
}  // namespace softrdma::ccl
