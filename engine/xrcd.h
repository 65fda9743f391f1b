// XRC domains (IBTA vol 1 annex A14.2.1; ibv_open_xrcd(3)): the scope in which XRC
// receive QPs and XRC SRQs may be used together. An XRC request names an SRQ by number;
// the target QP accepts it only when that SRQ belongs to the QP's domain.
#pragma once

#include <atomic>

namespace softrdma::engine {

/// An XRC domain. Objects (XRC SRQs, XRC receive QPs) that reference it count as users;
/// ibv_close_xrcd is refused (EBUSY) while there are any.
class XrcDomain {
 public:
  XrcDomain() = default;
  XrcDomain(const XrcDomain&) = delete;
  XrcDomain& operator=(const XrcDomain&) = delete;
  std::atomic<int> users{0};
};

}  // namespace softrdma::engine
