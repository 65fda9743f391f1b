// The work-request table against the wire packet table: every wire opcode a request
// uses exists, and what the request row says about immediates and receive WQEs is what
// the packets that carry it say.
#include <gtest/gtest.h>

#include "engine/wr_table.h"

namespace softrdma::engine {
namespace {

TEST(WrTable, RowsAgreeWithTheWirePacketTable) {
  for (unsigned op = 0; op < kWrOpcodeCount; ++op) {
    if (!wr_opcode_supported(op)) continue;  // TSO, DRIVER1, FLUSH: empty rows
    const WrOpcodeInfo& w = wr_info(static_cast<WrOpcode>(op));
    SCOPED_TRACE(w.name);
    if (w.cls == WrClass::kLocal) continue;  // no packets
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
    EXPECT_EQ((only & (wire::kIsRead | wire::kIsAtomic | wire::kIsAtomicWrite)) != 0,
              w.takes_rd_atomic_credit());
    EXPECT_EQ((only & wire::kHasIeth) != 0,
              w.wc_opcode == WcOpcode::kSend && static_cast<WrOpcode>(op) == WrOpcode::kSendInv);
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

TEST(WrTable, TheVerbsOpcodesUpToSendWithInvalidateAndAtomicWriteAreSupported) {
  EXPECT_TRUE(wr_opcode_supported(static_cast<uint32_t>(WrOpcode::kFetchAdd)));
  EXPECT_TRUE(wr_opcode_supported(7));    // IBV_WR_LOCAL_INV
  EXPECT_TRUE(wr_opcode_supported(8));    // IBV_WR_BIND_MW
  EXPECT_TRUE(wr_opcode_supported(9));    // IBV_WR_SEND_WITH_INV
  EXPECT_FALSE(wr_opcode_supported(10));  // IBV_WR_TSO
  EXPECT_FALSE(wr_opcode_supported(11));  // IBV_WR_DRIVER1
  EXPECT_FALSE(wr_opcode_supported(14));  // IBV_WR_FLUSH
  EXPECT_TRUE(wr_opcode_supported(15));   // IBV_WR_ATOMIC_WRITE
  EXPECT_FALSE(wr_opcode_supported(16));
  EXPECT_FALSE(wr_opcode_supported(0xffffffffu));  // a negative int from C
}

// RDMA ATOMIC WRITE (IBTA rel. 1.5): one RC_ATOMIC_WRITE packet of 8 bytes, a credit of
// max_rd_atomic, completed as IBV_WC_ATOMIC_WRITE; its local data is read (no LOCAL_WRITE).
TEST(WrTable, AtomicWriteIsOneEightBytePacketThatTakesACredit) {
  const WrOpcodeInfo& a = wr_info(WrOpcode::kAtomicWrite);
  EXPECT_STREQ(a.name, "IBV_WR_ATOMIC_WRITE");
  EXPECT_EQ(a.cls, WrClass::kAtomicWrite);
  EXPECT_EQ(a.wc_opcode, WcOpcode::kAtomicWrite);
  EXPECT_EQ(a.fixed_length, 8);
  EXPECT_EQ(a.wire_opcode(true, true), wire::Opcode::kAtomicWrite);
  EXPECT_FALSE(a.read_or_atomic);
  EXPECT_TRUE(a.takes_rd_atomic_credit());
  EXPECT_TRUE(a.inline_allowed);
}

TEST(WrTable, LocalOperationsSendNothingAndCompleteWithTheirOwnOpcode) {
  EXPECT_EQ(wr_info(WrOpcode::kBindMw).cls, WrClass::kLocal);
  EXPECT_EQ(wr_info(WrOpcode::kLocalInv).cls, WrClass::kLocal);
  EXPECT_EQ(wr_info(WrOpcode::kLocalInv).wc_opcode, WcOpcode::kLocalInv);
  EXPECT_FALSE(wr_info(WrOpcode::kBindMw).inline_allowed);
}

}  // namespace
}  // namespace softrdma::engine
