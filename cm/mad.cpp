// CM MAD encode/decode (see mad.h for the sources of every offset).
#include "cm/mad.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace softrdma::cm {
namespace {

// ---- byte helpers: big-endian fields, and sub-byte fields counted from the byte's MSB ----

void put8(uint8_t* p, size_t off, uint8_t v) {
  p[off] = v;
}
void put16(uint8_t* p, size_t off, uint16_t v) {
  p[off] = uint8_t(v >> 8);
  p[off + 1] = uint8_t(v);
}
void put24(uint8_t* p, size_t off, uint32_t v) {
  p[off] = uint8_t(v >> 16);
  p[off + 1] = uint8_t(v >> 8);
  p[off + 2] = uint8_t(v);
}
void put32(uint8_t* p, size_t off, uint32_t v) {
  put16(p, off, uint16_t(v >> 16));
  put16(p, off + 2, uint16_t(v));
}
void put64(uint8_t* p, size_t off, uint64_t v) {
  put32(p, off, uint32_t(v >> 32));
  put32(p, off + 4, uint32_t(v));
}
/// Writes the `width` bits of byte `off` that start `bit` bits below its MSB.
void put_bits(uint8_t* p, size_t off, unsigned bit, unsigned width, unsigned v) {
  const unsigned shift = 8 - bit - width;
  const auto mask = uint8_t(((1u << width) - 1) << shift);
  p[off] = uint8_t((p[off] & ~mask) | ((v << shift) & mask));
}

uint8_t get8(const uint8_t* p, size_t off) {
  return p[off];
}
uint16_t get16(const uint8_t* p, size_t off) {
  return uint16_t(p[off] << 8 | p[off + 1]);
}
uint32_t get24(const uint8_t* p, size_t off) {
  return uint32_t(p[off]) << 16 | uint32_t(p[off + 1]) << 8 | p[off + 2];
}
uint32_t get32(const uint8_t* p, size_t off) {
  return uint32_t(get16(p, off)) << 16 | get16(p, off + 2);
}
uint64_t get64(const uint8_t* p, size_t off) {
  return uint64_t(get32(p, off)) << 32 | get32(p, off + 4);
}
unsigned get_bits(const uint8_t* p, size_t off, unsigned bit, unsigned width) {
  return (p[off] >> (8 - bit - width)) & ((1u << width) - 1);
}

template <size_t N>
void put_bytes(uint8_t* p, size_t off, const std::array<uint8_t, N>& a) {
  std::memcpy(p + off, a.data(), N);
}
template <size_t N>
void get_bytes(const uint8_t* p, size_t off, std::array<uint8_t, N>& a) {
  std::memcpy(a.data(), p + off, N);
}

// ---- one encode/decode pair per message; `d` points at the 232 bytes after the header ----

void encode_msg(uint8_t* d, const Req& m) {
  put32(d, 0, m.local_comm_id);
  put24(d, 5, m.vendor_id);
  put64(d, 8, m.service_id);
  put64(d, 16, m.local_ca_guid);
  put32(d, 28, m.local_qkey);
  put24(d, 32, m.local_qpn);
  put8(d, 35, m.responder_resources);
  put24(d, 36, m.local_eecn);
  put8(d, 39, m.initiator_depth);
  put24(d, 40, m.remote_eecn);
  put_bits(d, 43, 0, 5, m.remote_cm_response_timeout);
  put_bits(d, 43, 5, 2, unsigned(m.transport));
  put_bits(d, 43, 7, 1, m.flow_control);
  put24(d, 44, m.starting_psn);
  put_bits(d, 47, 0, 5, m.local_cm_response_timeout);
  put_bits(d, 47, 5, 3, m.retry_count);
  put16(d, 48, m.pkey);
  put_bits(d, 50, 0, 4, m.path_mtu);
  put_bits(d, 50, 4, 1, m.rdc_exists);
  put_bits(d, 50, 5, 3, m.rnr_retry_count);
  put_bits(d, 51, 0, 4, m.max_cm_retries);
  put_bits(d, 51, 4, 1, m.srq);
  put_bits(d, 51, 5, 3, m.extended_transport);
  const PathInfo& p = m.primary;
  put16(d, 52, p.local_lid);
  put16(d, 54, p.remote_lid);
  put_bytes(d, 56, p.local_gid);
  put_bytes(d, 72, p.remote_gid);
  put32(d, 88, (p.flow_label & 0xfffff) << 12);
  put_bits(d, 91, 2, 6, p.packet_rate);
  put8(d, 92, p.traffic_class);
  put8(d, 93, p.hop_limit);
  put_bits(d, 94, 0, 4, p.sl);
  put_bits(d, 94, 4, 1, p.subnet_local);
  put_bits(d, 95, 0, 5, p.local_ack_timeout);
  put_bytes(d, 140, m.private_data);
}
void decode_msg(const uint8_t* d, Req& m) {
  m.local_comm_id = get32(d, 0);
  m.vendor_id = get24(d, 5);
  m.service_id = get64(d, 8);
  m.local_ca_guid = get64(d, 16);
  m.local_qkey = get32(d, 28);
  m.local_qpn = get24(d, 32);
  m.responder_resources = get8(d, 35);
  m.local_eecn = get24(d, 36);
  m.initiator_depth = get8(d, 39);
  m.remote_eecn = get24(d, 40);
  m.remote_cm_response_timeout = uint8_t(get_bits(d, 43, 0, 5));
  m.transport = ReqTransport(get_bits(d, 43, 5, 2));
  m.flow_control = get_bits(d, 43, 7, 1);
  m.starting_psn = get24(d, 44);
  m.local_cm_response_timeout = uint8_t(get_bits(d, 47, 0, 5));
  m.retry_count = uint8_t(get_bits(d, 47, 5, 3));
  m.pkey = get16(d, 48);
  m.path_mtu = uint8_t(get_bits(d, 50, 0, 4));
  m.rdc_exists = get_bits(d, 50, 4, 1);
  m.rnr_retry_count = uint8_t(get_bits(d, 50, 5, 3));
  m.max_cm_retries = uint8_t(get_bits(d, 51, 0, 4));
  m.srq = get_bits(d, 51, 4, 1);
  m.extended_transport = uint8_t(get_bits(d, 51, 5, 3));
  PathInfo& p = m.primary;
  p.local_lid = get16(d, 52);
  p.remote_lid = get16(d, 54);
  get_bytes(d, 56, p.local_gid);
  get_bytes(d, 72, p.remote_gid);
  p.flow_label = get32(d, 88) >> 12;
  p.packet_rate = uint8_t(get_bits(d, 91, 2, 6));
  p.traffic_class = get8(d, 92);
  p.hop_limit = get8(d, 93);
  p.sl = uint8_t(get_bits(d, 94, 0, 4));
  p.subnet_local = get_bits(d, 94, 4, 1);
  p.local_ack_timeout = uint8_t(get_bits(d, 95, 0, 5));
  get_bytes(d, 140, m.private_data);
}

void encode_msg(uint8_t* d, const Mra& m) {
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put_bits(d, 8, 0, 2, unsigned(m.message));
  put_bits(d, 9, 0, 5, m.service_timeout);
  put_bytes(d, 10, m.private_data);
}
void decode_msg(const uint8_t* d, Mra& m) {
  m.local_comm_id = get32(d, 0);
  m.remote_comm_id = get32(d, 4);
  m.message = MessageRef(get_bits(d, 8, 0, 2));
  m.service_timeout = uint8_t(get_bits(d, 9, 0, 5));
  get_bytes(d, 10, m.private_data);
}

void encode_msg(uint8_t* d, const Rej& m) {
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put_bits(d, 8, 0, 2, unsigned(m.message));
  put_bits(d, 9, 0, 7, m.reject_info_length);
  put16(d, 10, m.reason);
  put_bytes(d, 12, m.ari);
  put_bytes(d, 84, m.private_data);
}
void decode_msg(const uint8_t* d, Rej& m) {
  m.local_comm_id = get32(d, 0);
  m.remote_comm_id = get32(d, 4);
  m.message = MessageRef(get_bits(d, 8, 0, 2));
  m.reject_info_length = uint8_t(get_bits(d, 9, 0, 7));
  m.reason = get16(d, 10);
  get_bytes(d, 12, m.ari);
  get_bytes(d, 84, m.private_data);
}

void encode_msg(uint8_t* d, const Rep& m) {
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put32(d, 8, m.local_qkey);
  put24(d, 12, m.local_qpn);
  put8(d, 15, uint8_t(m.vendor_id >> 16));
  put24(d, 16, m.local_eecn);
  put8(d, 19, uint8_t(m.vendor_id >> 8));
  put24(d, 20, m.starting_psn);
  put8(d, 23, uint8_t(m.vendor_id));
  put8(d, 24, m.responder_resources);
  put8(d, 25, m.initiator_depth);
  put_bits(d, 26, 0, 5, m.target_ack_delay);
  put_bits(d, 26, 5, 2, m.failover_accepted);
  put_bits(d, 26, 7, 1, m.flow_control);
  put_bits(d, 27, 0, 3, m.rnr_retry_count);
  put_bits(d, 27, 3, 1, m.srq);
  put64(d, 28, m.local_ca_guid);
  put_bytes(d, 36, m.private_data);
}
void decode_msg(const uint8_t* d, Rep& m) {
  m.local_comm_id = get32(d, 0);
  m.remote_comm_id = get32(d, 4);
  m.local_qkey = get32(d, 8);
  m.local_qpn = get24(d, 12);
  m.local_eecn = get24(d, 16);
  m.starting_psn = get24(d, 20);
  m.vendor_id = uint32_t(get8(d, 15)) << 16 | uint32_t(get8(d, 19)) << 8 | get8(d, 23);
  m.responder_resources = get8(d, 24);
  m.initiator_depth = get8(d, 25);
  m.target_ack_delay = uint8_t(get_bits(d, 26, 0, 5));
  m.failover_accepted = uint8_t(get_bits(d, 26, 5, 2));
  m.flow_control = get_bits(d, 26, 7, 1);
  m.rnr_retry_count = uint8_t(get_bits(d, 27, 0, 3));
  m.srq = get_bits(d, 27, 3, 1);
  m.local_ca_guid = get64(d, 28);
  get_bytes(d, 36, m.private_data);
}

void encode_msg(uint8_t* d, const Rtu& m) {
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put_bytes(d, 8, m.private_data);
}
void decode_msg(const uint8_t* d, Rtu& m) {
  m.local_comm_id = get32(d, 0);
  m.remote_comm_id = get32(d, 4);
  get_bytes(d, 8, m.private_data);
}

void encode_msg(uint8_t* d, const Dreq& m) {
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put24(d, 8, m.remote_qpn);
  put_bytes(d, 12, m.private_data);
}
void decode_msg(const uint8_t* d, Dreq& m) {
  m.local_comm_id = get32(d, 0);
  m.remote_comm_id = get32(d, 4);
  m.remote_qpn = get24(d, 8);
  get_bytes(d, 12, m.private_data);
}

void encode_msg(uint8_t* d, const Drep& m) {
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put_bytes(d, 8, m.private_data);
}
void decode_msg(const uint8_t* d, Drep& m) {
  m.local_comm_id = get32(d, 0);
  m.remote_comm_id = get32(d, 4);
  get_bytes(d, 8, m.private_data);
}

void encode_msg(uint8_t* d, const SidrReq& m) {
  put32(d, 0, m.request_id);
  put16(d, 4, m.pkey);
  put64(d, 8, m.service_id);
  put_bytes(d, 16, m.private_data);
}
void decode_msg(const uint8_t* d, SidrReq& m) {
  m.request_id = get32(d, 0);
  m.pkey = get16(d, 4);
  m.service_id = get64(d, 8);
  get_bytes(d, 16, m.private_data);
}

void encode_msg(uint8_t* d, const SidrRep& m) {
  put32(d, 0, m.request_id);
  put8(d, 4, uint8_t(m.status));
  put8(d, 5, m.additional_info_length);
  put16(d, 6, uint16_t(m.vendor_id >> 8));
  put24(d, 8, m.qpn);
  put8(d, 11, uint8_t(m.vendor_id));
  put64(d, 12, m.service_id);
  put32(d, 20, m.qkey);
  put_bytes(d, 24, m.additional_info);
  put_bytes(d, 96, m.private_data);
}
void decode_msg(const uint8_t* d, SidrRep& m) {
  m.request_id = get32(d, 0);
  m.status = SidrStatus(get8(d, 4));
  m.additional_info_length = get8(d, 5);
  m.vendor_id = uint32_t(get16(d, 6)) << 8 | get8(d, 11);
  m.qpn = get24(d, 8);
  m.service_id = get64(d, 12);
  m.qkey = get32(d, 20);
  get_bytes(d, 24, m.additional_info);
  get_bytes(d, 96, m.private_data);
}

template <class T>
CmMessage decode_as(const uint8_t* d) {
  T m;
  decode_msg(d, m);
  return m;
}

// Compile-time checks that each message's last field ends at the 232nd byte.
static_assert(140 + kReqPrivateBytes == kMadBytes - kMadHeaderBytes);
static_assert(10 + kMraPrivateBytes == kMadBytes - kMadHeaderBytes);
static_assert(84 + kRejPrivateBytes == kMadBytes - kMadHeaderBytes);
static_assert(36 + kRepPrivateBytes == kMadBytes - kMadHeaderBytes);
static_assert(8 + kRtuPrivateBytes == kMadBytes - kMadHeaderBytes);
static_assert(12 + kDreqPrivateBytes == kMadBytes - kMadHeaderBytes);
static_assert(8 + kDrepPrivateBytes == kMadBytes - kMadHeaderBytes);
static_assert(16 + kSidrReqPrivateBytes == kMadBytes - kMadHeaderBytes);
static_assert(96 + kSidrRepPrivateBytes == kMadBytes - kMadHeaderBytes);

}  // namespace

const char* to_string(MadError e) {
  switch (e) {
    case MadError::kTooShort:
      return "too short";
    case MadError::kBadBaseVersion:
      return "bad base version";
    case MadError::kNotCm:
      return "not a CM MAD";
    case MadError::kBadClassVersion:
      return "bad CM class version";
    case MadError::kBadMethod:
      return "method not ComMgtSend";
    case MadError::kUnknownAttribute:
      return "unknown attribute";
  }
  return "?";
}

AttrId attr_id_of(const CmMessage& m) {
  static constexpr AttrId kIds[] = {AttrId::kReq,  AttrId::kMra,     AttrId::kRej,
                                    AttrId::kRep,  AttrId::kRtu,     AttrId::kDreq,
                                    AttrId::kDrep, AttrId::kSidrReq, AttrId::kSidrRep};
  static_assert(std::size(kIds) == std::variant_size_v<CmMessage>);
  return kIds[m.index()];
}

const char* attr_name(uint16_t attr_id) {
  switch (AttrId(attr_id)) {
    case AttrId::kClassPortInfo:
      return "ClassPortInfo";
    case AttrId::kReq:
      return "REQ";
    case AttrId::kMra:
      return "MRA";
    case AttrId::kRej:
      return "REJ";
    case AttrId::kRep:
      return "REP";
    case AttrId::kRtu:
      return "RTU";
    case AttrId::kDreq:
      return "DREQ";
    case AttrId::kDrep:
      return "DREP";
    case AttrId::kSidrReq:
      return "SIDR_REQ";
    case AttrId::kSidrRep:
      return "SIDR_REP";
    case AttrId::kLap:
      return "LAP";
    case AttrId::kApr:
      return "APR";
  }
  return "unknown";
}

const char* message_name(const CmMessage& m) {
  return attr_name(uint16_t(attr_id_of(m)));
}

std::array<uint8_t, kMadBytes> encode(const MadHeader& h, const CmMessage& message) {
  std::array<uint8_t, kMadBytes> out{};
  uint8_t* p = out.data();
  put8(p, 0, h.base_version);
  put8(p, 1, h.mgmt_class);
  put8(p, 2, h.class_version);
  put8(p, 3, h.method);
  put16(p, 4, h.status);
  put16(p, 6, h.class_specific);
  put64(p, 8, h.transaction_id);
  put16(p, 16, uint16_t(attr_id_of(message)));
  put32(p, 20, h.attr_mod);
  std::visit([&](const auto& m) { encode_msg(p + kMadHeaderBytes, m); }, message);
  return out;
}

DecodeResult decode(std::span<const uint8_t> bytes) {
  DecodeResult r;
  if (bytes.size() < kMadBytes) {
    r.error = MadError::kTooShort;
    return r;
  }
  const uint8_t* p = bytes.data();
  MadHeader h;
  h.base_version = get8(p, 0);
  h.mgmt_class = get8(p, 1);
  h.class_version = get8(p, 2);
  h.method = get8(p, 3);
  h.status = get16(p, 4);
  h.class_specific = get16(p, 6);
  h.transaction_id = get64(p, 8);
  h.attr_id = get16(p, 16);
  h.attr_mod = get32(p, 20);
  if (h.base_version != kMadBaseVersion) {
    r.error = MadError::kBadBaseVersion;
    return r;
  }
  if (h.mgmt_class != kMgmtClassCm) {
    r.error = MadError::kNotCm;
    return r;
  }
  if (h.class_version != kCmClassVersion) {
    r.error = MadError::kBadClassVersion;
    return r;
  }
  if (h.method != kMethodSend) {
    r.error = MadError::kBadMethod;
    return r;
  }
  const uint8_t* d = p + kMadHeaderBytes;
  CmMessage m;
  switch (AttrId(h.attr_id)) {
    case AttrId::kReq:
      m = decode_as<Req>(d);
      break;
    case AttrId::kMra:
      m = decode_as<Mra>(d);
      break;
    case AttrId::kRej:
      m = decode_as<Rej>(d);
      break;
    case AttrId::kRep:
      m = decode_as<Rep>(d);
      break;
    case AttrId::kRtu:
      m = decode_as<Rtu>(d);
      break;
    case AttrId::kDreq:
      m = decode_as<Dreq>(d);
      break;
    case AttrId::kDrep:
      m = decode_as<Drep>(d);
      break;
    case AttrId::kSidrReq:
      m = decode_as<SidrReq>(d);
      break;
    case AttrId::kSidrRep:
      m = decode_as<SidrRep>(d);
      break;
    default:
      r.error = MadError::kUnknownAttribute;
      return r;
  }
  r.mad = Mad{h, std::move(m)};
  return r;
}

void encode_ip_cm_header(const IpCmHeader& h, std::span<uint8_t> out) {
  uint8_t* p = out.data();
  std::memset(p, 0, kIpCmHeaderBytes);
  put8(p, 0, h.cm_version);
  put8(p, 1, uint8_t(h.ip_version << 4));
  put16(p, 2, h.src_port);
  put32(p, 4 + 12, h.src_ip);
  put32(p, 20 + 12, h.dst_ip);
}

std::optional<IpCmHeader> decode_ip_cm_header(std::span<const uint8_t> in) {
  if (in.size() < kIpCmHeaderBytes) return std::nullopt;
  const uint8_t* p = in.data();
  IpCmHeader h;
  h.cm_version = get8(p, 0);
  h.ip_version = uint8_t(get8(p, 1) >> 4);
  h.src_port = get16(p, 2);
  h.src_ip = get32(p, 4 + 12);
  h.dst_ip = get32(p, 20 + 12);
  if (h.cm_version != 0 || h.ip_version != 4) return std::nullopt;
  return h;
}

}  // namespace softrdma::cm
