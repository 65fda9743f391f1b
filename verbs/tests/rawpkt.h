// Raw RoCEv2 packets for the robustness tests, written independently of wire/: the header
// layouts are spelled out here from IBTA vol 1 (9.2 BTH, 9.3 extended headers) and the ICRC
// is a separate CRC-32 implementation following Annex A17.3.3 / rxe_icrc.c, so a shared
// misunderstanding between the engine and these tests cannot cancel out.
//
// FakePeer is a plain UDP socket bound to <some free 127.0.3.x>:4791. A QP on the device is
// connected to it (dgid ::ffff:127.0.3.x), so the test plays the remote RC endpoint: it
// sends requests/ACKs the device must accept or drop, and sees every packet the device
// sends, ACKs and NAKs included.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test::raw {

inline constexpr uint16_t kRocePort = 4791;

// BTH opcodes (IBTA vol 1, table 38), RC.
enum : uint8_t {
  kSendFirst = 0x00,
  kSendMiddle = 0x01,
  kSendLast = 0x02,
  kSendLastImm = 0x03,
  kSendOnly = 0x04,
  kSendOnlyImm = 0x05,
  kWriteFirst = 0x06,
  kWriteMiddle = 0x07,
  kWriteLast = 0x08,
  kWriteLastImm = 0x09,
  kWriteOnly = 0x0a,
  kWriteOnlyImm = 0x0b,
  kReadRequest = 0x0c,
  kReadResponseFirst = 0x0d,
  kReadResponseMiddle = 0x0e,
  kReadResponseLast = 0x0f,
  kReadResponseOnly = 0x10,
  kAcknowledge = 0x11,
  kAtomicAcknowledge = 0x12,
  kCompareSwap = 0x13,
  kFetchAdd = 0x14,
};

/// AETH syndromes (9.7.5.1).
inline constexpr uint8_t kSyndromeAck = 0x1f;  // ACK, credit field "invalid" (no EE flow control)
inline constexpr uint8_t kSyndromeNakPsnSeq = 0x60;
inline bool syndrome_is_ack(uint8_t s) {
  return (s >> 5) == 0;
}
inline bool syndrome_is_rnr(uint8_t s) {
  return (s >> 5) == 1;
}
inline bool syndrome_is_nak(uint8_t s) {
  return (s >> 5) == 3;
}

/// zlib-convention CRC-32 (reflected 0x04C11DB7, init and final XOR ~0); `crc` continues a
/// previous result.
uint32_t crc32(const uint8_t* p, size_t n, uint32_t crc = 0);

/// IPv4/UDP fields the ICRC covers (host order).
struct Tuple {
  uint32_t src_ip = 0;
  uint32_t dst_ip = 0;
  uint16_t src_port = kRocePort;
  uint16_t dst_port = kRocePort;
  uint16_t ip_id = 0;
  bool dont_fragment = true;
};

/// ICRC of a UDP payload (BTH … pad, without the trailing ICRC): the value the packet
/// carries, stored little-endian in its last four bytes.
uint32_t icrc(const Tuple& t, const uint8_t* udp_payload, size_t len_without_icrc);

/// Whether the last four bytes of `pkt` are its ICRC for `t` with some IPv4 id in
/// [0, max_id] (DF set first, then clear). On success *id is the id that matched.
bool icrc_matches(Tuple t, const std::vector<uint8_t>& pkt, unsigned max_id,
                  uint16_t* id = nullptr);

/// Base Transport Header fields.
struct Bth {
  uint8_t opcode = kSendOnly;
  bool solicited = false;
  bool mig_req = true;
  uint8_t tver = 0;
  uint16_t pkey = 0xffff;
  uint32_t dest_qpn = 0;
  bool ack_req = false;
  /// softrdma's selective-retransmission capability bit (wire::Bth::selective, 0x40 of
  /// byte 8) and its resend bit (wire::Bth::resend, 0x20).
  bool selective = false;
  bool resend = false;
  /// softrdma's placed mark (wire::Bth::placed, 0x08 of byte 8): only same-host records may
  /// carry it.
  bool placed = false;
  uint32_t psn = 0;
};

/// Appends headers in wire order; finish() pads to 4 bytes, writes the pad count into the
/// BTH and appends the ICRC.
class PacketBuilder {
 public:
  explicit PacketBuilder(const Bth& bth);
  PacketBuilder& reth(uint64_t va, uint32_t rkey, uint32_t dma_len);
  PacketBuilder& aeth(uint8_t syndrome, uint32_t msn);
  PacketBuilder& atomic_eth(uint64_t va, uint32_t rkey, uint64_t swap_add, uint64_t compare);
  PacketBuilder& atomic_ack(uint64_t orig);
  PacketBuilder& immdt(uint32_t imm_be);
  PacketBuilder& payload(const void* p, size_t n);
  std::vector<uint8_t> finish(const Tuple& t);

 private:
  std::vector<uint8_t> b_;
};

/// BTH fields read back from a packet (at least 12 bytes).
struct ParsedBth {
  uint8_t opcode = 0;
  bool solicited = false;
  uint8_t pad = 0;
  uint8_t tver = 0;
  uint16_t pkey = 0;
  uint32_t dest_qpn = 0;
  bool ack_req = false;
  uint32_t psn = 0;
};
bool parse_bth(const std::vector<uint8_t>& pkt, ParsedBth& out);

uint16_t get_be16(const uint8_t* p);
uint32_t get_be24(const uint8_t* p);
uint32_t get_be32(const uint8_t* p);
uint64_t get_be64(const uint8_t* p);

/// Bytes of BTH + extended headers of the RC opcodes above (0 for others).
size_t header_bytes(uint8_t opcode);

inline uint32_t psn_add(uint32_t psn, uint32_t n) {
  return (psn + n) & 0xffffff;
}

/// The test's side of a connection: a UDP socket on <free 127.0.3.x>:4791.
class FakePeer {
 public:
  FakePeer() = default;
  ~FakePeer();
  FakePeer(const FakePeer&) = delete;
  FakePeer& operator=(const FakePeer&) = delete;

  /// Binds the first free 127.0.3.x:4791 with DF set (IPv4 id 0 on send). False on failure.
  bool open();
  uint32_t ip() const { return ip_; }
  ibv_gid gid() const;
  /// Sends one UDP datagram to dst_ip:4791.
  bool send_to(uint32_t dst_ip, const std::vector<uint8_t>& udp_payload);
  bool send_to(uint32_t dst_ip, const uint8_t* p, size_t n);
  /// Receives one datagram sent from `from_ip` within `timeout` (others are discarded).
  bool recv_from(uint32_t from_ip, std::vector<uint8_t>& out, std::chrono::milliseconds timeout,
                 uint16_t* from_port = nullptr);
  /// Discards everything queued.
  size_t drain();
  /// Tuple of packets this peer sends to `dst_ip`.
  Tuple tuple_to(uint32_t dst_ip) const {
    return Tuple{ip_, dst_ip, kRocePort, kRocePort, 0, true};
  }

 private:
  int fd_ = -1;
  uint32_t ip_ = 0;
};

/// An RC QP on `dev` connected to a FakePeer on 127.0.3.x whose QP is `peer_qpn` and whose
/// first PSN is `peer_psn`; the device sends from `device_psn`, at MTU 1024, with a local ACK
/// timeout of ~1 s so that it does not retransmit while a test answers. A step that fails
/// is a fatal failure.
struct FakePeerQp {
  Endpoint ep;
  FakePeer peer;
  ConnOptions o;

  FakePeerQp(Device& dev, uint32_t peer_qpn, uint32_t peer_psn, uint32_t device_psn);
  ~FakePeerQp();
  FakePeerQp(const FakePeerQp&) = delete;
  FakePeerQp& operator=(const FakePeerQp&) = delete;
};

}  // namespace softrdma::verbs_test::raw
