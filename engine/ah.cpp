#include "engine/ah.h"

namespace softrdma::engine {

Status check_address_vector(const AddressVector& av, bool port_may_be_zero, uint32_t& peer_ip,
                            const char*& why) {
  peer_ip = 0;
  if (av.port_num != 1 && !(port_may_be_zero && av.port_num == 0)) {
    why = "port_num is not 1";
  } else if (!av.is_global) {
    why = "has no GRH (RoCE routes every packet by its IP header)";
  } else if (av.sgid_index != 0) {
    why = "sgid_index is not 0 (the port's only populated GID)";
  } else if (!av.dgid.to_ipv4(peer_ip) || peer_ip == 0) {
    why = "dgid is not an IPv4-mapped address";
  } else {
    return kOk;
  }
  return std::errc::invalid_argument;
}

AddressHandle::AddressHandle(ProtectionDomain& pd, const AddressVector& av, uint32_t peer_ip)
    : pd_(pd), av_(av), peer_ip_(peer_ip) {
  pd_.users++;
}

AddressHandle::~AddressHandle() {
  pd_.users--;
}

}  // namespace softrdma::engine
