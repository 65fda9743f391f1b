// Sample CM messages the MAD codec tests share (mad_test.cpp, mad_layout_test.cpp): every
// field set to a value that is not its default, so a field at a wrong place shows.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "cm/mad.h"

namespace softrdma::cm::testing_samples {

/// N bytes seed, seed + 7, seed + 14, … (mod 256).
template <size_t N>
inline std::array<uint8_t, N> pattern(uint8_t seed) {
  std::array<uint8_t, N> a;
  for (size_t i = 0; i < N; ++i) a[i] = uint8_t(seed + i * 7);
  return a;
}

/// A REQ with every field set (an RDMA IP CM service ID, transport RC).
inline Req sample_req() {
  Req r;
  r.local_comm_id = 0x11223344;
  r.vendor_id = 0x00c0ffee & 0xffffff;
  r.service_id = ip_service_id(0x0106, 18300);
  r.local_ca_guid = 0x0200'7f00'fffe'3f01ull;
  r.local_qkey = 0x80010000;
  r.local_qpn = 0xabcdef;
  r.responder_resources = 16;
  r.local_eecn = 0x123456;
  r.initiator_depth = 8;
  r.remote_eecn = 0x654321;
  r.remote_cm_response_timeout = 20;
  r.transport = ReqTransport::kRc;
  r.flow_control = true;
  r.starting_psn = 0xfedcba;
  r.local_cm_response_timeout = 19;
  r.retry_count = 7;
  r.pkey = 0xffff;
  r.path_mtu = 5;
  r.rdc_exists = false;
  r.rnr_retry_count = 6;
  r.max_cm_retries = 15;
  r.srq = true;
  r.extended_transport = 0;
  r.primary.local_gid = pattern<16>(1);
  r.primary.remote_gid = pattern<16>(2);
  r.primary.flow_label = 0xabcde;
  r.primary.packet_rate = 0x3f;
  r.primary.traffic_class = 0x68;
  r.primary.hop_limit = 64;
  r.primary.sl = 3;
  r.primary.subnet_local = false;
  r.primary.local_ack_timeout = 17;
  r.private_data = pattern<kReqPrivateBytes>(3);
  return r;
}

}  // namespace softrdma::cm::testing_samples
