// Engines in separate processes (fork; each opens its own srdma0 on its own 127.0.0.x, or two
// devices on 127.0.40.x / 127.0.41.x): a transfer between them, and a peer killed in the
// middle of a batch — the batch fails
// naming it within a bounded time, and nothing hangs. The gtest process itself opens no
// device: it forks both sides and coordinates them through pipes.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>

#include "kv/connector.h"
#include "kv/engine.h"
#include "kv/tests/kv_fork_util.h"
#include "kv/tests/kv_test_util.h"

namespace softrdma::kv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::Child;
using test::Signal;

TEST(Processes, WriteWithNotificationBetweenTwoProcesses) {
  test::TempStore store;
  const size_t kSize = 8 << 20;
  Child target([&] {
    std::vector<uint8_t> buf(kSize);
    Engine e("target", store.store(), test::test_options());
    e.register_memory(buf.data(), buf.size(), "cpu:0", "buf");
    auto n = e.wait_notification(60s);
    if (!n || n->peer != "initiator" || n->message != "done")
      throw std::runtime_error("no notification 'done' from 'initiator'");
    if (int64_t at = test::first_mismatch(buf.data(), kSize, 5); at >= 0)
      throw std::runtime_error("byte " + std::to_string(at) + " differs");
  });
  Child initiator([&] {
    std::vector<uint8_t> buf(kSize);
    test::fill(buf.data(), kSize, 5);
    Engine e("initiator", store.store(), test::test_options());
    e.register_memory(buf.data(), buf.size());
    SegmentHandle h = 0;
    for (int i = 0; i < 500 && !h; ++i) {  // the target may not have registered yet
      try {
        h = e.open_segment("target", "buf");
      } catch (const KvError&) {
        std::this_thread::sleep_for(10ms);
      }
    }
    if (!h) throw std::runtime_error("target never published 'buf'");
    const BatchId b = e.allocate_batch(1);
    e.submit_transfer(b, std::vector<TransferRequest>{{Opcode::kWrite, buf.data(), h, 0, kSize}},
                      "done");
    const BatchStatus s = e.wait(b, 60s);
    if (s.state != BatchState::kCompleted) throw std::runtime_error("batch: " + s.error);
  });
  EXPECT_EQ(0, initiator.wait_for(60s));
  EXPECT_EQ(0, target.wait_for(60s));
}

/// Kills the target (SOFTRDMA_ADDR `victim_addrs`, empty: its own 127.0.0.x) while a 1 GiB
/// WRITE batch from the initiator (`survivor_addrs`, `qps` QPs) runs: the batch must fail
/// naming it within 5 s, free_batch must find nothing in flight and check_peer must name it.
void peer_killed_mid_batch(const std::string& victim_addrs, const std::string& survivor_addrs,
                           uint32_t qps) {
  test::TempStore store;
  const size_t kSize = 16 << 20;
  Signal target_ready, in_flight;
  Child target(victim_addrs, [&] {
    std::vector<uint8_t> buf(kSize);
    Engine e("victim", store.store(), test::test_options());
    e.register_memory(buf.data(), buf.size(), "cpu:0", "buf");
    target_ready.raise();
    std::this_thread::sleep_for(120s);  // killed long before
  });
  ASSERT_TRUE(target_ready.wait(30s));
  Child initiator(survivor_addrs, [&] {
    std::vector<uint8_t> buf(kSize);
    EngineOptions o = test::test_options();
    o.qps_per_peer = qps;
    Engine e("survivor", store.store(), o);
    e.register_memory(buf.data(), buf.size());
    const SegmentHandle h = e.open_segment("victim", "buf");
    // 64 × 16 MiB = 1 GiB per batch. The victim dies once the first batch has moved bytes;
    // a batch that completes before the kill lands (the same-host path moves 1 GiB in tens of
    // ms, and this thread may have slept through most of it on a loaded machine) is followed
    // by another (at most kBatches, for at most 30 s), so that the kill meets one in flight.
    constexpr int kBatches = 64;
    const auto submit = [&] {
      const BatchId id = e.allocate_batch(64);
      e.submit_transfer(
          id, std::vector<TransferRequest>(64, {Opcode::kWrite, buf.data(), h, 0, kSize}));
      return id;
    };
    BatchId b = submit();
    while (e.get_status(b).bytes_done == 0) std::this_thread::sleep_for(1ms);
    in_flight.raise();
    const auto t0 = Clock::now();
    BatchStatus s = e.wait(b, 20s);
    for (int n = 1; s.state == BatchState::kCompleted && n < kBatches && Clock::now() - t0 < 30s;
         ++n) {
      e.free_batch(b);
      b = submit();
      s = e.wait(b, 20s);
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    std::fprintf(stderr, "failed after %lld ms: %s\n", static_cast<long long>(ms.count()),
                 s.error.c_str());
    if (s.state != BatchState::kFailed) throw std::runtime_error("the batch did not fail");
    if (s.peer != "victim" || s.error.find("'victim'") == std::string::npos)
      throw std::runtime_error("the error does not name the victim: " + s.error);
    if (ms > 5s) throw std::runtime_error("took " + std::to_string(ms.count()) + " ms");
    e.free_batch(b);  // nothing is left in flight
    bool threw = false;
    try {
      e.check_peer("victim");
    } catch (const KvError& err) {
      threw = err.peer() == "victim";
    }
    if (!threw) throw std::runtime_error("check_peer did not name the dead peer");
    // A wait that begins after the connection failed ends at its first look as well (before,
    // it watched only a connection it had seen up itself and waited out its timeout: kv-demo's
    // decode, its prefill killed while decode's notification to it was in flight).
    const auto t1 = Clock::now();
    std::string why;
    try {
      KvConsumer(e).wait_for_layer(1, 0, "victim", 30s, 50ms);
    } catch (const KvError& err) {
      why = err.peer() == "victim" ? err.what() : "";
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t1);
    if (why.empty() || waited > 5s)
      throw std::runtime_error("wait_for_layer after the loss: " + std::to_string(waited.count()) +
                               " ms, error '" + why + "'");
  });
  ASSERT_TRUE(in_flight.wait(30s));
  kill(target.pid, SIGKILL);
  EXPECT_EQ(0, initiator.wait_for(30s));
}

TEST(Processes, APeerKilledMidBatchFailsTheBatchNamingItWithinTheRetryBound) {
  peer_killed_mid_batch("", "", test::test_options().qps_per_peer);
}

TEST(Processes, APeerWithTwoDevicesKilledMidBatchFailsTheBatchNamingIt) {
  // Two devices on each side (127.0.41.15/.16 victim, 127.0.40.15/.16 survivor), 4 QPs:
  // slices in flight on both devices fail, and the batch names the victim once.
  peer_killed_mid_batch("127.0.41.15,127.0.41.16", "127.0.40.15,127.0.40.16", 4);
}

}  // namespace
}  // namespace softrdma::kv
