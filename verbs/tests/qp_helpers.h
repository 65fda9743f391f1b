// Helpers of the tests that drive QPs of every type by hand (qp_types_test.cpp,
// mcast_test.cpp): a QP with its own CQ, the RESET -> RTS walk with the attributes IBTA
// table 91 requires for its type, an address handle, a UD send.
#pragma once

#include <arpa/inet.h>

#include <cstring>
#include <string>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {

inline constexpr uint32_t kQkey = 0x11111111;
inline constexpr uint32_t kPsn = 0x1000;

/// A QP of `type` on r's device with its own CQ (`srq` optional); RESET.
inline ibv_qp* make_qp(Role& r, ibv_qp_type type, ibv_cq*& cq, ibv_srq* srq = nullptr) {
  if (!cq) cq = ibv_create_cq(r.dev().ctx, 256, nullptr, nullptr, 0);
  EXPECT_NE(nullptr, cq);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.srq = srq;
  ia.qp_type = type;
  ia.cap = {64, srq ? 0u : 64u, 2, 2, 0};
  ibv_qp* qp = ibv_create_qp(r.dev().pd, &ia);
  if (!qp) fail_fatal(std::string("ibv_create_qp: ") + strerror(errno));
  return qp;
}

/// RESET → RTS with the attributes IBTA table 91 requires for the QP's type (UD: Q_Key, no
/// AV; UC: AV, no RDMA-read attributes; RC/XRC: all), towards (dgid, dest_qpn). `qkey`:
/// a UD QP's Q_Key.
inline void to_rts(ibv_qp* qp, const ibv_gid& dgid, uint32_t dest_qpn, uint32_t qkey = kQkey) {
  const ibv_qp_type t = qp->qp_type;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = qkey;
  a.qp_access_flags = kAllAccess;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  mask |= t == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
  ASSERT_EQ(0, ibv_modify_qp(qp, &a, mask)) << "INIT";
  a = {};
  a.qp_state = IBV_QPS_RTR;
  mask = IBV_QP_STATE;
  if (t != IBV_QPT_UD) {
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = kPsn;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = dgid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (t == IBV_QPT_RC || t == IBV_QPT_XRC_RECV) {
      a.max_dest_rd_atomic = 4;
      a.min_rnr_timer = 1;
      mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
  }
  ASSERT_EQ(0, ibv_modify_qp(qp, &a, mask)) << "RTR";
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = kPsn;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV) {
    a.timeout = 14;
    mask |= IBV_QP_TIMEOUT;
  }
  if (t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND) {
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    mask |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  ASSERT_EQ(0, ibv_modify_qp(qp, &a, mask)) << "RTS";
}

inline ibv_ah* make_ah(Role& r, const ibv_gid& dgid) {
  ibv_ah_attr a{};
  a.is_global = 1;
  a.grh.dgid = dgid;
  a.grh.hop_limit = 64;
  a.port_num = 1;
  ibv_ah* ah = ibv_create_ah(r.dev().pd, &a);
  if (!ah) fail_fatal(std::string("ibv_create_ah: ") + strerror(errno));
  return ah;
}

inline int post_ud(ibv_qp* qp, ibv_ah* ah, uint32_t qpn, uint32_t qkey, uint64_t wr_id,
                   const void* p, uint32_t len, uint32_t lkey, bool imm = false) {
  ibv_sge s{reinterpret_cast<uintptr_t>(p), len, lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
  wr.imm_data = htonl(0xabcd0000 | uint32_t(wr_id));
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = qpn;
  wr.wr.ud.remote_qkey = qkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

}  // namespace softrdma::verbs_test
