// The CM MAD codec: every message survives encode → decode, fields land at the byte and bit
// positions of IBTA vol. 1 ch. 12 / 13.4.2, and malformed MADs are refused with a reason.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cm/mad.h"
#include "cm/tests/mad_samples.h"

namespace softrdma::cm {
namespace {

using testing_samples::pattern;
using testing_samples::sample_req;

bool same(const Req& a, const Req& b) {
  return a.local_comm_id == b.local_comm_id && a.vendor_id == b.vendor_id &&
         a.service_id == b.service_id && a.local_ca_guid == b.local_ca_guid &&
         a.local_qkey == b.local_qkey && a.local_qpn == b.local_qpn &&
         a.responder_resources == b.responder_resources && a.local_eecn == b.local_eecn &&
         a.initiator_depth == b.initiator_depth && a.remote_eecn == b.remote_eecn &&
         a.remote_cm_response_timeout == b.remote_cm_response_timeout &&
         a.transport == b.transport && a.flow_control == b.flow_control &&
         a.starting_psn == b.starting_psn &&
         a.local_cm_response_timeout == b.local_cm_response_timeout &&
         a.retry_count == b.retry_count && a.pkey == b.pkey && a.path_mtu == b.path_mtu &&
         a.rdc_exists == b.rdc_exists && a.rnr_retry_count == b.rnr_retry_count &&
         a.max_cm_retries == b.max_cm_retries && a.srq == b.srq &&
         a.extended_transport == b.extended_transport &&
         a.primary.local_lid == b.primary.local_lid &&
         a.primary.remote_lid == b.primary.remote_lid &&
         a.primary.local_gid == b.primary.local_gid &&
         a.primary.remote_gid == b.primary.remote_gid &&
         a.primary.flow_label == b.primary.flow_label &&
         a.primary.packet_rate == b.primary.packet_rate &&
         a.primary.traffic_class == b.primary.traffic_class &&
         a.primary.hop_limit == b.primary.hop_limit && a.primary.sl == b.primary.sl &&
         a.primary.subnet_local == b.primary.subnet_local &&
         a.primary.local_ack_timeout == b.primary.local_ack_timeout &&
         a.private_data == b.private_data;
}

MadHeader header(uint64_t tid) {
  MadHeader h;
  h.transaction_id = tid;
  return h;
}

TEST(MadCodec, ReqRoundTripsEveryField) {
  Req r = sample_req();
  auto bytes = encode(header(0x0102030405060708ull), r);
  DecodeResult d = decode(bytes);
  ASSERT_TRUE(d.mad);
  EXPECT_EQ(d.mad->header.transaction_id, 0x0102030405060708ull);
  EXPECT_EQ(d.mad->header.attr_id, uint16_t(AttrId::kReq));
  ASSERT_TRUE(std::holds_alternative<Req>(d.mad->message));
  EXPECT_TRUE(same(std::get<Req>(d.mad->message), r));
  // And back again, byte for byte.
  EXPECT_EQ(encode(d.mad->header, d.mad->message), bytes);
}

TEST(MadCodec, HeaderBytesAreIbta13_4_2) {
  auto b = encode(header(0x1122334455667788ull), Rtu{});
  EXPECT_EQ(b[0], 1);     // BaseVersion
  EXPECT_EQ(b[1], 0x07);  // MgmtClass: CM
  EXPECT_EQ(b[2], 2);     // ClassVersion
  EXPECT_EQ(b[3], 0x03);  // Method: ComMgtSend
  EXPECT_EQ(b[8], 0x11);  // TransactionID, big-endian
  EXPECT_EQ(b[15], 0x88);
  EXPECT_EQ(b[16], 0x00);  // AttributeID 0x0014 (RTU)
  EXPECT_EQ(b[17], 0x14);
}

TEST(MadCodec, ReqFieldsSitWhereTable106PutsThem) {
  Req r = sample_req();
  auto b = encode(header(1), r);
  const uint8_t* d = b.data() + kMadHeaderBytes;
  EXPECT_EQ(d[0], 0x11);  // Local Communication ID
  EXPECT_EQ(d[3], 0x44);
  // Service ID 0x0000000001PPPPPP at byte 8: port space 0x0106, port 18300 (0x477c).
  const uint8_t sid[8] = {0, 0, 0, 0, 0x01, 0x06, 0x47, 0x7c};
  EXPECT_EQ(0, std::memcmp(d + 8, sid, 8));
  EXPECT_EQ(d[32], 0xab);  // Local QPN (24 bits) then Responder Resources
  EXPECT_EQ(d[34], 0xef);
  EXPECT_EQ(d[35], 16);
  EXPECT_EQ(d[39], 8);                         // Initiator Depth
  EXPECT_EQ(d[43], (20 << 3) | (0 << 1) | 1);  // Remote CM timeout | transport RC | E2E FC
  EXPECT_EQ(d[44], 0xfe);                      // Starting PSN
  EXPECT_EQ(d[47], (19 << 3) | 7);             // Local CM timeout | Retry Count
  EXPECT_EQ(d[50], (5 << 4) | 6);              // Path MTU | RDC | RNR Retry Count
  EXPECT_EQ(d[51], (15 << 4) | (1 << 3));      // Max CM Retries | SRQ | ext. transport
  EXPECT_EQ(d[56], r.primary.local_gid[0]);    // Primary Local Port GID
  EXPECT_EQ(d[72], r.primary.remote_gid[0]);
  EXPECT_EQ(d[88], 0xab);  // flow label 0xabcde in the top 20 bits
  EXPECT_EQ(d[90] >> 4, 0xe);
  EXPECT_EQ(d[91] & 0x3f, 0x3f);  // packet rate
  EXPECT_EQ(d[93], 64);           // hop limit
  EXPECT_EQ(d[94] >> 4, 3);       // SL
  EXPECT_EQ(d[95] >> 3, 17);      // local ACK timeout
  EXPECT_EQ(d[140], r.private_data[0]);
  EXPECT_EQ(b[255], r.private_data[kReqPrivateBytes - 1]);
}

TEST(MadCodec, RepRtuRejMraRoundTrip) {
  Rep rep;
  rep.local_comm_id = 7;
  rep.remote_comm_id = 9;
  rep.local_qkey = 0x01234567;
  rep.local_qpn = 0x000123;
  rep.local_eecn = 0x000456;
  rep.starting_psn = 0x789abc;
  rep.vendor_id = 0x02c9ab;
  rep.responder_resources = 4;
  rep.initiator_depth = 3;
  rep.target_ack_delay = 15;
  rep.failover_accepted = 2;
  rep.flow_control = true;
  rep.rnr_retry_count = 7;
  rep.srq = true;
  rep.local_ca_guid = 0xdeadbeefcafef00dull;
  rep.private_data = pattern<kRepPrivateBytes>(9);
  auto d = decode(encode(header(5), rep));
  ASSERT_TRUE(d.mad);
  const Rep& r2 = std::get<Rep>(d.mad->message);
  EXPECT_EQ(r2.local_qpn, rep.local_qpn);
  EXPECT_EQ(r2.vendor_id, rep.vendor_id);
  EXPECT_EQ(r2.starting_psn, rep.starting_psn);
  EXPECT_EQ(r2.target_ack_delay, 15);
  EXPECT_EQ(r2.failover_accepted, 2);
  EXPECT_TRUE(r2.flow_control);
  EXPECT_EQ(r2.rnr_retry_count, 7);
  EXPECT_TRUE(r2.srq);
  EXPECT_EQ(r2.local_ca_guid, rep.local_ca_guid);
  EXPECT_EQ(r2.private_data, rep.private_data);

  Rej rej;
  rej.local_comm_id = 1;
  rej.remote_comm_id = 2;
  rej.message = MessageRef::kRep;
  rej.reject_info_length = 8;
  rej.reason = uint16_t(RejReason::kConsumerDefined);
  rej.ari = pattern<kRejAriBytes>(4);
  rej.private_data = pattern<kRejPrivateBytes>(5);
  auto rb = encode(header(6), rej);
  EXPECT_EQ(rb[kMadHeaderBytes + 8] >> 6, 1);  // Message REJected: REP
  EXPECT_EQ(rb[kMadHeaderBytes + 9] >> 1, 8);  // Reject Info Length
  EXPECT_EQ(rb[kMadHeaderBytes + 11], 28);     // Reason
  auto dj = decode(rb);
  ASSERT_TRUE(dj.mad);
  const Rej& j2 = std::get<Rej>(dj.mad->message);
  EXPECT_EQ(j2.message, MessageRef::kRep);
  EXPECT_EQ(j2.reject_info_length, 8);
  EXPECT_EQ(j2.reason, 28);
  EXPECT_EQ(j2.ari, rej.ari);
  EXPECT_EQ(j2.private_data, rej.private_data);

  Mra mra;
  mra.local_comm_id = 3;
  mra.remote_comm_id = 4;
  mra.message = MessageRef::kReq;
  mra.service_timeout = 24;
  auto dm = decode(encode(header(7), mra));
  ASSERT_TRUE(dm.mad);
  EXPECT_EQ(std::get<Mra>(dm.mad->message).service_timeout, 24);

  Rtu rtu;
  rtu.local_comm_id = 10;
  rtu.remote_comm_id = 11;
  rtu.private_data = pattern<kRtuPrivateBytes>(6);
  auto dr = decode(encode(header(8), rtu));
  ASSERT_TRUE(dr.mad);
  EXPECT_EQ(std::get<Rtu>(dr.mad->message).private_data, rtu.private_data);
}

TEST(MadCodec, DreqDrepSidrRoundTrip) {
  Dreq dq;
  dq.local_comm_id = 1;
  dq.remote_comm_id = 2;
  dq.remote_qpn = 0x00abcd;
  dq.private_data = pattern<kDreqPrivateBytes>(1);
  auto d1 = decode(encode(header(1), dq));
  ASSERT_TRUE(d1.mad);
  EXPECT_EQ(std::get<Dreq>(d1.mad->message).remote_qpn, 0x00abcd);
  EXPECT_EQ(std::get<Dreq>(d1.mad->message).private_data, dq.private_data);

  Drep dp;
  dp.local_comm_id = 3;
  dp.remote_comm_id = 4;
  auto d2 = decode(encode(header(2), dp));
  ASSERT_TRUE(d2.mad);
  EXPECT_EQ(std::get<Drep>(d2.mad->message).remote_comm_id, 4u);

  SidrReq sq;
  sq.request_id = 0x55;
  sq.pkey = 0xffff;
  sq.service_id = ip_service_id(0x0111, 18301);
  sq.private_data = pattern<kSidrReqPrivateBytes>(2);
  auto d3 = decode(encode(header(3), sq));
  ASSERT_TRUE(d3.mad);
  EXPECT_EQ(std::get<SidrReq>(d3.mad->message).service_id, sq.service_id);
  EXPECT_EQ(std::get<SidrReq>(d3.mad->message).private_data, sq.private_data);

  SidrRep sp;
  sp.request_id = 0x55;
  sp.status = SidrStatus::kUnsupported;
  sp.qpn = 0x000042;
  sp.vendor_id = 0x123456;
  sp.service_id = sq.service_id;
  sp.qkey = 0x01234567;
  sp.private_data = pattern<kSidrRepPrivateBytes>(3);
  auto b4 = encode(header(4), sp);
  EXPECT_EQ(b4[kMadHeaderBytes + 4], 1);      // Status
  EXPECT_EQ(b4[kMadHeaderBytes + 10], 0x42);  // QPN low byte
  auto d4 = decode(b4);
  ASSERT_TRUE(d4.mad);
  const SidrRep& p2 = std::get<SidrRep>(d4.mad->message);
  EXPECT_EQ(p2.status, SidrStatus::kUnsupported);
  EXPECT_EQ(p2.qpn, 0x42u);
  EXPECT_EQ(p2.vendor_id, 0x123456u);
  EXPECT_EQ(p2.service_id, sq.service_id);
  EXPECT_EQ(p2.qkey, 0x01234567u);
  EXPECT_EQ(p2.private_data, sp.private_data);
}

TEST(MadCodec, OversizedFieldsAreCutToTheirWireWidth) {
  Req r;
  r.local_qpn = 0xff123456;             // 24 bits on the wire
  r.remote_cm_response_timeout = 0xff;  // 5 bits
  r.retry_count = 9;                    // 3 bits
  auto d = decode(encode(header(1), r));
  ASSERT_TRUE(d.mad);
  const Req& r2 = std::get<Req>(d.mad->message);
  EXPECT_EQ(r2.local_qpn, 0x123456u);
  EXPECT_EQ(r2.remote_cm_response_timeout, 31);
  EXPECT_EQ(r2.retry_count, 1);
  EXPECT_EQ(r2.initiator_depth, 0);  // neighbours untouched
  EXPECT_EQ(r2.transport, ReqTransport::kRc);
}

TEST(MadCodec, MalformedMadsAreRefusedWithTheirReason) {
  auto good = encode(header(1), Rtu{});
  EXPECT_EQ(decode(std::span(good).first(255)).error, MadError::kTooShort);
  EXPECT_FALSE(decode(std::span(good).first(255)).mad);
  auto b = good;
  b[0] = 2;
  EXPECT_EQ(decode(b).error, MadError::kBadBaseVersion);
  b = good;
  b[1] = 0x03;  // Subnet Administration
  EXPECT_EQ(decode(b).error, MadError::kNotCm);
  b = good;
  b[2] = 1;
  EXPECT_EQ(decode(b).error, MadError::kBadClassVersion);
  b = good;
  b[3] = 0x01;  // Get
  EXPECT_EQ(decode(b).error, MadError::kBadMethod);
  b = good;
  b[17] = 0x19;  // LAP: not handled
  EXPECT_EQ(decode(b).error, MadError::kUnknownAttribute);
  // Longer buffers (a UD receive's padding) decode from their first 256 bytes.
  std::vector<uint8_t> longer(good.begin(), good.end());
  longer.resize(300, 0xee);
  EXPECT_TRUE(decode(longer).mad);
}

TEST(MadCodec, RandomBytesNeverCrashAndOnlyCmMessagesDecode) {
  std::mt19937 rng(42);
  size_t decoded = 0;
  for (int i = 0; i < 20000; ++i) {
    std::array<uint8_t, kMadBytes> b;
    for (auto& x : b) x = uint8_t(rng());
    if (i % 2) {  // half look like CM MADs, so the message decoders run on random bodies
      b[0] = 1;
      b[1] = 7;
      b[2] = 2;
      b[3] = 3;
      b[16] = 0;
      b[17] = uint8_t(0x10 + rng() % 10);
    }
    DecodeResult d = decode(b);
    if (d.mad) {
      ++decoded;
      EXPECT_EQ(encode(d.mad->header, d.mad->message)[17], b[17]);
    }
  }
  EXPECT_GT(decoded, 8500u);  // 9 of the 10 attribute IDs are messages
}

TEST(IpCmHeader, AnnexA11LayoutIpv4) {
  IpCmHeader h;
  h.src_port = 18300;
  h.src_ip = 0x7f003f02;
  h.dst_ip = 0x7f003f01;
  std::array<uint8_t, kReqPrivateBytes> pd{};
  encode_ip_cm_header(h, pd);
  EXPECT_EQ(pd[0], 0x00);  // CMA version
  EXPECT_EQ(pd[1], 0x40);  // IP version 4 in the high nibble
  EXPECT_EQ(pd[2], 0x47);  // source port
  EXPECT_EQ(pd[3], 0x7c);
  for (int i = 4; i < 16; ++i) EXPECT_EQ(pd[i], 0) << i;
  EXPECT_EQ(pd[16], 127);  // source IPv4 in the last 4 bytes of its 16
  EXPECT_EQ(pd[19], 2);
  EXPECT_EQ(pd[32], 127);
  EXPECT_EQ(pd[35], 1);
  auto back = decode_ip_cm_header(pd);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->src_port, 18300);
  EXPECT_EQ(back->src_ip, h.src_ip);
  EXPECT_EQ(back->dst_ip, h.dst_ip);
  pd[1] = 0x60;  // IPv6
  EXPECT_FALSE(decode_ip_cm_header(pd));
  pd[1] = 0x40;
  pd[0] = 1;  // unknown CMA version
  EXPECT_FALSE(decode_ip_cm_header(pd));
  EXPECT_FALSE(decode_ip_cm_header(std::span(pd).first(35)));
}

}  // namespace
}  // namespace softrdma::cm
