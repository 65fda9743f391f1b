// UD receive unit: a SEND ONLY datagram into a receive WQE, GRH area first (see qp.h).
// IBTA vol 1 9.8 (UD), 11.4.1.1 (the GRH in the receive buffer), annex A17.4.5.1 (RoCEv2:
// the IPv4 header in the GRH's last 20 bytes); rxe_resp.c execute() and do_complete().
#include <array>
#include <cstring>

#include "engine/log.h"
#include "engine/placement.h"
#include "engine/qp.h"

namespace softrdma::engine::ud {

namespace {

/// The 40-byte GRH area for a RoCEv2 datagram received over IPv4: 20 zero bytes, then the
/// IPv4 header as it arrived (what rxe copies from ip_hdr(skb)). The device sees the
/// datagram through a UDP socket, so the header is rebuilt from what it knows: addresses,
/// TOS, TTL, the IPv4 id recovered from the ICRC, DF, protocol UDP, and its checksum.
std::array<uint8_t, kGrhBytes> grh_for(const RxMeta& m) {
  std::array<uint8_t, kGrhBytes> g{};
  uint8_t* ip = g.data() + 20;
  const uint16_t total = static_cast<uint16_t>(20 + 8 + m.udp_payload_bytes);
  ip[0] = 0x45;  // version 4, 5 words
  ip[1] = m.tos;
  ip[2] = static_cast<uint8_t>(total >> 8);
  ip[3] = static_cast<uint8_t>(total);
  ip[4] = static_cast<uint8_t>(m.ip_id >> 8);
  ip[5] = static_cast<uint8_t>(m.ip_id);
  ip[6] = 0x40;  // DF
  ip[8] = m.ttl;
  ip[9] = 17;  // UDP
  for (int i = 0; i < 4; ++i) {
    ip[12 + i] = static_cast<uint8_t>(m.src_ip >> (24 - 8 * i));
    ip[16 + i] = static_cast<uint8_t>(m.dst_ip >> (24 - 8 * i));
  }
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += uint32_t(ip[i] << 8 | ip[i + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  const uint16_t check = static_cast<uint16_t>(~sum);
  ip[10] = static_cast<uint8_t>(check >> 8);
  ip[11] = static_cast<uint8_t>(check);
  return g;
}

void drop(QueuePair& qp, const wire::Packet& pkt, Transport& t, const char* why) {
  bump(t.counters().ud_dropped_pkts);
  log().debug("qp {:#x}: {} from qp {:#x} dropped: {}", qp.qpn(), pkt.info->name,
              pkt.hdr.deth.src_qpn, why);
}

}  // namespace

void on_request(QueuePair& qp, const wire::Packet& pkt, const RxMeta& meta, Transport& t) {
  // Every UD opcode is a SEND ONLY (the opcode table has no other), of at most one MTU.
  if (pkt.payload.size() > qp.mtu) return drop(qp, pkt, t, "payload over the port MTU");
  // Class D (IBTA 9.9.3; rxe RESPST_ERR_RNR / ERR_LENGTH for UD): no receive WQE or too
  // small a one drops the datagram; a WQE taken stays held for the next datagram.
  if (!qp.take_recv_wqe()) return drop(qp, pkt, t, "no receive WQE posted");
  if (qp.resp.wqe->length < kGrhBytes + pkt.payload.size())
    return drop(qp, pkt, t, "receive WQE smaller than GRH + payload");
  const auto grh = grh_for(meta);
  if (placement::scatter(qp, t, 0, grh) != placement::Outcome::kDone ||
      placement::scatter(qp, t, kGrhBytes, pkt.payload) != placement::Outcome::kDone) {
    // An SGE outside local-writable memory of the PD: the WQE is the consumer's error
    // (class A, IBTA 9.9.3.1.1), reported on it; the QP stays usable as rxe's UD does not.
    qp.complete_recv(WcStatus::kLocProtErr, WcOpcode::kRecv, 0, 0, 0, false, pkt.hdr.deth.src_qpn);
    return;
  }
  const bool imm = pkt.info->mask & wire::kHasImmDt;
  qp.complete_recv(WcStatus::kSuccess, WcOpcode::kRecv,
                   static_cast<uint32_t>(kGrhBytes + pkt.payload.size()), imm ? pkt.hdr.imm_be : 0,
                   kWcGrh | (imm ? uint32_t{kWcWithImm} : 0u), pkt.hdr.bth.solicited,
                   pkt.hdr.deth.src_qpn, kSlRoceV2Ipv4);
}

}  // namespace softrdma::engine::ud
