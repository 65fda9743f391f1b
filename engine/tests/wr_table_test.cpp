// The work-request table against the wire packet table: every wire opcode a request
// uses exists, and what the request row says about immediates and receive WQEs is what
// the packets that carry it say.
#include <gtest/gtest.h>

#include "engine/wr_table.h"

namespace softrdma::engine {
namespace {

TEST(WrTable, RowsAgreeWithTheWirePacketTable) {
  for (unsigned op = 0; op < kWrOpcodeCount; ++op) {
    const WrOpcodeInfo& w = wr_info(static_cast<WrOpcode>(op));
    SCOPED_TRACE(w.name);
    for (wire::Opcode o : {w.first, w.middle, w.last, w.only}) {
      const wire::OpcodeInfo* p = wire::opcode_info(static_cast<uint8_t>(o));
      ASSERT_NE(p, nullptr);
      EXPECT_TRUE(p->mask & wire::kIsRequest);
    }
    const uint32_t last = wire::opcode_info(static_cast<uint8_t>(w.last))->mask;
    const uint32_t only = wire::opcode_info(static_cast<uint8_t>(w.only))->mask;
    EXPECT_EQ((only & wire::kHasImmDt) != 0, w.has_imm);
    EXPECT_EQ((last & wire::kHasImmDt) != 0, w.has_imm);
    EXPECT_EQ((only & wire::kConsumesRecvWqe) != 0, w.consumes_recv_wqe);
    EXPECT_EQ((only & (wire::kIsRead | wire::kIsAtomic)) != 0, w.read_or_atomic);
  }
}

TEST(WrTable, DataPacketOpcodeFollowsPositionInMessage) {
  const WrOpcodeInfo& s = wr_info(WrOpcode::kSendImm);
  EXPECT_EQ(s.wire_opcode(true, true), wire::Opcode::kSendOnlyImm);
  EXPECT_EQ(s.wire_opcode(true, false), wire::Opcode::kSendFirst);
  EXPECT_EQ(s.wire_opcode(false, false), wire::Opcode::kSendMiddle);
  EXPECT_EQ(s.wire_opcode(false, true), wire::Opcode::kSendLastImm);
  EXPECT_EQ(wr_info(WrOpcode::kRdmaWrite).wire_opcode(false, true), wire::Opcode::kWriteLast);
}

TEST(WrTable, OnlyTheVerbsOpcodesUpToFetchAddAreSupported) {
  EXPECT_TRUE(wr_opcode_supported(static_cast<uint32_t>(WrOpcode::kFetchAdd)));
  EXPECT_FALSE(wr_opcode_supported(7));            // IBV_WR_LOCAL_INV
  EXPECT_FALSE(wr_opcode_supported(0xffffffffu));  // a negative int from C
}

}  // namespace
}  // namespace softrdma::engine
