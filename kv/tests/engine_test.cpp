// Two engines in one process (one srdma0; QPs to each other over the device's own address):
// every byte of WRITE and READ batches verified, striping over QPs, callbacks, notifications
// in order, the registration cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "kv/engine.h"
#include "kv/engine_impl.h"
#include "kv/tests/kv_fork_util.h"
#include "kv/tests/kv_test_util.h"

namespace softrdma::kv {
namespace {

using namespace std::chrono_literals;
using test::fill;
using test::first_mismatch;

class TwoEngines : public ::testing::Test {
 protected:
  void SetUp() override {
    a = std::make_unique<Engine>("a", store.store(), test::test_options());
    b = std::make_unique<Engine>("b", store.store(), test::test_options());
  }
  // Submits `reqs` as one batch on `e`, waits and expects success.
  static void run_batch(Engine& e, const std::vector<TransferRequest>& reqs,
                        std::string_view notify = {}) {
    const BatchId id = e.allocate_batch(reqs.size());
    e.submit_transfer(id, reqs, notify);
    const BatchStatus s = e.wait(id, 30s);
    ASSERT_EQ(BatchState::kCompleted, s.state) << s.error;
    uint64_t total = 0;
    for (const auto& r : reqs) total += r.length;
    EXPECT_EQ(total, s.bytes_done);
    EXPECT_EQ(total, s.bytes_total);
    e.free_batch(id);
  }
  test::TempStore store;
  std::unique_ptr<Engine> a, b;
};

TEST_F(TwoEngines, WriteBatchesPlaceEveryByteAtUnalignedOffsets) {
  const size_t kBuf = 4 << 20;
  std::vector<uint8_t> src(kBuf), dst(kBuf + 64);
  a->register_memory(src.data(), src.size(), "cpu:0", "src");
  b->register_memory(dst.data(), dst.size(), "cpu:0", "dst");
  const SegmentHandle h = a->open_segment("b", "dst");
  for (size_t size : {size_t{1}, size_t{7}, size_t{4095}, size_t{4097}, size_t{65536 + 3},
                      size_t{(1 << 20) + 17}, size_t{3 << 20}}) {
    const size_t src_off = 5, dst_off = 13 + size % 29;
    std::fill(dst.begin(), dst.end(), 0xEE);
    fill(src.data() + src_off, size, size);
    run_batch(*a, {{Opcode::kWrite, src.data() + src_off, h, dst_off, size}});
    EXPECT_EQ(-1, first_mismatch(dst.data() + dst_off, size, size)) << size << " bytes";
    // Nothing outside the range was touched.
    for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(0xEE, dst[i]) << size;
    for (size_t i = dst_off + size; i < dst.size(); ++i) ASSERT_EQ(0xEE, dst[i]) << size;
  }
}

TEST_F(TwoEngines, ReadBatchesFetchEveryByteAtUnalignedOffsets) {
  const size_t kBuf = 4 << 20;
  std::vector<uint8_t> remote(kBuf), local(kBuf + 64);
  b->register_memory(remote.data(), remote.size(), "cpu:0", "remote");
  a->register_memory(local.data(), local.size());
  const SegmentHandle h = a->open_segment("b", "remote");
  for (size_t size : {size_t{1}, size_t{3}, size_t{4096}, size_t{65535}, size_t{(2 << 20) + 1}}) {
    const size_t roff = 11, loff = 3 + size % 13;
    fill(remote.data() + roff, size, size * 3);
    std::fill(local.begin(), local.end(), 0xEE);
    run_batch(*a, {{Opcode::kRead, local.data() + loff, h, roff, size}});
    EXPECT_EQ(-1, first_mismatch(local.data() + loff, size, size * 3)) << size << " bytes";
    for (size_t i = 0; i < loff; ++i) ASSERT_EQ(0xEE, local[i]);
    for (size_t i = loff + size; i < local.size(); ++i) ASSERT_EQ(0xEE, local[i]);
  }
}

TEST_F(TwoEngines, ManySmallBlocksInOneBatch) {
  const size_t kBlocks = 600, kBlock = 1000;
  std::vector<uint8_t> src(kBlocks * kBlock), dst(kBlocks * 1024);
  a->register_memory(src.data(), src.size());
  b->register_memory(dst.data(), dst.size(), "cpu:0", "blocks");
  const SegmentHandle h = a->open_segment("b", "blocks");
  std::vector<TransferRequest> reqs;
  for (size_t i = 0; i < kBlocks; ++i) {
    fill(src.data() + i * kBlock, kBlock, i);
    // Block i lands in slot (i * 7) % kBlocks, at an odd offset inside the slot.
    reqs.push_back(
        {Opcode::kWrite, src.data() + i * kBlock, h, ((i * 7) % kBlocks) * 1024 + 3, kBlock});
  }
  run_batch(*a, reqs);
  for (size_t i = 0; i < kBlocks; ++i)
    ASSERT_EQ(-1, first_mismatch(dst.data() + ((i * 7) % kBlocks) * 1024 + 3, kBlock, i)) << i;
}

TEST_F(TwoEngines, MixedReadWriteBatch) {
  std::vector<uint8_t> local(1 << 20), remote(1 << 20);
  a->register_memory(local.data(), local.size());
  b->register_memory(remote.data(), remote.size(), "cpu:0", "r");
  const SegmentHandle h = a->open_segment("b", "r");
  // First half of each buffer: WRITE a→b; second half: READ b→a.
  const size_t half = local.size() / 2;
  fill(local.data(), half, 1);
  fill(remote.data() + half, half, 2);
  std::vector<TransferRequest> reqs;
  for (size_t off = 0; off < half; off += 100'000) {
    const size_t n = std::min<size_t>(100'000, half - off);
    reqs.push_back({Opcode::kWrite, local.data() + off, h, off, n});
    reqs.push_back({Opcode::kRead, local.data() + half + off, h, half + off, n});
  }
  run_batch(*a, reqs);
  EXPECT_EQ(-1, first_mismatch(remote.data(), half, 1));
  EXPECT_EQ(-1, first_mismatch(local.data() + half, half, 2));
}

TEST_F(TwoEngines, LargeWriteAndReadBack256MiB) {
  const size_t kSize = size_t{256} << 20;  // the largest size
  std::vector<uint8_t> src(kSize), dst(kSize), back(kSize);
  a->register_memory(src.data(), src.size());
  a->register_memory(back.data(), back.size());
  b->register_memory(dst.data(), dst.size(), "cpu:0", "big");
  const SegmentHandle h = a->open_segment("b", "big");
  fill(src.data(), kSize, 64);
  run_batch(*a, {{Opcode::kWrite, src.data(), h, 0, kSize}});
  EXPECT_EQ(-1, first_mismatch(dst.data(), kSize, 64));
  run_batch(*a, {{Opcode::kRead, back.data(), h, 0, kSize}});
  EXPECT_EQ(-1, first_mismatch(back.data(), kSize, 64));
}

TEST_F(TwoEngines, CallbackRunsOnceWhenTheBatchFinishes) {
  std::vector<uint8_t> src(1 << 20), dst(1 << 20);
  a->register_memory(src.data(), src.size());
  b->register_memory(dst.data(), dst.size(), "cpu:0", "d");
  const SegmentHandle h = a->open_segment("b", "d");
  std::atomic<int> calls{0};
  std::atomic<uint64_t> bytes{0};
  const BatchId id = a->allocate_batch(1);
  a->on_complete(id, [&](BatchId got, const BatchStatus& s) {
    EXPECT_EQ(id, got);
    EXPECT_EQ(BatchState::kCompleted, s.state);
    bytes = s.bytes_done;
    ++calls;
  });
  a->submit_transfer(id,
                     std::vector<TransferRequest>{{Opcode::kWrite, src.data(), h, 0, src.size()}});
  ASSERT_EQ(BatchState::kCompleted, a->wait(id, 30s).state);
  for (int i = 0; i < 500 && calls == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(1, calls.load());
  EXPECT_EQ(src.size(), bytes.load());
  // Set on a finished batch: runs at once, on this thread.
  bool now = false;
  a->on_complete(id, [&](BatchId, const BatchStatus&) { now = true; });
  EXPECT_TRUE(now);
  a->free_batch(id);
}

TEST_F(TwoEngines, NotificationsArriveInOrderPerPeer) {
  for (int i = 0; i < 300; ++i) a->notify("b", "n" + std::to_string(i));
  std::vector<std::string> got;
  while (got.size() < 300) {
    auto n = b->wait_notification(10s);
    ASSERT_TRUE(n.has_value()) << "after " << got.size();
    EXPECT_EQ("a", n->peer);
    got.push_back(n->message);
  }
  for (int i = 0; i < 300; ++i) ASSERT_EQ("n" + std::to_string(i), got[i]);
  // And back the other way over the same connection.
  b->notify("a", std::string(Engine::kMaxNotifyBytes, 'x'));
  auto back = a->wait_notification(10s);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ("b", back->peer);
  EXPECT_EQ(Engine::kMaxNotifyBytes, back->message.size());
}

TEST_F(TwoEngines, BatchNotificationMeansTheDataLanded) {
  const size_t kSize = 8 << 20;
  std::vector<uint8_t> src(kSize), dst(kSize);
  a->register_memory(src.data(), src.size());
  b->register_memory(dst.data(), dst.size(), "cpu:0", "d");
  const SegmentHandle h = a->open_segment("b", "d");
  for (uint64_t round = 0; round < 3; ++round) {
    fill(src.data(), kSize, 100 + round);
    const BatchId id = a->allocate_batch(4);
    std::vector<TransferRequest> reqs;
    for (size_t q = 0; q < 4; ++q)
      reqs.push_back({Opcode::kWrite, src.data() + q * kSize / 4, h, q * kSize / 4, kSize / 4});
    a->submit_transfer(id, reqs, "round " + std::to_string(round));
    auto n = b->wait_notification(30s);
    ASSERT_TRUE(n.has_value());
    EXPECT_EQ("round " + std::to_string(round), n->message);
    // No wait on a's side: the notification alone says the bytes are there.
    EXPECT_EQ(-1, first_mismatch(dst.data(), kSize, 100 + round));
    ASSERT_EQ(BatchState::kCompleted, a->wait(id, 30s).state);
    a->free_batch(id);
  }
}

TEST_F(TwoEngines, RegistrationCacheCountsReferences) {
  std::vector<uint8_t> buf(4096);
  const Segment s1 = b->register_memory(buf.data(), buf.size(), "cpu:0", "x");
  const Segment s2 = b->register_memory(buf.data(), buf.size());
  EXPECT_EQ("x", s2.name);
  EXPECT_EQ(s1.addr, s2.addr);
  EXPECT_EQ(1u, b->segments().size());
  b->deregister_memory("x");
  EXPECT_NO_THROW(a->open_segment("b", "x"));  // one reference left
  b->deregister_memory("x");
  EXPECT_TRUE(b->segments().empty());
  EXPECT_THROW(a->open_segment("b", "x"), KvError);
}

TEST_F(TwoEngines, SegmentInfoIsThePublishedSegment) {
  std::vector<uint8_t> buf(12345);
  b->register_memory(buf.data(), buf.size(), "cuda:3", "gpu-ish");
  const SegmentHandle h = a->open_segment("b", "gpu-ish");
  const Segment s = a->segment_info(h);
  EXPECT_EQ("gpu-ish", s.name);
  EXPECT_EQ(12345u, s.length);
  EXPECT_EQ("cuda:3", s.location);
  EXPECT_EQ(reinterpret_cast<uint64_t>(buf.data()), s.addr);
  a->close_segment(h);
  EXPECT_THROW(a->segment_info(h), std::invalid_argument);
}

// CPU time (clock ticks) of this process's threads named `name`.
long thread_ticks(const std::string& name) {
  long sum = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string n;
    std::getline(comm, n);
    if (n != name) continue;
    std::ifstream stat(e.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    std::istringstream rest(text.substr(text.rfind(')') + 2));  // fields from 3 (state) on
    std::string field;
    long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stol(field);
      if (i == 15) stime = std::stol(field);
    }
    sum += utime + stime;
  }
  return sum;
}

// The progress threads busy-poll only while transfers are outstanding
// (SOFTRDMA_KV_POLL_BUSY): once every READ and WRITE has completed they sleep, so an idle
// engine costs no core.
TEST_F(TwoEngines, ProgressThreadsSleepOnceTransfersAreDone) {
  ASSERT_TRUE(a->options().poll_while_busy);
  std::vector<uint8_t> src(4 << 20), dst(4 << 20);
  a->register_memory(src.data(), src.size(), "cpu:0", "s");
  b->register_memory(dst.data(), dst.size(), "cpu:0", "d");
  const SegmentHandle h = a->open_segment("b", "d");
  run_batch(*a, {{Opcode::kWrite, src.data(), h, 0, src.size()}});
  run_batch(*a, {{Opcode::kRead, src.data(), h, 0, src.size()}});
  std::this_thread::sleep_for(100ms);  // past SOFTRDMA_KV_SPIN_US
  const long before = thread_ticks("kv-progress");
  std::this_thread::sleep_for(500ms);
  const long used = thread_ticks("kv-progress") - before;
  // Two spinning threads would use up to 100 ticks (10 ms each) here; sleeping ones ~0.
  EXPECT_LT(used, 10) << "kv progress threads kept polling with nothing outstanding";
}

// The handshake carries each side's responder resources: an initiator never keeps more
// READs in flight on a QP than the peer's QP accepts, whichever side asks for less.
TEST(Handshake, ReadsInFlightAreTheSmallerOfBothSidesLimits) {
  test::TempStore store;
  for (auto [mine, theirs] : {std::pair{64u, 4u}, std::pair{2u, 64u}}) {
    EngineOptions oa = test::test_options(), ob = test::test_options();
    oa.max_rd_atomic = mine;
    ob.max_rd_atomic = theirs;
    Engine a("a", store.store(), oa);
    Engine b("b", store.store(), ob);
    std::vector<uint8_t> buf(1 << 20);
    b.register_memory(buf.data(), buf.size(), "cpu:0", "seg");
    a.register_memory(buf.data(), buf.size(), "cpu:0", "local");
    const SegmentHandle h = a.open_segment("b", "seg");
    const BatchId id = a.allocate_batch(1);
    const std::vector<TransferRequest> reqs = {{Opcode::kRead, buf.data(), h, 0, buf.size()}};
    a.submit_transfer(id, reqs);
    ASSERT_EQ(BatchState::kCompleted, a.wait(id, 30s).state);
    a.free_batch(id);
    const std::vector<PeerQp> qa = a.peer_qps("b"), qb = b.peer_qps("a");
    ASSERT_EQ(oa.qps_per_peer, qa.size());
    ASSERT_EQ(qa.size(), qb.size());
    for (size_t i = 0; i < qa.size(); ++i) {
      EXPECT_EQ(std::min(mine, theirs), qa[i].max_rd_atomic) << mine << "/" << theirs;
      EXPECT_EQ(std::min(mine, theirs), qb[i].max_rd_atomic) << mine << "/" << theirs;
      EXPECT_EQ(qb[i].qpn, qa[i].remote_qpn);
      EXPECT_EQ(qa[i].qpn, qb[i].remote_qpn);
      EXPECT_EQ(qb[i].path_mtu, qa[i].path_mtu);
      EXPECT_GE(qa[i].path_mtu, 256u);
    }
    EXPECT_TRUE(a.peer_qps("nobody").empty());
  }
}

/// The PathWindow tests' engine options: on `device`, 2 QPs, slices of `slice_bytes`, max_wr 4
/// (so that the path's window shows), max_wr_from_path `from_path`.
EngineOptions path_options(const char* device, uint64_t slice_bytes, bool from_path) {
  EngineOptions o = test::test_options();
  o.device = device;
  o.qps_per_peer = 2;
  o.slice_bytes = slice_bytes;
  o.max_wr = 4;
  o.max_wr_from_path = from_path;
  return o;
}

/// In a forked child: fails it with `what` unless `ok`.
void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// EngineOptions::max_wr_from_path: once connected, 5 zero-length WRITEs time the path and
// each QP may keep ⌈4 × RTT × port rate ÷ QPs ÷ slice⌉ slices in flight (kRepairRounds = 4),
// at least max_wr. Two engines in a forked child, on two devices (127.0.44.1 and .2) 1 ms
// apart each way through a 10 Gbit/s link (SOFTRDMA_WAN), so their ports say 1X QDR,
// 10 Gbit/s: with 4 KiB slices over 2 QPs an RTT of 2 ms asks for 1,221 slices per QP, so the
// window must grow past max_wr = 4 (to the formula's value for the RTT it measured); off, it
// stays at 4 and no RTT is measured. Through 100 Gbit/s the same RTT asks for 12,207 slices:
// more than the 8,192 the window was once capped at (under 100 Gbit/s × 50 ms's BDP with
// 32 KiB blocks over 2 QPs), up to kMaxPathWindow less the send queue's room for
// notifications and probes. Every byte arrives in each case.
TEST(PathWindow, SlicesInFlightCoverTheMeasuredBandwidthDelayProduct) {
  struct Case {
    bool from_path;
    const char* wan;      // SOFTRDMA_WAN
    double bytes_per_ns;  // its rate
    bool past_old_cap;    // the window must exceed 8,192 slices
  };
  for (const Case c : {Case{true, "delay=1ms,rate=10gbit", 1.25, false},
                       Case{false, "delay=1ms,rate=10gbit", 1.25, false},
                       Case{true, "delay=1ms,rate=100gbit", 12.5, true}}) {
    const bool from_path = c.from_path;
    SCOPED_TRACE(std::string(from_path ? "from the path" : "fixed") + ", " + c.wan);
    test::Child child("127.0.44.1,127.0.44.2", [c, from_path] {
      setenv("SOFTRDMA_WAN", c.wan, 1);
      test::TempStore store;
      auto options = [&](const char* device) { return path_options(device, 4096, from_path); };
      Engine a("a", store.store(), options("srdma0"));
      Engine b("b", store.store(), options("srdma1"));
      std::vector<uint8_t> src(4 << 20), dst(4 << 20);
      a.register_memory(src.data(), src.size(), "cpu:0", "src");
      b.register_memory(dst.data(), dst.size(), "cpu:0", "dst");
      const SegmentHandle h = a.open_segment("b", "dst");
      // While the five probes are out the RTT reads 0: a caller that sees one (kv-bench waits
      // for it before timing) sees the windows already sized from it.
      for (const auto probed = std::chrono::steady_clock::now() + 30s;
           from_path && std::chrono::steady_clock::now() < probed;) {
        const std::vector<PeerQp> qs = a.peer_qps("b");
        if (qs.empty() || qs[0].path_rtt.count() == 0) {
          std::this_thread::sleep_for(1ms);  // not a spin beside the progress threads
          continue;
        }
        for (const PeerQp& q : qs)
          check(q.window > 4, "an RTT of " + std::to_string(q.path_rtt.count()) +
                                  " ns reported with the window still at max_wr");
        break;
      }
      auto write_all = [&](uint64_t seed) {
        fill(src.data(), src.size(), seed);
        const BatchId id = a.allocate_batch(1);
        const std::vector<TransferRequest> reqs = {{Opcode::kWrite, src.data(), h, 0, src.size()}};
        a.submit_transfer(id, reqs);
        const BatchStatus s = a.wait(id, 60s);
        check(s.state == BatchState::kCompleted, "batch failed: " + s.error);
        a.free_batch(id);
        check(first_mismatch(dst.data(), dst.size(), seed) == -1, "bytes differ");
      };
      write_all(1);
      std::vector<PeerQp> qa = a.peer_qps("b");
      const auto until = std::chrono::steady_clock::now() + 30s;
      while (from_path && !qa.empty() && qa[0].window == 4 &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(5ms);
        qa = a.peer_qps("b");
      }
      check(qa.size() == 2, "QPs: " + std::to_string(qa.size()));
      for (const PeerQp& q : qa) {
        const std::string got = "window " + std::to_string(q.window) + ", RTT " +
                                std::to_string(q.path_rtt.count()) + " ns";
        if (!from_path) {
          check(q.window == 4 && q.path_rtt.count() == 0, "fixed: " + got);
          continue;
        }
        check(q.path_rtt >= 2ms, "an RTT under the emulated 2 ms: " + got);
        // Whole bytes, shared over 2 QPs, four times, in 4 KiB slices; within the send queue
        // (softrdma's max_qp_wr, 32,768 = kMaxPathWindow, less the entries kept for
        // notifications and probes).
        const auto bdp =
            static_cast<uint64_t>(c.bytes_per_ns * static_cast<double>(q.path_rtt.count()));
        const uint64_t room = detail::kMaxPathWindow - detail::kSqReserved;
        const auto want = std::clamp<uint64_t>((4 * ((bdp + 1) / 2) + 4095) / 4096, 4, room);
        check(q.window == want, "expected " + std::to_string(want) + ": " + got);
        if (c.past_old_cap) check(q.window > 8192, "not past the old cap: " + got);
      }
      write_all(2);  // with the raised window
    });
    EXPECT_EQ(0, child.wait_for(120s));
  }
}

// The window counts slices, the path asks for bytes: transfers smaller than slice_bytes (a
// paged cache's blocks) grow a full window further, until the QP has the path's bytes
// outstanding (or nothing more is queued). 64 KiB slices over 2 QPs at an RTT of 2 ms
// through 10 Gbit/s ask for 4 × 1.25 MB = 5 MB per QP, ⌈5 MB ÷ 64 KiB⌉ = 77 slices; 16 MiB
// written as 4,096 transfers of 4 KiB (2,048 per QP) must leave a window above that (a
// loaded machine's RTT of up to 10 ms still asks for fewer than 2,048). Without the growth it
// stays at 77 slices — 308 KiB where the path wants 5 MB.
TEST(PathWindow, SmallTransfersGrowTheWindowToTheBytesThePathWants) {
  test::Child child("127.0.44.3,127.0.44.4", [] {
    setenv("SOFTRDMA_WAN", "delay=1ms,rate=10gbit", 1);
    test::TempStore store;
    auto options = [&](const char* device) { return path_options(device, 64 * 1024, true); };
    Engine a("a", store.store(), options("srdma0"));
    Engine b("b", store.store(), options("srdma1"));
    constexpr size_t kBlock = 4096, kBytes = 16 << 20;
    std::vector<uint8_t> src(kBytes), dst(kBytes);
    a.register_memory(src.data(), src.size(), "cpu:0", "src");
    b.register_memory(dst.data(), dst.size(), "cpu:0", "dst");
    const SegmentHandle h = a.open_segment("b", "dst");
    auto write_blocks = [&](uint64_t seed) {
      fill(src.data(), src.size(), seed);
      std::vector<TransferRequest> reqs;
      for (size_t off = 0; off < kBytes; off += kBlock)
        reqs.push_back({Opcode::kWrite, src.data() + off, h, off, kBlock});
      const BatchId id = a.allocate_batch(reqs.size());
      a.submit_transfer(id, reqs);
      const BatchStatus s = a.wait(id, 60s);
      check(s.state == BatchState::kCompleted, "batch failed: " + s.error);
      a.free_batch(id);
      check(first_mismatch(dst.data(), dst.size(), seed) == -1, "bytes differ");
    };
    write_blocks(1);  // connects; the path probes follow
    std::vector<PeerQp> qa = a.peer_qps("b");
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!qa.empty() && qa[0].path_rtt.count() == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(5ms);
      qa = a.peer_qps("b");
    }
    write_blocks(2);  // with the path measured: 2,048 slices of 4 KiB queued per QP at once
    qa = a.peer_qps("b");
    check(qa.size() == 2, "QPs: " + std::to_string(qa.size()));
    for (const PeerQp& q : qa) {
      const auto bdp = static_cast<uint64_t>(1.25 * static_cast<double>(q.path_rtt.count()));
      const uint64_t slices = (4 * ((bdp + 1) / 2) + 65535) / 65536;
      const std::string got = "window " + std::to_string(q.window) + ", RTT " +
                              std::to_string(q.path_rtt.count()) + " ns, " +
                              std::to_string(slices) + " slices of 64 KiB wanted";
      check(q.path_rtt >= 2ms, "an RTT under the emulated 2 ms: " + got);
      check(slices < 2048, "the RTT asks for more than the test queues: " + got);
      check(q.window > slices, "the window did not grow past its slice count: " + got);
    }
  });
  EXPECT_EQ(0, child.wait_for(120s));
}

}  // namespace
}  // namespace softrdma::kv
