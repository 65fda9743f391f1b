// RoCEv2 Invariant CRC (IBTA vol 1, 7.8.1 and Annex A17.3.3), computed exactly as Linux
// rxe does (drivers/infiniband/sw/rxe/rxe_icrc.c):
//
//   CRC-32 (reflected, polynomial 0x04C11DB7, i.e. zlib's crc32) starting from the state
//   0xdebb20e3 — the CRC of eight 0xFF bytes that stand for the masked LRH — over
//     IPv4 header with TOS = 0xFF, TTL = 0xFF, header checksum = 0xFFFF,
//     UDP header with checksum = 0xFFFF,
//     BTH with byte 4 (FECN/BECN/resv) = 0xFF,
//     the remaining transport headers, payload and pad;
//   the packet carries the complement, stored little-endian in its last four bytes.
//
// The IPv4 identification and flags fields are covered, yet a receiver on a UDP socket
// never sees them. softrdma senders use an unconnected socket with DF set, so the kernel
// sends id 0 and the check is exact. For foreign senders (rxe, NICs) icrc_verify() solves
// for the 16-bit id and the DF bit, which enter the CRC linearly: a packet is accepted when
// some (id, DF) makes its ICRC match, and the id it recovers is reported. Corruption then
// still fails with probability 1 − 2^-15 (17 unknowns against 32 CRC bits), on top of the
// UDP checksum the kernel already verified.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/roce.h"

namespace softrdma::wire {

/// The IPv4 and UDP header fields a RoCEv2 packet's ICRC covers. Addresses and ports
/// in host byte order.
struct Ipv4UdpTuple {
  uint32_t src_ip = 0;
  uint32_t dst_ip = 0;
  uint16_t src_port = 0;
  uint16_t dst_port = kRoceV2Port;
  uint16_t ip_id = 0;         ///< IPv4 identification (0 for softrdma senders)
  bool dont_fragment = true;  ///< IPv4 DF flag
};

/// Incremental ICRC over a packet assembled from several buffers (headers, then payload
/// pieces straight from registered memory, then pad).
class IcrcAccumulator {
 public:
  /// Starts the CRC over the masked IPv4 + UDP headers and the masked BTH.
  /// `udp_payload_bytes` is the length of the whole UDP payload: BTH … ICRC inclusive.
  /// `bth` is the 12-byte BTH as it will be (or was) sent.
  IcrcAccumulator(const Ipv4UdpTuple& t, size_t udp_payload_bytes,
                  std::span<const uint8_t> bth) noexcept;
  /// Continues the CRC over the next bytes after the BTH.
  void update(std::span<const uint8_t> bytes) noexcept;
  /// The ICRC value to send: write it little-endian as the packet's last four bytes.
  uint32_t finish() const noexcept;

 private:
  uint32_t crc_;  // zlib-convention running CRC
};

/// ICRC of a complete UDP payload (BTH … pad; the trailing 4 ICRC bytes excluded from
/// `udp_payload_without_icrc`). Same value as IcrcAccumulator.
uint32_t icrc_compute(const Ipv4UdpTuple& t,
                      std::span<const uint8_t> udp_payload_without_icrc) noexcept;

/// The ICRC of the same packet sent with IPv4 id `ip_id` instead of the id `icrc` was
/// computed for (`from_id`). `udp_payload_bytes` is the whole UDP payload, BTH … ICRC. The
/// CRC is affine in the id bits (see icrc_verify), so this costs a few GF(2) products, not
/// a pass over the packet. UDP GSO senders use it: the kernel gives segment k of a batch
/// the first segment's id + k.
uint32_t icrc_with_ip_id(uint32_t icrc, uint16_t from_id, uint16_t ip_id,
                         size_t udp_payload_bytes) noexcept;

/// Plain CRC-32 (zlib's crc32: reflected, polynomial 0x04C11DB7) of `bytes`, continuing
/// from `crc` (0 to start). The responder fingerprints packets it placed out of order with
/// it (engine/received_psns.h). Not a MAC: it tells copies apart, it authenticates nothing.
uint32_t crc32(uint32_t crc, std::span<const uint8_t> bytes) noexcept;

/// Outcome of checking a received packet's ICRC.
struct IcrcVerdict {
  bool ok = false;            ///< some (id, DF) explains the received ICRC
  bool exact = false;         ///< matched with t.ip_id / t.dont_fragment as given
  uint16_t ip_id = 0;         ///< the IPv4 id that makes the ICRC match (when ok)
  bool dont_fragment = true;  ///< the DF flag that makes it match (when ok)
};

/// Verifies the ICRC of a received UDP payload (BTH … ICRC inclusive, at least
/// kBthBytes + kIcrcBytes long; shorter input returns ok = false). First tries t.ip_id and
/// t.dont_fragment as given; if that fails, solves for the id and DF bit (see above).
IcrcVerdict icrc_verify(const Ipv4UdpTuple& t, std::span<const uint8_t> udp_payload) noexcept;

/// Writes a full IPv4 (20 B, no options) + UDP (8 B) header for a RoCEv2 packet into `out`
/// (at least kIpv4UdpHeaderBytes), with a correct IPv4 header checksum, the given TTL and
/// TOS, and UDP checksum 0 (allowed for IPv4). Used by packet capture.
void encode_ipv4_udp(const Ipv4UdpTuple& t, size_t udp_payload_bytes, uint8_t ttl, uint8_t tos,
                     std::span<uint8_t> out) noexcept;

}  // namespace softrdma::wire
