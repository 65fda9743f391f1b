// Address handles (IBTA vol 1, 10.2.2; ibv_create_ah(3)): an address vector checked once
// and resolved to the peer's IPv4 address, which UD work requests name. The same check
// guards a connected QP's IBV_QP_AV.
#pragma once

#include <cstdint>

#include "engine/memory.h"
#include "engine/types.h"

namespace softrdma::engine {

/// Checks an address vector for RoCEv2 as rxe (rxe_av_chk_attr) and the core
/// (ib_resolve_eth_dmac) do, and resolves its destination: a GRH is required (`is_global`;
/// every RoCE packet is routed by its IP header), `sgid_index` must be 0 (the one GID),
/// `port_num` must be 1 — or 0, when `port_may_be_zero` (a QP's AV, whose port the QP has) —
/// and the destination GID must be IPv4-mapped (::ffff:a.b.c.d, not 0.0.0.0: softrdma
/// devices are IPv4 addresses). Returns EINVAL with `why` naming the field, or kOk with
/// `peer_ip` (host order).
Status check_address_vector(const AddressVector& av, bool port_may_be_zero, uint32_t& peer_ip,
                            const char*& why);

/// An address handle: where UD sends go. Immutable once created; holds its PD (which
/// ibv_dealloc_pd then refuses with EBUSY).
class AddressHandle {
 public:
  /// `av` was accepted by check_address_vector() with `peer_ip`.
  AddressHandle(ProtectionDomain& pd, const AddressVector& av, uint32_t peer_ip);
  ~AddressHandle();
  AddressHandle(const AddressHandle&) = delete;
  AddressHandle& operator=(const AddressHandle&) = delete;

  ProtectionDomain& pd() const { return pd_; }
  const AddressVector& av() const { return av_; }
  uint32_t peer_ip() const { return peer_ip_; }  ///< host order

 private:
  ProtectionDomain& pd_;
  AddressVector av_;
  uint32_t peer_ip_;
};

}  // namespace softrdma::engine
