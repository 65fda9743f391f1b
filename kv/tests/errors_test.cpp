// Bad input and failing peers give clear errors (naming the call and the peer) and leave
// nothing half-done.
#include <gtest/gtest.h>

#include <chrono>

#include "kv/engine.h"
#include "kv/tests/kv_test_util.h"

namespace softrdma::kv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    a = std::make_unique<Engine>("a", store.store(), test::test_options());
    b = std::make_unique<Engine>("b", store.store(), test::test_options());
    src.resize(1 << 20);
    dst.resize(1 << 20);
    a->register_memory(src.data(), src.size(), "cpu:0", "src");
    b->register_memory(dst.data(), dst.size(), "cpu:0", "dst");
    h = a->open_segment("b", "dst");
  }
  test::TempStore store;
  std::unique_ptr<Engine> a, b;
  std::vector<uint8_t> src, dst;
  SegmentHandle h = 0;
};

// Expects `f` to throw E with `needle` in its message.
template <class E, class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find(needle)) << e.what();
  }
}

TEST_F(Errors, UnknownPeerAndUnknownSegmentNameThePeer) {
  try {
    a->open_segment("nobody", "dst");
    ADD_FAILURE();
  } catch (const KvError& e) {
    EXPECT_EQ("nobody", e.peer());
    EXPECT_NE(std::string::npos, std::string(e.what()).find("no engine 'nobody'")) << e.what();
  }
  try {
    a->open_segment("b", "nope");
    ADD_FAILURE();
  } catch (const KvError& e) {
    EXPECT_EQ("b", e.peer());
    EXPECT_NE(std::string::npos, std::string(e.what()).find("no segment 'nope'")) << e.what();
  }
}

TEST_F(Errors, OutOfBoundsRequestsAreRefusedAndNothingIsSubmitted) {
  const BatchId id = a->allocate_batch(4);
  auto submit = [&](uint64_t off, uint64_t len) {
    a->submit_transfer(id, std::vector<TransferRequest>{
                               {Opcode::kWrite, src.data(), h, 0, 16},  // a good one first
                               {Opcode::kWrite, src.data(), h, off, len}});
  };
  expect_error<std::invalid_argument>([&] { submit(dst.size(), 1); }, "outside segment 'dst'");
  expect_error<std::invalid_argument>([&] { submit(dst.size() - 4, 5); }, "of peer 'b'");
  expect_error<std::invalid_argument>([&] { submit(~uint64_t{0} - 2, 8); }, "outside");
  expect_error<std::invalid_argument>([&] { submit(0, 0); }, "zero length");
  const BatchStatus s = a->get_status(id);
  EXPECT_EQ(0u, s.transfers);
  EXPECT_EQ(0u, s.bytes_total);
  a->free_batch(id);
}

TEST_F(Errors, UnregisteredLocalMemoryAndBadHandlesAreRefused) {
  std::vector<uint8_t> other(4096);
  const BatchId id = a->allocate_batch(2);
  expect_error<std::invalid_argument>(
      [&] {
        a->submit_transfer(id,
                           std::vector<TransferRequest>{{Opcode::kWrite, other.data(), h, 0, 16}});
      },
      "not inside one registered segment");
  // A range that starts inside a registration and runs past its end.
  expect_error<std::invalid_argument>(
      [&] {
        a->submit_transfer(id, std::vector<TransferRequest>{
                                   {Opcode::kWrite, src.data() + src.size() - 8, h, 0, 16}});
      },
      "not inside one registered segment");
  expect_error<std::invalid_argument>(
      [&] {
        a->submit_transfer(id,
                           std::vector<TransferRequest>{{Opcode::kWrite, src.data(), 999, 0, 1}});
      },
      "unknown segment handle 999");
  expect_error<std::invalid_argument>(
      [&] { a->submit_transfer(12345, std::vector<TransferRequest>{}); }, "unknown batch");
  expect_error<std::invalid_argument>(
      [&] {
        a->submit_transfer(id,
                           std::vector<TransferRequest>(3, {Opcode::kWrite, src.data(), h, 0, 1}));
      },
      "capacity of 2");
  expect_error<std::invalid_argument>([&] { a->allocate_batch(0); }, "capacity");
  expect_error<std::invalid_argument>([&] { a->get_status(777); }, "unknown batch 777");
  expect_error<std::invalid_argument>([&] { a->free_batch(777); }, "unknown batch 777");
  a->free_batch(id);
}

TEST_F(Errors, RegistrationMistakesAreRefused) {
  std::vector<uint8_t> buf(8192);
  expect_error<std::invalid_argument>([&] { a->register_memory(nullptr, 10); }, "null address");
  expect_error<std::invalid_argument>([&] { a->register_memory(buf.data(), 0); }, "zero length");
  expect_error<std::invalid_argument>(
      [&] { a->register_memory(src.data() + 100, 10, "cpu:0", "inner"); }, "overlaps");
  expect_error<std::invalid_argument>(
      [&] { a->register_memory(buf.data(), buf.size(), "cpu:0", "src"); }, "'src' is taken");
  expect_error<std::invalid_argument>(
      [&] { a->register_memory(buf.data(), buf.size(), "cpu:0", "bad name"); }, "segment name");
  expect_error<std::invalid_argument>([&] { a->deregister_memory("never"); }, "no segment 'never'");
  // The refused registrations left nothing behind.
  EXPECT_EQ(1u, a->segments().size());
  EXPECT_NO_THROW(a->register_memory(buf.data(), buf.size(), "cpu:0", "buf"));
}

TEST_F(Errors, BadEngineNamesAndLongNotificationsAreRefused) {
  expect_error<std::invalid_argument>([&] { Engine e("has space", store.store()); }, "name");
  expect_error<std::invalid_argument>([&] { Engine e("", store.store()); }, "name");
  expect_error<std::invalid_argument>(
      [&] { a->notify("b", std::string(Engine::kMaxNotifyBytes + 1, 'x')); }, "at most");
  expect_error<KvError>([&] { a->notify("ghost", "hi"); }, "ghost");
  expect_error<KvError>([&] { a->check_peer("ghost"); }, "not connected");
}

TEST_F(Errors, RemoteSegmentDeregisteredFailsTheBatchThenTheConnectionRecovers) {
  std::vector<uint8_t> more(4096);
  b->register_memory(more.data(), more.size(), "cpu:0", "more");
  b->deregister_memory("dst");
  const BatchId id = a->allocate_batch(1);
  a->submit_transfer(id, std::vector<TransferRequest>{{Opcode::kWrite, src.data(), h, 0, 4096}});
  const BatchStatus s = a->wait(id, 10s);
  ASSERT_EQ(BatchState::kFailed, s.state);
  EXPECT_EQ("b", s.peer);
  EXPECT_NE(std::string::npos, s.error.find("peer 'b'")) << s.error;
  EXPECT_NE(std::string::npos, s.error.find("deregistered")) << s.error;
  a->free_batch(id);
  // The segment is gone from the metadata; another one still works (a new connection).
  EXPECT_THROW(a->open_segment("b", "dst"), KvError);
  const SegmentHandle m = a->open_segment("b", "more");
  test::fill(src.data(), 4096, 9);
  const BatchId id2 = a->allocate_batch(1);
  a->submit_transfer(id2, std::vector<TransferRequest>{{Opcode::kWrite, src.data(), m, 0, 4096}});
  ASSERT_EQ(BatchState::kCompleted, a->wait(id2, 10s).state) << a->get_status(id2).error;
  EXPECT_EQ(-1, test::first_mismatch(more.data(), 4096, 9));
}

TEST_F(Errors, FreeingOrDeregisteringWhatIsInFlightIsRefused) {
  std::vector<uint8_t> big(32 << 20), far(32 << 20);
  a->register_memory(big.data(), big.size(), "cpu:0", "big");
  b->register_memory(far.data(), far.size(), "cpu:0", "far");
  const SegmentHandle f = a->open_segment("b", "far");
  const BatchId id = a->allocate_batch(8);
  std::vector<TransferRequest> reqs(8, {Opcode::kWrite, big.data(), f, 0, big.size()});
  a->submit_transfer(id, reqs);
  // 256 MiB in flight: both refusals are checked while the batch runs (if it already
  // finished, the calls are legal and the test says so instead of passing silently).
  bool pending = a->get_status(id).state == BatchState::kPending;
  if (pending) {
    expect_error<std::invalid_argument>([&] { a->free_batch(id); }, "in flight");
    expect_error<std::invalid_argument>([&] { a->deregister_memory("big"); }, "in use");
  }
  ASSERT_EQ(BatchState::kCompleted, a->wait(id, 60s).state);
  EXPECT_TRUE(pending) << "the 256 MiB batch finished before the refusals could be checked";
  a->free_batch(id);
  a->deregister_memory("big");
}

TEST_F(Errors, ADestroyedPeerFailsTheBatchNamingItWithinTheRetryBound) {
  std::vector<uint8_t> big(16 << 20), far(16 << 20);
  a->register_memory(big.data(), big.size(), "cpu:0", "big");
  b->register_memory(far.data(), far.size(), "cpu:0", "far");
  const SegmentHandle f = a->open_segment("b", "far");
  b.reset();  // its QPs and memory are gone; nothing answers a's QPs any more
  const BatchId id = a->allocate_batch(1);
  const auto t0 = Clock::now();
  a->submit_transfer(id,
                     std::vector<TransferRequest>{{Opcode::kWrite, big.data(), f, 0, big.size()}});
  const BatchStatus s = a->wait(id, 10s);
  const auto took = Clock::now() - t0;
  ASSERT_EQ(BatchState::kFailed, s.state);
  EXPECT_EQ("b", s.peer);
  EXPECT_NE(std::string::npos, s.error.find("peer 'b'")) << s.error;
  EXPECT_LT(took, 3s) << s.error;
  EXPECT_THROW(a->check_peer("b"), KvError);
}

}  // namespace
}  // namespace softrdma::kv
