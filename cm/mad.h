// Communication Management MADs: the common MAD header and the CM messages REQ, MRA, REJ,
// REP, RTU, DREQ, DREP, SIDR_REQ and SIDR_REP, as value types with pure encode/decode.
//
// Sources: IBTA InfiniBand Architecture Specification vol. 1 rel. 1.4 — 13.4.2 (common MAD
// header), 16.7 (the CM management class, attribute IDs), 12.6 (message layouts: table 106
// REQ, 107 MRA, 108 REJ, 110 REP, 111 RTU, 112 DREQ, 113 DREP, 119 SIDR_REQ, 120 SIDR_REP;
// 12.6.7.2 reject reasons), 12.7 (SIDR status). The byte and bit positions below are the
// spec's (also Linux's include/rdma/ibta_vol1_c12.h): offsets count from the end of the
// 24-byte MAD header, bits count from the most significant bit of the byte named.
//
// A MAD is always 256 bytes (the GSI, QP1, carries nothing else). Every private data field is
// carried whole: a receiver cannot tell how much of it its sender used, so the decoded
// messages hold the full arrays (as the kernel reports them).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace softrdma::cm {

/// Size of every MAD (IBTA 13.4.1).
inline constexpr size_t kMadBytes = 256;
/// The common MAD header (IBTA 13.4.2).
inline constexpr size_t kMadHeaderBytes = 24;
/// QPN and Q_Key of the General Services Interface (IBTA 13.5.1, 10.2.4.3).
inline constexpr uint32_t kGsiQpn = 1;
inline constexpr uint32_t kGsiQkey = 0x80010000;
/// Management class of the Communication Manager and the class version of IBTA 1.2+.
inline constexpr uint8_t kMgmtClassCm = 0x07;
inline constexpr uint8_t kCmClassVersion = 2;
inline constexpr uint8_t kMadBaseVersion = 1;
/// ComMgtSend(): the one method every CM message uses (IBTA 16.7.1).
inline constexpr uint8_t kMethodSend = 0x03;

/// Private data bytes each message carries (IBTA 12.6, the tables above).
inline constexpr size_t kReqPrivateBytes = 92;
inline constexpr size_t kMraPrivateBytes = 222;
inline constexpr size_t kRejPrivateBytes = 148;
inline constexpr size_t kRejAriBytes = 72;
inline constexpr size_t kRepPrivateBytes = 196;
inline constexpr size_t kRtuPrivateBytes = 224;
inline constexpr size_t kDreqPrivateBytes = 220;
inline constexpr size_t kDrepPrivateBytes = 224;
inline constexpr size_t kSidrReqPrivateBytes = 216;
inline constexpr size_t kSidrRepPrivateBytes = 136;
inline constexpr size_t kSidrRepInfoBytes = 72;

/// CM attribute IDs (IBTA 16.7.2, table 200).
enum class AttrId : uint16_t {
  kClassPortInfo = 0x0001,
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
  kLap = 0x0019,
  kApr = 0x001a,
};

/// Transport service type of a REQ (IBTA 12.6.5: 0 RC, 1 UC, 3 with the extended type: XRC).
enum class ReqTransport : uint8_t { kRc = 0, kUc = 1, kRd = 2, kExtended = 3 };
/// Extended transport type of a REQ whose transport is kExtended (1 = XRC).
inline constexpr uint8_t kExtendedTransportXrc = 1;

/// Which message a REJ or MRA is about (IBTA 12.6.7, "Message REJected" / "Message MRAed").
enum class MessageRef : uint8_t { kReq = 0, kRep = 1, kOther = 2 };

/// REJ reasons used here (IBTA 12.6.7.2, table 109).
enum class RejReason : uint16_t {
  kNoQp = 1,
  kNoResources = 3,
  kTimeout = 4,
  kInvalidCommId = 6,
  kInvalidServiceId = 8,
  kInvalidTransportType = 9,
  kStaleConn = 10,
  kConsumerDefined = 28,
  kVendorOptionNotSupported = 35,
};

/// SIDR_REP status (IBTA 12.7, table 121).
enum class SidrStatus : uint8_t {
  kSuccess = 0,
  kUnsupported = 1,  ///< service ID not supported (nobody listens)
  kReject = 2,
  kNoQp = 3,
  kRedirect = 4,
  kUnsupportedVersion = 5,
};

/// The common MAD header (IBTA 13.4.2), host-order values.
struct MadHeader {
  uint8_t base_version = kMadBaseVersion;
  uint8_t mgmt_class = kMgmtClassCm;
  uint8_t class_version = kCmClassVersion;
  uint8_t method = kMethodSend;
  uint16_t status = 0;
  uint16_t class_specific = 0;
  uint64_t transaction_id = 0;
  uint16_t attr_id = 0;
  uint32_t attr_mod = 0;
};

/// A REQ's primary path (the alternate path is never used: no APM).
struct PathInfo {
  uint16_t local_lid = 0xffff;   ///< permissive on RoCE (routed: hop limit > 1)
  uint16_t remote_lid = 0xffff;  ///< permissive on RoCE
  std::array<uint8_t, 16> local_gid{};
  std::array<uint8_t, 16> remote_gid{};
  uint32_t flow_label = 0;  ///< 20 bits
  uint8_t packet_rate = 0;  ///< 6 bits, IB rate enum
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint8_t sl = 0;  ///< 4 bits
  bool subnet_local = false;
  uint8_t local_ack_timeout = 0;  ///< 5 bits, 4.096 µs · 2^n
};

/// REQ (IBTA 12.6.5, table 106).
struct Req {
  uint32_t local_comm_id = 0;
  uint32_t vendor_id = 0;  ///< 24 bits (ECE, bytes 5–7)
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;  ///< 24 bits
  uint8_t responder_resources = 0;
  uint32_t local_eecn = 0;  ///< 24 bits
  uint8_t initiator_depth = 0;
  uint32_t remote_eecn = 0;                ///< 24 bits
  uint8_t remote_cm_response_timeout = 0;  ///< 5 bits, 4.096 µs · 2^n
  ReqTransport transport = ReqTransport::kRc;
  bool flow_control = false;
  uint32_t starting_psn = 0;              ///< 24 bits
  uint8_t local_cm_response_timeout = 0;  ///< 5 bits
  uint8_t retry_count = 0;                ///< 3 bits
  uint16_t pkey = 0xffff;
  uint8_t path_mtu = 0;  ///< 4 bits, IB MTU enum (1 = 256 … 5 = 4096)
  bool rdc_exists = false;
  uint8_t rnr_retry_count = 0;  ///< 3 bits
  uint8_t max_cm_retries = 0;   ///< 4 bits
  bool srq = false;
  uint8_t extended_transport = 0;  ///< 3 bits
  PathInfo primary;
  std::array<uint8_t, kReqPrivateBytes> private_data{};
};

/// MRA (IBTA 12.6.6, table 107).
struct Mra {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  MessageRef message = MessageRef::kReq;
  uint8_t service_timeout = 0;  ///< 5 bits
  std::array<uint8_t, kMraPrivateBytes> private_data{};
};

/// REJ (IBTA 12.6.7, table 108).
struct Rej {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  MessageRef message = MessageRef::kReq;
  uint8_t reject_info_length = 0;  ///< 7 bits
  uint16_t reason = 0;
  std::array<uint8_t, kRejAriBytes> ari{};
  std::array<uint8_t, kRejPrivateBytes> private_data{};
};

/// REP (IBTA 12.6.8, table 110).
struct Rep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;     ///< 24 bits
  uint32_t local_eecn = 0;    ///< 24 bits
  uint32_t starting_psn = 0;  ///< 24 bits
  uint32_t vendor_id = 0;     ///< 24 bits (ECE: bytes 15, 19, 23)
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;   ///< 5 bits
  uint8_t failover_accepted = 0;  ///< 2 bits
  bool flow_control = false;
  uint8_t rnr_retry_count = 0;  ///< 3 bits
  bool srq = false;
  uint64_t local_ca_guid = 0;
  std::array<uint8_t, kRepPrivateBytes> private_data{};
};

/// RTU (IBTA 12.6.9, table 111).
struct Rtu {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kRtuPrivateBytes> private_data{};
};

/// DREQ (IBTA 12.6.10, table 112).
struct Dreq {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn = 0;  ///< 24 bits: the QPN of the DREQ's receiver
  std::array<uint8_t, kDreqPrivateBytes> private_data{};
};

/// DREP (IBTA 12.6.11, table 113).
struct Drep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kDrepPrivateBytes> private_data{};
};

/// SIDR_REQ (IBTA 12.11.1, table 119).
struct SidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = 0xffff;
  uint64_t service_id = 0;
  std::array<uint8_t, kSidrReqPrivateBytes> private_data{};
};

/// SIDR_REP (IBTA 12.11.2, table 120).
struct SidrRep {
  uint32_t request_id = 0;
  SidrStatus status = SidrStatus::kSuccess;
  uint8_t additional_info_length = 0;
  uint32_t vendor_id = 0;  ///< 24 bits (bytes 6, 7, 11)
  uint32_t qpn = 0;        ///< 24 bits
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  std::array<uint8_t, kSidrRepInfoBytes> additional_info{};
  std::array<uint8_t, kSidrRepPrivateBytes> private_data{};
};

/// One CM message.
using CmMessage = std::variant<Req, Mra, Rej, Rep, Rtu, Dreq, Drep, SidrReq, SidrRep>;

/// A decoded MAD: its header and message.
struct Mad {
  MadHeader header;
  CmMessage message;
};

/// Why a received MAD was dropped (each is counted by the caller).
enum class MadError : uint8_t {
  kTooShort,          ///< fewer than 256 bytes
  kBadBaseVersion,    ///< base version not 1
  kNotCm,             ///< management class not 0x07 (another class: the GSI is shared)
  kBadClassVersion,   ///< CM class version not 2
  kBadMethod,         ///< not ComMgtSend (Get/Set of ClassPortInfo, responses, …)
  kUnknownAttribute,  ///< attribute ID of no message handled here (LAP, APR, …)
};
/// The error's name, e.g. "unknown attribute".
const char* to_string(MadError e);

/// The attribute ID of a message.
AttrId attr_id_of(const CmMessage& m);
/// The message's name as the spec writes it ("REQ", "SIDR_REP", …).
const char* message_name(const CmMessage& m);
const char* attr_name(uint16_t attr_id);

/// Encodes `header` and `message` into one 256-byte MAD. The header's attr_id is taken
/// from the message (whatever `header.attr_id` says); fields wider than their wire width
/// are truncated to it.
std::array<uint8_t, kMadBytes> encode(const MadHeader& header, const CmMessage& message);

/// Decodes one MAD. Bytes beyond 256 are ignored (a UD receive may carry padding).
/// Returns the error when the MAD is not a CM message handled here.
struct DecodeResult {
  std::optional<Mad> mad;
  MadError error = MadError::kTooShort;  ///< meaningful when !mad
};
DecodeResult decode(std::span<const uint8_t> bytes);

/// Where one field of a CM message lies, as IBTA vol. 1 ch. 12's tables (and Linux's
/// include/rdma/ibta_vol1_c12.h) state it: `byte` counts from the end of the 24-byte MAD
/// header (from the start of the MAD for the header's own fields, 13.4.2), `bit` counts from
/// the most significant bit of that byte, `width` is in bits; the field is big-endian and may
/// span bytes. A value wider than one field is split over several: the field with `shift` s
/// holds the member's bits s … s+width−1 (the ECE vendor ID of REP and SIDR_REP).
struct FieldLayout {
  std::string_view name;  ///< the member's name ("primary.flow_label", "vendor_id_h", …)
  uint16_t byte = 0;
  uint8_t bit = 0;
  uint16_t width = 0;
  uint8_t shift = 0;
};

/// The field table encode() and decode() use for the message with attribute ID `id`, in the
/// spec's order; empty for an attribute not handled here (LAP, APR, ClassPortInfo).
/// Throws std::logic_error if a byte array's stated width is not its member's size.
std::vector<FieldLayout> field_layout(AttrId id);
/// The common MAD header's field table (IBTA 13.4.2; offsets from the start of the MAD).
std::vector<FieldLayout> mad_header_layout();
/// The RDMA IP CM Service private data header's field table (annex A11.6, table 3).
std::vector<FieldLayout> ip_cm_header_layout();

/// The IBTA service ID of an RDMA IP CM service (IBTA annex A11.2.1, Linux
/// cma_get_service_id): 0x0000000001PPPPPP, i.e. (port space << 16) | port.
inline constexpr uint64_t ip_service_id(uint16_t port_space, uint16_t port) {
  return (uint64_t{port_space} << 16) | port;
}
/// The prefix every RDMA IP CM service ID has (annex A11.2.1): 0x00000000_01xxxxxx.
inline constexpr uint64_t kIpServiceIdMask = 0xffffffffff000000ull;
inline constexpr uint64_t kIpServiceIdPrefix = 0x0000000001000000ull;

/// The RDMA IP CM Service private data header (IBTA annex A11.6, table 3; Linux cma_hdr):
/// carried at the start of a REQ's and a SIDR_REQ's private data. IPv4 only here: the
/// address sits in the last 4 of its 16 bytes (bytes 0–11 zero), as the kernel writes it.
struct IpCmHeader {
  uint8_t cm_version = 0;  ///< CMA version 0x00
  uint8_t ip_version = 4;  ///< high nibble of byte 1
  uint16_t src_port = 0;   ///< the active side's port, host order
  uint32_t src_ip = 0;     ///< host order
  uint32_t dst_ip = 0;     ///< host order
};
inline constexpr size_t kIpCmHeaderBytes = 36;
/// User private data that fits behind the header: REQ 56 bytes, SIDR_REQ 180 bytes.
inline constexpr size_t kReqUserPrivateBytes = kReqPrivateBytes - kIpCmHeaderBytes;
inline constexpr size_t kSidrReqUserPrivateBytes = kSidrReqPrivateBytes - kIpCmHeaderBytes;

/// Writes the header into the first 36 bytes of `out` (which must hold them).
void encode_ip_cm_header(const IpCmHeader& h, std::span<uint8_t> out);
/// Reads the header; nullopt when `in` is shorter than 36 bytes, the CMA version is not 0 or
/// the IP version is not 4 (IPv6 peers are not supported).
std::optional<IpCmHeader> decode_ip_cm_header(std::span<const uint8_t> in);

}  // namespace softrdma::cm
