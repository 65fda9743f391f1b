// The collectives end to end over VerbsTransport: forked ranks, each over its own softrdma
// device, created with init_rank (unique id) or init_from_environment (torchrun variables).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ccl/bootstrap.h"
#include "ccl/ccl.h"
#include "ccl/tests/verbs/ranks.h"

namespace softrdma::ccl {
namespace {

using test::require;
using test::run_ranks;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Element i of rank r's input.
int32_t input(int r, size_t i) {
  return static_cast<int32_t>((i * 7 + static_cast<size_t>(r) * 13) % 101);
}

// Runs every collective on int32 vectors of each of `counts` elements per rank and checks
// the results against a reference computed here.
void check_all_collectives(Communicator& c, const std::vector<size_t>& counts = {1, 1000, 300000}) {
  const int n = c.size(), me = c.rank();
  for (size_t count : counts) {
    const std::string at = " (count " + std::to_string(count) + ")";
    std::vector<int32_t> in(count * n), out(count * n);
    for (size_t i = 0; i < in.size(); ++i) in[i] = input(me, i);

    c.all_reduce(in.data(), out.data(), count, DataType::kInt32, RedOp::kSum);
    for (size_t i = 0; i < count; ++i) {
      int32_t want = 0;
      for (int r = 0; r < n; ++r) want += input(r, i);
      require(out[i] == want, "AllReduce element " + std::to_string(i) + at);
    }

    const int root = n - 1;
    std::vector<int32_t> b(count, me == root ? 0 : -1);
    if (me == root)
      for (size_t i = 0; i < count; ++i) b[i] = input(root, i);
    c.broadcast(b.data(), b.data(), count, DataType::kInt32, root);
    for (size_t i = 0; i < count; ++i) require(b[i] == input(root, i), "Broadcast" + at);

    c.reduce(in.data(), out.data(), count, DataType::kInt32, RedOp::kMax, 0);
    if (me == 0)
      for (size_t i = 0; i < count; ++i) {
        int32_t want = input(0, i);
        for (int r = 1; r < n; ++r) want = std::max(want, input(r, i));
        require(out[i] == want, "Reduce" + at);
      }

    c.all_gather(in.data(), out.data(), count, DataType::kInt32);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        require(out[r * count + i] == input(r, i), "AllGather" + at);

    c.reduce_scatter(in.data(), out.data(), count, DataType::kInt32, RedOp::kSum);
    for (size_t i = 0; i < count; ++i) {
      int32_t want = 0;
      for (int r = 0; r < n; ++r) want += input(r, me * count + i);
      require(out[i] == want, "ReduceScatter" + at);
    }

    c.all_to_all(in.data(), out.data(), count, DataType::kInt32);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        require(out[r * count + i] == input(r, me * count + i), "AllToAll" + at);

    // Send/Recv around the ring, ordered so that blocking calls cannot deadlock.
    const int right = (me + 1) % n, left = (me + n - 1) % n;
    std::vector<int32_t> got(count, -1);
    if (me % 2 == 0) {
      c.send(in.data(), count, DataType::kInt32, right);
      c.recv(got.data(), count, DataType::kInt32, left);
    } else {
      c.recv(got.data(), count, DataType::kInt32, left);
      c.send(in.data(), count, DataType::kInt32, right);
    }
    for (size_t i = 0; i < count; ++i) require(got[i] == input(left, i), "Send/Recv" + at);
    c.barrier();
  }
}

TEST(CommunicatorOverVerbs, InitRankAllCollectives) {
  const int n = 4;
  test::RootProcess root;
  const UniqueId id = root.id();
  const std::string text = id.to_string();  // passed as a string, as between hosts
  auto res = run_ranks(
      n,
      [&](int r) {
        auto comm = init_rank(UniqueId::from_string(text), n, r);
        require(comm->rank() == r && comm->size() == n, "rank/size");
        check_all_collectives(*comm);
      },
      180s);
  for (const auto& r : res) ASSERT_EQ(0, r.exit_code) << test::describe(res);
}

TEST(CommunicatorOverVerbs, TorchrunEnvironment) {
  const int n = 3;
  const std::string port = std::to_string(test::free_tcp_port() - 1);
  auto res = run_ranks(
      n,
      [&](int r) {
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", port.c_str(), 1);
        auto comm = init_from_environment();
        require(comm->rank() == r && comm->size() == n, "rank/size");
        check_all_collectives(*comm);
      },
      180s);
  for (const auto& r : res) ASSERT_EQ(0, r.exit_code) << test::describe(res);
}

// Every collective with 1..4 channels per peer on 3 ranks, with the eager limit at 4 KiB,
// stripes of at least 16 KiB and 64 KiB pipeline chunks: per-rank counts whose pieces land
// just below, at and above the eager limit (1023..1025 int32 elements: 4092..4100 bytes),
// exactly one chunk (16384 elements = 4 stripes of 16 KiB), and a size neither the chunk
// nor the channel count divides (50001 elements).
TEST(CommunicatorOverVerbs, AllCollectivesAcrossChannelCounts) {
  const int n = 3;
  for (int channels = 1; channels <= 4; ++channels) {
    SCOPED_TRACE("SOFTRDMA_CCL_CHANNELS=" + std::to_string(channels));
    test::RootProcess root;
    const UniqueId id = root.id();
    auto res = run_ranks(n,
                         [&](int r) {
                           auto comm = init_rank(id, n, r);
                           check_all_collectives(*comm, {1023, 1024, 1025, 16384, 50001});
                         },
                         120s,
                         {{"SOFTRDMA_CCL_CHANNELS", std::to_string(channels)},
                          {"SOFTRDMA_CCL_EAGER_BYTES", "4096"},
                          {"SOFTRDMA_CCL_CHANNEL_MIN_BYTES", "16384"},
                          {"SOFTRDMA_CCL_CHUNK_BYTES", "65536"}});
    for (const auto& r : res) ASSERT_EQ(0, r.exit_code) << test::describe(res);
  }
}

// A rank dies (SIGKILL) in the middle of a series of AllReduces: every other rank gets a
// PeerError naming it, within the timeout, and the communicator refuses further work.
TEST(CommunicatorOverVerbs, KilledRankMidAllReduce) {
  const int n = 4, victim = 1;
  test::RootProcess root;
  const UniqueId id = root.id();
  auto res = run_ranks(
      n,
      [&](int r) {
        auto comm = init_rank(id, n, r);
        std::vector<float> v(1 << 20, 1.0f);
        Clock::time_point last = Clock::now();
        try {
          for (int i = 0; i < 100000; ++i) {
            if (r == victim && i == 5) raise(SIGKILL);
            comm->all_reduce(v.data(), v.data(), v.size(), DataType::kFloat32, RedOp::kMax);
            last = Clock::now();
          }
        } catch (const PeerError& e) {
          const double s = std::chrono::duration<double>(Clock::now() - last).count();
          std::printf("%.2f s after the last AllReduce: %s\n", s, e.what());
          require(e.peer() == victim, std::string("blamed the wrong peer: ") + e.what());
          require(std::string(e.what()).find("peer rank 1 (127.0.0.") != std::string::npos,
                  std::string("message does not name the peer: ") + e.what());
          require(std::string(e.what()).rfind("AllReduce: rank " + std::to_string(r), 0) == 0,
                  std::string("message does not start with the operation: ") + e.what());
          require(s < 3.0, "took longer than the 3000 ms timeout");
          try {
            comm->barrier();
          } catch (const PeerError&) {
            return;  // unusable after the failure, as documented
          }
          throw std::runtime_error("communicator still usable after the failure");
        }
        throw std::runtime_error("no PeerError");
      },
      120s, {{"SOFTRDMA_CCL_TIMEOUT_MS", "3000"}});
  std::printf("%s", test::describe(res).c_str());
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(0, res[r].exit_code) << test::describe(res);
  }
}

// Group calls over verbs: an all-to-all of grouped sends and recvs (sizes per pair from 0
// through eager to multi-chunk rendezvous, each rank calling them in its own order) and a
// ring {send to next, recv from prev}; then a rank dies and every other rank's group_end
// fails naming it.
TEST(CommunicatorOverVerbs, GroupedPointToPointAndDeadPeer) {
  const int n = 4, victim = 1;
  test::RootProcess root;
  const UniqueId id = root.id();
  auto count = [](int src, int dst) -> size_t {
    const size_t sizes[] = {0, 3, 1500, 200000};  // 0, eager, eager, 2 chunks of 512 KiB
    return sizes[static_cast<size_t>(src + 3 * dst) % 4];
  };
  auto value = [](int src, int dst, size_t i) {
    return static_cast<int32_t>(src * 1000 + dst * 100 + static_cast<int>(i % 97));
  };
  auto res = run_ranks(
      n,
      [&](int r) {
        auto comm = init_rank(id, n, r);
        std::vector<std::vector<int32_t>> out(n), in(n);
        for (int p = 0; p < n; ++p) {
          out[p].resize(count(r, p));
          for (size_t i = 0; i < out[p].size(); ++i) out[p][i] = value(r, p, i);
          in[p].assign(count(p, r), -1);
        }
        comm->group_start();
        for (int k = 0; k < n; ++k) {
          const int to = (r + k) % n, from = (r + n - k) % n;
          if (r % 2 == 0) comm->recv(in[from].data(), in[from].size(), DataType::kInt32, from);
          comm->send(out[to].data(), out[to].size(), DataType::kInt32, to);
          if (r % 2 == 1) comm->recv(in[from].data(), in[from].size(), DataType::kInt32, from);
        }
        comm->group_end();
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < in[p].size(); ++i)
            require(in[p][i] == value(p, r, i), "grouped AllToAll from rank " + std::to_string(p));

        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        std::vector<int32_t> ring(300000, r), got(300000);
        try {
          for (int i = 0; i < 100000; ++i) {
            if (r == victim && i == 3) raise(SIGKILL);
            comm->group_start();
            comm->send(ring.data(), ring.size(), DataType::kInt32, next);
            comm->recv(got.data(), got.size(), DataType::kInt32, prev);
            comm->group_end();
            require(got[0] == prev && got.back() == prev, "ring exchange data");
          }
        } catch (const PeerError& e) {
          require(e.peer() == victim, std::string("blamed the wrong peer: ") + e.what());
          require(std::string(e.what()).find("peer rank 1 (127.0.0.") != std::string::npos,
                  std::string("message does not name the peer: ") + e.what());
          require(std::string(e.what()).rfind("GroupEnd: rank " + std::to_string(r), 0) == 0,
                  std::string("message does not start with GroupEnd: ") + e.what());
          return;
        }
        throw std::runtime_error("no PeerError");
      },
      120s, {{"SOFTRDMA_CCL_TIMEOUT_MS", "3000"}});
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(0, res[r].exit_code) << test::describe(res);
  }
}

}  // namespace
}  // namespace softrdma::ccl
