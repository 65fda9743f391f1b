// CM MAD encode/decode (see mad.h for the sources of every offset). Each message's fields
// are stated once, in one table per message (as Linux's include/rdma/ibta_vol1_c12.h does
// with IBA_FIELD*_LOC); encode, decode and field_layout() all walk that table.
#include "cm/mad.h"

#include <concepts>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace softrdma::cm {
namespace {

// ---- one field, anywhere: big-endian, `bit` bits below the MSB of byte `byte` ----

constexpr uint64_t low_bits(unsigned width) {
  return width >= 64 ? ~uint64_t{0} : (uint64_t{1} << width) - 1;
}

/// The field's value (integer fields only: bit + width <= 64).
uint64_t get_field(const uint8_t* p, const FieldLayout& f) {
  const unsigned n = (f.bit + f.width + 7) / 8;
  uint64_t w = 0;
  for (unsigned i = 0; i < n; ++i) w = w << 8 | p[f.byte + i];
  return (w >> (n * 8 - f.bit - f.width)) & low_bits(f.width);
}

/// Writes the low `width` bits of `v` into the field, leaving the bits around it as they are.
void put_field(uint8_t* p, const FieldLayout& f, uint64_t v) {
  const unsigned n = (f.bit + f.width + 7) / 8;
  const unsigned tail = n * 8 - f.bit - f.width;
  uint64_t w = 0;
  for (unsigned i = 0; i < n; ++i) w = w << 8 | p[f.byte + i];
  const uint64_t mask = low_bits(f.width) << tail;
  w = (w & ~mask) | ((v << tail) & mask);
  for (unsigned i = n; i-- > 0; w >>= 8) p[f.byte + i] = uint8_t(w);
}

template <class T>
inline constexpr bool kIsByteArray = false;
template <size_t N>
inline constexpr bool kIsByteArray<std::array<uint8_t, N>> = true;

template <class T>
uint64_t to_u64(T v) {
  if constexpr (std::is_enum_v<T>)
    return uint64_t(static_cast<std::underlying_type_t<T>>(v));
  else
    return uint64_t(v);
}
template <class T>
T from_u64(uint64_t v) {
  if constexpr (std::is_enum_v<T>)
    return T(static_cast<std::underlying_type_t<T>>(v));
  else if constexpr (std::is_same_v<T, bool>)
    return v != 0;
  else
    return T(v);
}

/// Encodes each field the table names (a field with a shift holds `member >> shift`).
struct Writer {
  uint8_t* d;
  template <class T>
  void operator()(const FieldLayout& f, const T& v) const {
    if constexpr (kIsByteArray<T>)
      std::memcpy(d + f.byte, v.data(), v.size());
    else
      put_field(d, f, to_u64(v) >> f.shift);
  }
};

/// Decodes each field the table names into its member (or into its bits `shift` and up).
struct Reader {
  const uint8_t* d;
  template <class T>
  void operator()(const FieldLayout& f, T& v) const {
    if constexpr (kIsByteArray<T>) {
      std::memcpy(v.data(), d + f.byte, v.size());
    } else {
      const uint64_t mask = low_bits(f.width) << f.shift;
      v = from_u64<T>((to_u64(v) & ~mask) | (get_field(d, f) << f.shift));
    }
  }
};

/// Lists the table (and checks that every byte array's width is its member's).
struct Collector {
  std::vector<FieldLayout>* out;
  template <class T>
  void operator()(const FieldLayout& f, const T& v) const {
    if constexpr (kIsByteArray<T>) {
      if (f.width != v.size() * 8 || f.bit != 0)
        throw std::logic_error(std::string("CM field table: ") + std::string(f.name) +
                               "'s width is not its member's");
    }
    out->push_back(f);
  }
};

template <class T, class M>
concept MessageOf = std::same_as<std::remove_const_t<T>, M>;

// ---- the field tables: each field of each message once, in the spec's order ----
// `field(layout, member)` is called once per field; encode, decode and field_layout() are
// the three visitors above. Byte offsets count from the end of the MAD header.

/// The common MAD header (IBTA 13.4.2, figure 145); offsets from the start of the MAD.
void fields(MessageOf<MadHeader> auto& h, auto&& field) {
  field(FieldLayout{"base_version", 0, 0, 8}, h.base_version);
  field(FieldLayout{"mgmt_class", 1, 0, 8}, h.mgmt_class);
  field(FieldLayout{"class_version", 2, 0, 8}, h.class_version);
  field(FieldLayout{"method", 3, 0, 8}, h.method);
  field(FieldLayout{"status", 4, 0, 16}, h.status);
  field(FieldLayout{"class_specific", 6, 0, 16}, h.class_specific);
  field(FieldLayout{"transaction_id", 8, 0, 64}, h.transaction_id);
  field(FieldLayout{"attr_id", 16, 0, 16}, h.attr_id);
  field(FieldLayout{"attr_mod", 20, 0, 32}, h.attr_mod);
}

/// REQ (IBTA 12.6.5, table 106; the vendor ID as Linux's ECE, bytes 5–7).
void fields(MessageOf<Req> auto& m, auto&& field) {
  field(FieldLayout{"local_comm_id", 0, 0, 32}, m.local_comm_id);
  field(FieldLayout{"vendor_id", 5, 0, 24}, m.vendor_id);
  field(FieldLayout{"service_id", 8, 0, 64}, m.service_id);
  field(FieldLayout{"local_ca_guid", 16, 0, 64}, m.local_ca_guid);
  field(FieldLayout{"local_qkey", 28, 0, 32}, m.local_qkey);
  field(FieldLayout{"local_qpn", 32, 0, 24}, m.local_qpn);
  field(FieldLayout{"responder_resources", 35, 0, 8}, m.responder_resources);
  field(FieldLayout{"local_eecn", 36, 0, 24}, m.local_eecn);
  field(FieldLayout{"initiator_depth", 39, 0, 8}, m.initiator_depth);
  field(FieldLayout{"remote_eecn", 40, 0, 24}, m.remote_eecn);
  field(FieldLayout{"remote_cm_response_timeout", 43, 0, 5}, m.remote_cm_response_timeout);
  field(FieldLayout{"transport", 43, 5, 2}, m.transport);
  field(FieldLayout{"flow_control", 43, 7, 1}, m.flow_control);
  field(FieldLayout{"starting_psn", 44, 0, 24}, m.starting_psn);
  field(FieldLayout{"local_cm_response_timeout", 47, 0, 5}, m.local_cm_response_timeout);
  field(FieldLayout{"retry_count", 47, 5, 3}, m.retry_count);
  field(FieldLayout{"pkey", 48, 0, 16}, m.pkey);
  field(FieldLayout{"path_mtu", 50, 0, 4}, m.path_mtu);
  field(FieldLayout{"rdc_exists", 50, 4, 1}, m.rdc_exists);
  field(FieldLayout{"rnr_retry_count", 50, 5, 3}, m.rnr_retry_count);
  field(FieldLayout{"max_cm_retries", 51, 0, 4}, m.max_cm_retries);
  field(FieldLayout{"srq", 51, 4, 1}, m.srq);
  field(FieldLayout{"extended_transport", 51, 5, 3}, m.extended_transport);
  auto& p = m.primary;
  field(FieldLayout{"primary.local_lid", 52, 0, 16}, p.local_lid);
  field(FieldLayout{"primary.remote_lid", 54, 0, 16}, p.remote_lid);
  field(FieldLayout{"primary.local_gid", 56, 0, 128}, p.local_gid);
  field(FieldLayout{"primary.remote_gid", 72, 0, 128}, p.remote_gid);
  field(FieldLayout{"primary.flow_label", 88, 0, 20}, p.flow_label);
  field(FieldLayout{"primary.packet_rate", 91, 2, 6}, p.packet_rate);
  field(FieldLayout{"primary.traffic_class", 92, 0, 8}, p.traffic_class);
  field(FieldLayout{"primary.hop_limit", 93, 0, 8}, p.hop_limit);
  field(FieldLayout{"primary.sl", 94, 0, 4}, p.sl);
  field(FieldLayout{"primary.subnet_local", 94, 4, 1}, p.subnet_local);
  field(FieldLayout{"primary.local_ack_timeout", 95, 0, 5}, p.local_ack_timeout);
  field(FieldLayout{"private_data", 140, 0, kReqPrivateBytes * 8}, m.private_data);
}

/// MRA (IBTA 12.6.6, table 107).
void fields(MessageOf<Mra> auto& m, auto&& field) {
  field(FieldLayout{"local_comm_id", 0, 0, 32}, m.local_comm_id);
  field(FieldLayout{"remote_comm_id", 4, 0, 32}, m.remote_comm_id);
  field(FieldLayout{"message", 8, 0, 2}, m.message);
  field(FieldLayout{"service_timeout", 9, 0, 5}, m.service_timeout);
  field(FieldLayout{"private_data", 10, 0, kMraPrivateBytes * 8}, m.private_data);
}

/// REJ (IBTA 12.6.7, table 108).
void fields(MessageOf<Rej> auto& m, auto&& field) {
  field(FieldLayout{"local_comm_id", 0, 0, 32}, m.local_comm_id);
  field(FieldLayout{"remote_comm_id", 4, 0, 32}, m.remote_comm_id);
  field(FieldLayout{"message", 8, 0, 2}, m.message);
  field(FieldLayout{"reject_info_length", 9, 0, 7}, m.reject_info_length);
  field(FieldLayout{"reason", 10, 0, 16}, m.reason);
  field(FieldLayout{"ari", 12, 0, kRejAriBytes * 8}, m.ari);
  field(FieldLayout{"private_data", 84, 0, kRejPrivateBytes * 8}, m.private_data);
}

/// REP (IBTA 12.6.8, table 110; the vendor ID as Linux's ECE, bytes 15, 19 and 23).
void fields(MessageOf<Rep> auto& m, auto&& field) {
  field(FieldLayout{"local_comm_id", 0, 0, 32}, m.local_comm_id);
  field(FieldLayout{"remote_comm_id", 4, 0, 32}, m.remote_comm_id);
  field(FieldLayout{"local_qkey", 8, 0, 32}, m.local_qkey);
  field(FieldLayout{"local_qpn", 12, 0, 24}, m.local_qpn);
  field(FieldLayout{"vendor_id_h", 15, 0, 8, 16}, m.vendor_id);
  field(FieldLayout{"local_eecn", 16, 0, 24}, m.local_eecn);
  field(FieldLayout{"vendor_id_m", 19, 0, 8, 8}, m.vendor_id);
  field(FieldLayout{"starting_psn", 20, 0, 24}, m.starting_psn);
  field(FieldLayout{"vendor_id_l", 23, 0, 8}, m.vendor_id);
  field(FieldLayout{"responder_resources", 24, 0, 8}, m.responder_resources);
  field(FieldLayout{"initiator_depth", 25, 0, 8}, m.initiator_depth);
  field(FieldLayout{"target_ack_delay", 26, 0, 5}, m.target_ack_delay);
  field(FieldLayout{"failover_accepted", 26, 5, 2}, m.failover_accepted);
  field(FieldLayout{"flow_control", 26, 7, 1}, m.flow_control);
  field(FieldLayout{"rnr_retry_count", 27, 0, 3}, m.rnr_retry_count);
  field(FieldLayout{"srq", 27, 3, 1}, m.srq);
  field(FieldLayout{"local_ca_guid", 28, 0, 64}, m.local_ca_guid);
  field(FieldLayout{"private_data", 36, 0, kRepPrivateBytes * 8}, m.private_data);
}

/// RTU (IBTA 12.6.9, table 111).
void fields(MessageOf<Rtu> auto& m, auto&& field) {
  field(FieldLayout{"local_comm_id", 0, 0, 32}, m.local_comm_id);
  field(FieldLayout{"remote_comm_id", 4, 0, 32}, m.remote_comm_id);
  field(FieldLayout{"private_data", 8, 0, kRtuPrivateBytes * 8}, m.private_data);
}

/// DREQ (IBTA 12.6.10, table 112).
void fields(MessageOf<Dreq> auto& m, auto&& field) {
  field(FieldLayout{"local_comm_id", 0, 0, 32}, m.local_comm_id);
  field(FieldLayout{"remote_comm_id", 4, 0, 32}, m.remote_comm_id);
  field(FieldLayout{"remote_qpn", 8, 0, 24}, m.remote_qpn);
  field(FieldLayout{"private_data", 12, 0, kDreqPrivateBytes * 8}, m.private_data);
}

/// DREP (IBTA 12.6.11, table 113).
void fields(MessageOf<Drep> auto& m, auto&& field) {
  field(FieldLayout{"local_comm_id", 0, 0, 32}, m.local_comm_id);
  field(FieldLayout{"remote_comm_id", 4, 0, 32}, m.remote_comm_id);
  field(FieldLayout{"private_data", 8, 0, kDrepPrivateBytes * 8}, m.private_data);
}

/// SIDR_REQ (IBTA 12.11.1, table 119).
void fields(MessageOf<SidrReq> auto& m, auto&& field) {
  field(FieldLayout{"request_id", 0, 0, 32}, m.request_id);
  field(FieldLayout{"pkey", 4, 0, 16}, m.pkey);
  field(FieldLayout{"service_id", 8, 0, 64}, m.service_id);
  field(FieldLayout{"private_data", 16, 0, kSidrReqPrivateBytes * 8}, m.private_data);
}

/// SIDR_REP (IBTA 12.11.2, table 120; the vendor ID as Linux's ECE, bytes 6, 7 and 11).
void fields(MessageOf<SidrRep> auto& m, auto&& field) {
  field(FieldLayout{"request_id", 0, 0, 32}, m.request_id);
  field(FieldLayout{"status", 4, 0, 8}, m.status);
  field(FieldLayout{"additional_info_length", 5, 0, 8}, m.additional_info_length);
  field(FieldLayout{"vendor_id_hm", 6, 0, 16, 8}, m.vendor_id);
  field(FieldLayout{"qpn", 8, 0, 24}, m.qpn);
  field(FieldLayout{"vendor_id_l", 11, 0, 8}, m.vendor_id);
  field(FieldLayout{"service_id", 12, 0, 64}, m.service_id);
  field(FieldLayout{"qkey", 20, 0, 32}, m.qkey);
  field(FieldLayout{"additional_info", 24, 0, kSidrRepInfoBytes * 8}, m.additional_info);
  field(FieldLayout{"private_data", 96, 0, kSidrRepPrivateBytes * 8}, m.private_data);
}

/// The RDMA IP CM Service header (IBTA annex A11.6, table 3); IPv4 addresses in the last 4
/// bytes of their 16.
void fields(MessageOf<IpCmHeader> auto& h, auto&& field) {
  field(FieldLayout{"cm_version", 0, 0, 8}, h.cm_version);
  field(FieldLayout{"ip_version", 1, 0, 4}, h.ip_version);
  field(FieldLayout{"src_port", 2, 0, 16}, h.src_port);
  field(FieldLayout{"src_ip", 4 + 12, 0, 32}, h.src_ip);
  field(FieldLayout{"dst_ip", 20 + 12, 0, 32}, h.dst_ip);
}

/// The attribute ID of each CmMessage alternative, in the variant's order.
constexpr AttrId kAttrIds[] = {AttrId::kReq,  AttrId::kMra,     AttrId::kRej,
                               AttrId::kRep,  AttrId::kRtu,     AttrId::kDreq,
                               AttrId::kDrep, AttrId::kSidrReq, AttrId::kSidrRep};
static_assert(std::size(kAttrIds) == std::variant_size_v<CmMessage>);

/// Calls `f(T{})` for the CmMessage alternative T whose attribute ID is `id`; false if none.
template <size_t I = 0, class F>
bool with_message_type(uint16_t id, F&& f) {
  if constexpr (I == std::variant_size_v<CmMessage>) {
    return false;
  } else {
    if (id == uint16_t(kAttrIds[I])) {
      f(std::variant_alternative_t<I, CmMessage>{});
      return true;
    }
    return with_message_type<I + 1>(id, f);
  }
}

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
  return kAttrIds[m.index()];
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

std::array<uint8_t, kMadBytes> encode(const MadHeader& header, const CmMessage& message) {
  std::array<uint8_t, kMadBytes> out{};
  MadHeader h = header;
  h.attr_id = uint16_t(attr_id_of(message));
  fields(h, Writer{out.data()});
  std::visit([&](const auto& m) { fields(m, Writer{out.data() + kMadHeaderBytes}); }, message);
  return out;
}

DecodeResult decode(std::span<const uint8_t> bytes) {
  DecodeResult r;
  if (bytes.size() < kMadBytes) {
    r.error = MadError::kTooShort;
    return r;
  }
  MadHeader h;
  fields(h, Reader{bytes.data()});
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
  CmMessage m;
  const bool known = with_message_type(h.attr_id, [&](auto t) {
    fields(t, Reader{bytes.data() + kMadHeaderBytes});
    m = t;
  });
  if (!known) {
    r.error = MadError::kUnknownAttribute;
    return r;
  }
  r.mad = Mad{h, std::move(m)};
  return r;
}

std::vector<FieldLayout> field_layout(AttrId id) {
  std::vector<FieldLayout> out;
  with_message_type(uint16_t(id), [&](auto t) { fields(t, Collector{&out}); });
  return out;
}

std::vector<FieldLayout> mad_header_layout() {
  std::vector<FieldLayout> out;
  MadHeader h;
  fields(h, Collector{&out});
  return out;
}

std::vector<FieldLayout> ip_cm_header_layout() {
  std::vector<FieldLayout> out;
  IpCmHeader h;
  fields(h, Collector{&out});
  return out;
}

void encode_ip_cm_header(const IpCmHeader& h, std::span<uint8_t> out) {
  std::memset(out.data(), 0, kIpCmHeaderBytes);
  fields(h, Writer{out.data()});
}

std::optional<IpCmHeader> decode_ip_cm_header(std::span<const uint8_t> in) {
  if (in.size() < kIpCmHeaderBytes) return std::nullopt;
  IpCmHeader h;
  fields(h, Reader{in.data()});
  if (h.cm_version != 0 || h.ip_version != 4) return std::nullopt;
  return h;
}

}  // namespace softrdma::cm
