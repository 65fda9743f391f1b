// The window of chunks in flight per peer: Config::depth raised to the path's
// bandwidth-delay product (Config::depth_from_path, Transport::path_bytes).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "ccl/context.h"
#include "ccl/tests/test_util.h"

namespace softrdma::ccl {
namespace {

using detail::depth_for_path;

Config with_chunk(size_t chunk_bytes, int depth = 4, bool from_path = true) {
  Config c;
  c.chunk_bytes = chunk_bytes;
  c.depth = depth;
  c.depth_from_path = from_path;
  return c;
}

TEST(Depth, CoversThePathInWholeChunksBetweenTheFloorAndTheCap) {
  const Config c = with_chunk(512 * 1024);
  EXPECT_EQ(4u, depth_for_path(c, 0));                   // unknown path: the floor
  EXPECT_EQ(4u, depth_for_path(c, 1));                   // a short path: the floor
  EXPECT_EQ(4u, depth_for_path(c, 4 * 512 * 1024));      // exactly the floor
  EXPECT_EQ(5u, depth_for_path(c, 4 * 512 * 1024 + 1));  // rounded up to whole chunks
  // 10 Gbit/s × 50 ms = 62.5 MB = 119.2 chunks of 512 KiB.
  EXPECT_EQ(120u, depth_for_path(c, 62'500'000));
  // 100 Gbit/s × 50 ms = 625 MB: capped at kMaxDepth.
  EXPECT_EQ(static_cast<size_t>(Config::kMaxDepth), depth_for_path(c, 625'000'000));
  EXPECT_EQ(static_cast<size_t>(Config::kMaxDepth), depth_for_path(c, UINT64_MAX));
  // A higher floor wins over a short path; off, the floor is the depth on every path.
  EXPECT_EQ(16u, depth_for_path(with_chunk(512 * 1024, 16), 1'000'000));
  EXPECT_EQ(4u, depth_for_path(with_chunk(512 * 1024, 4, false), 62'500'000));
}

// A Recv of `chunks` chunks while the sender holds back: the receiver posts its whole window
// before it blocks on the first chunk, and no more (it cannot post further until a chunk
// completes). The sender waits, bounded, until the receiver's posted recvs reach `expected`,
// then reads the count and sends. Returns the count it read.
uint64_t window_of_a_recv(const Config& config, uint64_t path_bytes, size_t chunks,
                          uint64_t expected) {
  LoopbackFabric fabric(2);
  fabric.set_path_bytes(path_bytes);
  const size_t count = chunks * config.chunk_bytes;  // int8 elements
  uint64_t seen = 0;
  const std::string error = testing::run_ranks(
      2, config,
      [&](Communicator& comm) {
        std::vector<int8_t> buf(count, static_cast<int8_t>(comm.rank() + 1));
        if (comm.rank() == 1) {
          comm.recv(buf.data(), count, DataType::kInt8, 0);
          for (int8_t v : buf)
            if (v != 1) throw std::runtime_error("received data is wrong");
          return;
        }
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (fabric.posted_recvs(0, 1) < expected && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        seen = fabric.posted_recvs(0, 1);
        comm.send(buf.data(), count, DataType::kInt8, 1);
      },
      std::chrono::seconds(60), &fabric);
  EXPECT_EQ("", error);
  return seen;
}

TEST(Depth, ARecvKeepsThePathsWindowOfChunksPosted) {
  const Config c = with_chunk(4096);
  EXPECT_EQ(4u, window_of_a_recv(c, 0, 20, 4));            // unknown path: the floor
  EXPECT_EQ(10u, window_of_a_recv(c, 10 * 4096, 20, 10));  // a path of 10 chunks
  EXPECT_EQ(4u, window_of_a_recv(with_chunk(4096, 4, false), 10 * 4096, 20, 4));  // turned off
  // Never more than the transfer has (a short message over a long path takes no scratch
  // slots it cannot fill).
  EXPECT_EQ(3u, window_of_a_recv(c, 10 * 4096, 3, 3));
}

}  // namespace
}  // namespace softrdma::ccl
