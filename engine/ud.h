// The UD receive unit (ud.cpp).
// Declared here, not in qp.h, so that qp_type.cpp can name the units without the QP's whole
// definition (one header per transport unit).
#pragma once

#include <cstdint>

#include "engine/transport.h"
#include "wire/roce.h"

namespace softrdma::engine {

class QueuePair;

/// UD receive unit (ud.cpp): executes a SEND ONLY datagram. The receive buffer gets the
/// 40-byte GRH area first — for RoCEv2 over IPv4, 20 zero bytes and the packet's IPv4 header
/// (IBTA vol 1 11.4.1.1, annex A17.4.5.1; rxe execute()) — then the payload; the completion
/// has wc.src_qp from the DETH, IBV_WC_GRH and wc.sl = kSlRoceV2Ipv4. A datagram with no
/// receive WQE posted or one too small is dropped and counted (ud_dropped_pkts); the Q_Key
/// was checked by the device.
namespace ud {
/// ibv_wc.sl of a UD receive completion: on RoCE a ConnectX's CQE carries the received
/// packet's type in the SL bits, not an SL (RoCE has no SL outside a VLAN's PCP): bit 3 set
/// when the frame has a UDP header (RoCEv2), bits 2:0 the L3 header type, 0 GRH (RoCEv1),
/// 1 IPv6, 2 IPv4 — mlx5 PRM as quoted in UCX's ud_iface.h uct_ud_iface_check_grh();
/// rdma-core providers/mlx5/cq.c handle_responder() passes the CQE's bits 27:24 of
/// flags_rqpn to wc->sl unchanged (the kernel's mlx5 maps the same bits to
/// network_hdr_type: MLX5_CQE_ROCE_L3_HEADER_TYPE_IPV4 = 2). Every softrdma datagram is
/// RoCEv2 over IPv4: 0x8 | 0x2. UCX's ud_verbs reads bits 2:0 to find the destination
/// address in the GRH area (IPv4: its last 4 bytes; otherwise a 16-byte IPv6 GID) and
/// drops a datagram whose address is not one of its own: with 0 it dropped every one.
inline constexpr uint8_t kSlRoceV2Ipv4 = 0x8 | 0x2;
void on_request(QueuePair& qp, const wire::Packet& pkt, const RxMeta& meta, Transport& t);
/// Bytes of the GRH area at the head of every UD receive buffer (ibv_post_recv(3)).
inline constexpr uint32_t kGrhBytes = 40;
/// The GSI's well-known Q_Key (IBTA vol 1 ch. 13, GSI; rxe check_keys): QP1 accepts only it.
inline constexpr uint32_t kGsiQkey = 0x80010000;
}  // namespace ud

}  // namespace softrdma::engine
