// SEND, WRITE and READ at path MTU 256 / 1024 / 4096 with message sizes around the packet
// boundaries (0 B, 1 B, MTU−1, MTU, MTU+1) and one message ≥ 64 MiB (beyond rxe's 8 MiB),
// between two processes; data and the bytes around it verified. Source and destination
// offsets are odd so no size lines up with a page or a 4-byte pad boundary by accident.
#include <cstring>
#include <string>
#include <tuple>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

enum class Op { kSend, kWrite, kRead };
enum class Size { kZero, kOne, kMtuMinus1, kMtu, kMtuPlus1, kHuge };

constexpr uint64_t kHugeBytes = (64ull << 20) + 3;  // 64 MiB + 3: a partial, padded last packet
constexpr uint32_t kSrcOff = 3;
constexpr uint32_t kDstOff = 5;
constexpr uint64_t kSeed = 0x77;

uint64_t bytes_of(Size s, uint32_t mtu) {
  switch (s) {
    case Size::kZero:
      return 0;
    case Size::kOne:
      return 1;
    case Size::kMtuMinus1:
      return mtu - 1;
    case Size::kMtu:
      return mtu;
    case Size::kMtuPlus1:
      return mtu + 1;
    case Size::kHuge:
      return kHugeBytes;
  }
  return 0;
}

using Param = std::tuple<Op, ibv_mtu, Size>;

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [op, mtu, size] = info.param;
  std::string s = op == Op::kSend ? "Send" : op == Op::kWrite ? "Write" : "Read";
  s += "_Mtu" + std::to_string(mtu_bytes(mtu)) + "_";
  switch (size) {
    case Size::kZero:
      return s + "0B";
    case Size::kOne:
      return s + "1B";
    case Size::kMtuMinus1:
      return s + "MtuMinus1";
    case Size::kMtu:
      return s + "Mtu";
    case Size::kMtuPlus1:
      return s + "MtuPlus1";
    case Size::kHuge:
      return s + "64MiBPlus3";
  }
  return s;
}

class MtuSizes : public ::testing::TestWithParam<Param> {};

TEST_P(MtuSizes, DataIntact) {
  const auto [op, mtu_enum, size_kind] = GetParam();
  const uint64_t size = bytes_of(size_kind, mtu_bytes(mtu_enum));
  const bool huge = size_kind == Size::kHuge;
  const milliseconds wait = huge ? 150s : 10s;
  const size_t region = size + 8192;  // what the checks cover, guards included

  Spec s;
  s.conn.path_mtu = mtu_enum;
  s.roles.resize(2);
  s.roles[0].buf_size = s.roles[1].buf_size = region;
  s.links = {{0, 1}};
  s.deadline = huge ? 220s : 60s;

  s.roles[0].fn = [&, op = op](Role& r) {  // requester
    auto& l = r.link();
    ASSERT_GE(r.dev().port.max_msg_sz, size) << "port max_msg_sz";
    const auto len = static_cast<uint32_t>(size);
    if (op == Op::kRead) {
      memset(r.buf(), kGuard, region);
    } else {
      fill_pattern(r.buf(), kSrcOff + size, kSeed);
    }
    r.barrier();  // the target is ready
    switch (op) {
      case Op::kSend:
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 1, r.buf() + kSrcOff, len, r.lkey()));
        break;
      case Op::kWrite:
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 1, r.buf() + kSrcOff, len, r.lkey(),
                               l.remote.addr + kDstOff, l.remote.rkey));
        break;
      case Op::kRead:
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, 1, r.buf() + kDstOff, len, r.lkey(),
                               l.remote.addr + kSrcOff, l.remote.rkey));
        break;
    }
    const ibv_wc wc = poll_one(l.ep.scq, wait);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
    EXPECT_EQ(1u, wc.wr_id);
    if (op == Op::kRead) {
      EXPECT_EQ(IBV_WC_RDMA_READ, wc.opcode);
      EXPECT_EQ(size, wc.byte_len);
      EXPECT_TRUE(AllBytesAre(r.buf(), kDstOff, kGuard));
      EXPECT_TRUE(HasPattern(r.buf() + kDstOff, size, kSeed, kSrcOff));
      EXPECT_TRUE(AllBytesAre(r.buf() + kDstOff + size, region - kDstOff - size, kGuard));
    } else {
      EXPECT_EQ(op == Op::kSend ? IBV_WC_SEND : IBV_WC_RDMA_WRITE, wc.opcode);
    }
    r.send_value(1, uint32_t{1});
  };

  s.roles[1].fn = [&, op = op](Role& r) {  // target
    auto& l = r.link();
    if (op == Op::kRead) {
      fill_pattern(r.buf(), kSrcOff + size, kSeed);
    } else {
      memset(r.buf(), kGuard, region);
    }
    if (op == Op::kSend) {
      ASSERT_EQ(
          0, post_recv(l.ep.qp, 9, r.buf() + kDstOff, static_cast<uint32_t>(size + 64), r.lkey()));
    }
    r.barrier();
    if (op == Op::kSend) {
      const ibv_wc wc = poll_one(l.ep.rcq, wait);
      ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
      EXPECT_EQ(9u, wc.wr_id);
      EXPECT_EQ(IBV_WC_RECV, wc.opcode);
      EXPECT_EQ(size, wc.byte_len);
    }
    r.recv_value<uint32_t>(0, wait + 10s);
    if (op != Op::kRead) {
      EXPECT_TRUE(AllBytesAre(r.buf(), kDstOff, kGuard));
      EXPECT_TRUE(HasPattern(r.buf() + kDstOff, size, kSeed, kSrcOff));
      EXPECT_TRUE(AllBytesAre(r.buf() + kDstOff + size, region - kDstOff - size, kGuard));
    } else {
      EXPECT_TRUE(HasPattern(r.buf(), kSrcOff + size, kSeed)) << "a READ changed its source";
    }
    EXPECT_TRUE(no_completion(l.ep.rcq, 10ms));
  };
  run_roles(s);
}

INSTANTIATE_TEST_SUITE_P(
    AllOps, MtuSizes,
    ::testing::Combine(::testing::Values(Op::kSend, Op::kWrite, Op::kRead),
                       ::testing::Values(IBV_MTU_256, IBV_MTU_1024, IBV_MTU_4096),
                       ::testing::Values(Size::kZero, Size::kOne, Size::kMtuMinus1, Size::kMtu,
                                         Size::kMtuPlus1, Size::kHuge)),
    param_name);

}  // namespace
}  // namespace softrdma::verbs_test
