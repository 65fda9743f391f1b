// ibv_ah: address handles for UD (ibv_create_ah(3), ibv_destroy_ah, ibv_init_ah_from_wc(3),
// ibv_create_ah_from_wc). An AH is checked and resolved once (engine/ah.h); a UD work
// request carries its resolved destination from post time on.
#include <arpa/inet.h>

#include <cstring>

#include "engine/log.h"
#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

engine::AddressVector to_engine(const ibv_ah_attr& a) {
  engine::AddressVector av;
  av.is_global = a.is_global != 0;
  std::memcpy(av.dgid.raw, a.grh.dgid.raw, 16);
  av.flow_label = a.grh.flow_label;
  av.sgid_index = a.grh.sgid_index;
  av.hop_limit = a.grh.hop_limit;
  av.traffic_class = a.grh.traffic_class;
  av.sl = a.sl;
  av.port_num = a.port_num;
  av.static_rate = a.static_rate;
  av.dlid = a.dlid;
  av.src_path_bits = a.src_path_bits;
  return av;
}

}  // namespace

extern "C" {

/// ibv_create_ah: EINVAL (as rxe with the core's checks: rxe_av_chk_attr, ib_resolve_eth_dmac)
/// for a port other than 1, no GRH (RoCE), an sgid_index other than 0, or a destination GID
/// that is not IPv4-mapped; ENOMEM at max_ah.
ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr) return fail<ibv_ah>(EINVAL);
  const engine::AddressVector av = to_engine(*attr);
  uint32_t ip = 0;
  const char* why = nullptr;
  if (engine::check_address_vector(av, /*port_may_be_zero=*/false, ip, why) != engine::kOk) {
    engine::log().debug("create_ah refused: {}", why);
    return fail<ibv_ah>(EINVAL);
  }
  auto* a = new Ah{};
  if (!a->slot.take(*to_ctx(pd->context)->dev, engine::ObjectKind::kAh)) {
    delete a;
    return fail<ibv_ah>(ENOMEM);
  }
  a->ah = std::make_unique<engine::AddressHandle>(*to_pd(pd)->pd, av, ip);
  a->ibv.context = pd->context;
  a->ibv.pd = pd;
  a->ibv.handle = ip;
  return &a->ibv;
}

int ibv_destroy_ah(ibv_ah* ah) {
  if (!ah) return EINVAL;
  delete to_ah(ah);
  return 0;
}

/// ibv_init_ah_from_wc: the AH that answers a received UD datagram. Its GRH area holds the
/// sender's IPv4 header in its last 20 bytes (RoCEv2 over IPv4, annex A17.4.5.1): the
/// destination GID is the IPv4-mapped form of that header's source address. EINVAL without
/// IBV_WC_GRH (RoCE needs the GRH) or a GRH that holds no IPv4 header.
int ibv_init_ah_from_wc(ibv_context* ctx, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                        ibv_ah_attr* ah_attr) {
  if (!ctx || !wc || !grh || !ah_attr || port_num != 1) return EINVAL;
  if (!(wc->wc_flags & IBV_WC_GRH)) return EINVAL;
  const auto* ip = reinterpret_cast<const uint8_t*>(grh) + 20;
  if ((ip[0] >> 4) != 4) return EINVAL;
  *ah_attr = ibv_ah_attr{};
  ah_attr->is_global = 1;
  ah_attr->port_num = port_num;
  ah_attr->sl = wc->sl;
  ah_attr->dlid = wc->slid;
  ah_attr->grh.sgid_index = 0;
  ah_attr->grh.hop_limit = 0xff;
  ah_attr->grh.traffic_class = ip[1];
  uint32_t src = 0;
  std::memcpy(&src, ip + 12, 4);
  const engine::Gid g = engine::Gid::from_ipv4(ntohl(src));
  std::memcpy(ah_attr->grh.dgid.raw, g.raw, 16);
  return 0;
}

ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  if (!pd) return fail<ibv_ah>(EINVAL);
  ibv_ah_attr attr;
  if (int e = ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return fail<ibv_ah>(e);
  return ibv_create_ah(pd, &attr);
}

}  // extern "C"
