// RoCEv2 ICRC. See icrc.h for what is covered and how the IPv4 id is recovered.
#include "wire/icrc.h"

#include <zlib.h>
#ifdef SOFTRDMA_HAVE_ISAL
#include <isa-l/crc.h>
#endif

#include <array>
#include <cstring>
#include <utility>

namespace softrdma::wire {
namespace {

/// Raw CRC state 0xdebb20e3 (CRC of the eight 0xFF bytes of the masked LRH), expressed in
/// zlib's convention, where crc32() complements its argument on entry and its result on
/// exit: zlib's running value is the complement of the raw state, and the wire ICRC (the
/// complement of the final raw state) is then exactly zlib's returned value.
constexpr uint32_t kZlibSeed = 0xdebb20e3u ^ 0xffffffffu;

/// Reflected CRC-32 polynomial (0x04C11DB7 bit-reversed).
constexpr uint32_t kPolyReflected = 0xedb88320u;

constexpr size_t kIpv4Bytes = 20;
constexpr size_t kUdpBytes = 8;
constexpr size_t kPseudoBytes = kIpv4Bytes + kUdpBytes + kBthBytes;
constexpr uint16_t kDfFlag = 0x4000;
constexpr uint8_t kProtoUdp = 17;

/// zlib's crc32_z, except that empty input leaves the CRC alone (zlib returns 0 for a
/// null buffer, which an empty std::span may have). With isa-l, its crc32_gzip_refl — the
/// same reflected CRC-32 in the same convention, with PCLMULQDQ folding — does the bulk
/// work: several times zlib's speed on the 4 KiB payloads every packet carries (CRC was
/// the largest user-space cost of a bandwidth run).
uint32_t crc_update(uint32_t crc, const uint8_t* p, size_t n) {
  if (n == 0) return crc;
#ifdef SOFTRDMA_HAVE_ISAL
  return crc32_gzip_refl(crc, p, n);
#else
  return static_cast<uint32_t>(crc32_z(crc, p, n));
#endif
}

void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void put32(uint8_t* p, uint32_t v) {
  put16(p, static_cast<uint16_t>(v >> 16));
  put16(p + 2, static_cast<uint16_t>(v));
}

/// IPv4 (20 B) + UDP (8 B) header with the given variable fields.
void write_ipv4_udp(const Ipv4UdpTuple& t, size_t udp_payload_bytes, uint8_t tos, uint8_t ttl,
                    uint16_t ip_csum, uint16_t udp_csum, uint8_t* p) {
  p[0] = 0x45;
  p[1] = tos;
  put16(p + 2, static_cast<uint16_t>(kIpv4Bytes + kUdpBytes + udp_payload_bytes));
  put16(p + 4, t.ip_id);
  put16(p + 6, t.dont_fragment ? kDfFlag : 0);
  p[8] = ttl;
  p[9] = kProtoUdp;
  put16(p + 10, ip_csum);
  put32(p + 12, t.src_ip);
  put32(p + 16, t.dst_ip);
  uint8_t* u = p + kIpv4Bytes;
  put16(u, t.src_port);
  put16(u + 2, t.dst_port);
  put16(u + 4, static_cast<uint16_t>(kUdpBytes + udp_payload_bytes));
  put16(u + 6, udp_csum);
}

// ---- GF(2)[x] / P arithmetic on reflected 32-bit values (as zlib's crc32.c) ------------

/// a·b mod P, reflected representation (bit 31 is x^0).
constexpr uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31;
  uint32_t prod = 0;
  for (;;) {
    if (a & m) {
      prod ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPolyReflected : b >> 1;
  }
  return prod;
}

/// x^e mod P by square-and-multiply.
constexpr uint32_t xpowmodp(uint64_t e) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t sq = 1u << 30;      // x^1, then x^2, x^4, ...
  while (e) {
    if (e & 1) result = multmodp(sq, result);
    e >>= 1;
    sq = multmodp(sq, sq);
  }
  return result;
}

/// x has multiplicative order dividing 2^32 − 1 modulo the CRC-32 polynomial, so
/// x^−m = x^(2^32 − 1 − m mod (2^32 − 1)).
constexpr uint64_t kXOrder = 0xffffffffu;
static_assert(xpowmodp(kXOrder) == 1u << 31);

/// x^(−8·2^k) mod P for k = 0..63: multiplying a raw CRC state by x^(−8·n) undoes
/// advancing it over n zero bytes.
constexpr std::array<uint32_t, 64> make_unshift_table() {
  std::array<uint32_t, 64> t{};
  uint32_t p = xpowmodp(kXOrder - 8);  // x^-8
  for (auto& e : t) {
    e = p;
    p = multmodp(p, p);
  }
  return t;
}
constexpr std::array<uint32_t, 64> kUnshift8 = make_unshift_table();
static_assert(multmodp(kUnshift8[0], xpowmodp(8)) == 1u << 31);

/// x^(8·2^k) mod P for k = 0..63.
constexpr std::array<uint32_t, 64> make_shift_table() {
  std::array<uint32_t, 64> t{};
  uint32_t p = xpowmodp(8);
  for (auto& e : t) {
    e = p;
    p = multmodp(p, p);
  }
  return t;
}
constexpr std::array<uint32_t, 64> kShift8 = make_shift_table();

/// x^(8·n) mod P: advancing a raw CRC state over n zero bytes multiplies it by this.
uint32_t shift_bytes(uint64_t n) {
  uint32_t p = 1u << 31;
  for (size_t k = 0; n != 0; ++k, n >>= 1) {
    if (n & 1) p = multmodp(kShift8[k], p);
  }
  return p;
}

/// x^(−8·n) mod P.
uint32_t unshift_bytes(uint64_t n) {
  uint32_t p = 1u << 31;
  for (size_t k = 0; n != 0; ++k, n >>= 1) {
    if (n & 1) p = multmodp(kUnshift8[k], p);
  }
  return p;
}

/// Number of unknowns solved for: 16 id bits and the DF bit.
constexpr int kUnknowns = 17;
/// Offset of the IPv4 id in the CRC'd message and the length of the prefix that holds
/// every unknown bit (id at bytes 4-5, DF in byte 6).
constexpr size_t kIdOffset = 4;
constexpr size_t kPrefixBytes = 8;

/// Raw CRC (zero initial state, no complement) of `n` bytes, bit by bit.
constexpr uint32_t raw_crc(const uint8_t* p, size_t n) {
  uint32_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int b = 0; b < 8; ++b) c = (c & 1) ? (c >> 1) ^ kPolyReflected : c >> 1;
  }
  return c;
}

/// The unknowns' effect on the raw CRC state right after the 8-byte prefix, reduced to
/// echelon form: row r is vec[r] = Σ over bits i of comb[r] of (effect of unknown i),
/// and each row's highest bit `lead[r]` appears in no other row. Unknown i < 16 is bit i
/// of the id, unknown 16 the DF flag.
struct Echelon {
  std::array<uint32_t, kUnknowns> vec{};
  std::array<uint32_t, kUnknowns> comb{};
  std::array<uint32_t, kUnknowns> lead{};
  int rows = 0;
};

constexpr Echelon make_echelon() {
  Echelon e;
  for (int i = 0; i < kUnknowns; ++i) {
    uint8_t prefix[kPrefixBytes] = {};
    const uint16_t v = i < 16 ? static_cast<uint16_t>(1u << i) : kDfFlag;
    const size_t at = i < 16 ? kIdOffset : kIdOffset + 2;
    prefix[at] = static_cast<uint8_t>(v >> 8);
    prefix[at + 1] = static_cast<uint8_t>(v);
    e.vec[i] = raw_crc(prefix, kPrefixBytes);
    e.comb[i] = 1u << i;
  }
  for (int bit = 31; bit >= 0 && e.rows < kUnknowns; --bit) {
    const uint32_t m = 1u << bit;
    int piv = -1;
    for (int r = e.rows; r < kUnknowns && piv < 0; ++r) {
      if (e.vec[r] & m) piv = r;
    }
    if (piv < 0) continue;
    std::swap(e.vec[e.rows], e.vec[piv]);
    std::swap(e.comb[e.rows], e.comb[piv]);
    for (int r = 0; r < kUnknowns; ++r) {
      if (r != e.rows && (e.vec[r] & m)) {
        e.vec[r] ^= e.vec[e.rows];
        e.comb[r] ^= e.comb[e.rows];
      }
    }
    e.lead[e.rows] = m;
    ++e.rows;
  }
  return e;
}

constexpr Echelon kEchelon = make_echelon();

/// Effect of each IPv4 id bit on the raw CRC state right after the 8-byte prefix.
constexpr std::array<uint32_t, 16> make_id_effects() {
  std::array<uint32_t, 16> e{};
  for (int i = 0; i < 16; ++i) {
    uint8_t prefix[kPrefixBytes] = {};
    const uint16_t v = static_cast<uint16_t>(1u << i);
    prefix[kIdOffset] = static_cast<uint8_t>(v >> 8);
    prefix[kIdOffset + 1] = static_cast<uint8_t>(v);
    e[static_cast<size_t>(i)] = raw_crc(prefix, kPrefixBytes);
  }
  return e;
}
constexpr std::array<uint32_t, 16> kIdEffect = make_id_effects();
// The effects are linearly independent (a 32-bit CRC detects every error burst of at
// most 32 bits, and the unknowns lie within 23 bits of the message), so the (id, DF) that
// explains a given ICRC difference, if any, is unique.
static_assert(kEchelon.rows == kUnknowns);

/// Finds the unknowns x (bit i = unknown i) whose effect on the raw state right after the
/// prefix is `delta`. Returns false when no combination has that effect.
bool solve(uint32_t delta, uint32_t& x) {
  uint32_t sol = 0;
  for (int r = 0; r < kEchelon.rows; ++r) {
    if (delta & kEchelon.lead[r]) {
      delta ^= kEchelon.vec[r];
      sol ^= kEchelon.comb[r];
    }
  }
  if (delta != 0) return false;
  x = sol;
  return true;
}

}  // namespace

IcrcAccumulator::IcrcAccumulator(const Ipv4UdpTuple& t, size_t udp_payload_bytes,
                                 std::span<const uint8_t> bth) noexcept {
  uint8_t buf[kPseudoBytes] = {};
  write_ipv4_udp(t, udp_payload_bytes, /*tos=*/0xff, /*ttl=*/0xff, /*ip_csum=*/0xffff,
                 /*udp_csum=*/0xffff, buf);
  uint8_t* b = buf + kIpv4Bytes + kUdpBytes;
  const size_t bth_len = bth.size() < kBthBytes ? bth.size() : kBthBytes;
  if (bth_len != 0) std::memcpy(b, bth.data(), bth_len);
  b[4] = 0xff;  // FECN, BECN, resv6a
  crc_ = crc_update(kZlibSeed, buf, sizeof buf);
}

void IcrcAccumulator::update(std::span<const uint8_t> bytes) noexcept {
  crc_ = crc_update(crc_, bytes.data(), bytes.size());
}

uint32_t IcrcAccumulator::finish() const noexcept {
  return crc_;
}

uint32_t icrc_compute(const Ipv4UdpTuple& t,
                      std::span<const uint8_t> udp_payload_without_icrc) noexcept {
  const size_t bth_len =
      udp_payload_without_icrc.size() < kBthBytes ? udp_payload_without_icrc.size() : kBthBytes;
  IcrcAccumulator acc(t, udp_payload_without_icrc.size() + kIcrcBytes,
                      udp_payload_without_icrc.first(bth_len));
  acc.update(udp_payload_without_icrc.subspan(bth_len));
  return acc.finish();
}

uint32_t icrc_with_ip_id(uint32_t icrc, uint16_t from_id, uint16_t ip_id,
                         size_t udp_payload_bytes) noexcept {
  uint32_t effect = 0;
  for (unsigned d = static_cast<uint16_t>(from_id ^ ip_id), i = 0; d; d >>= 1, ++i)
    if (d & 1) effect ^= kIdEffect[i];
  if (effect == 0 || udp_payload_bytes < kIcrcBytes) return icrc;
  // Bytes CRC'd after the prefix: the rest of IPv4 + UDP, then BTH … pad.
  const uint64_t rest = kIpv4Bytes + kUdpBytes + udp_payload_bytes - kIcrcBytes - kPrefixBytes;
  // Segments of one GSO batch share their length: keep the last shift.
  thread_local uint64_t cached_rest = ~0ull;
  thread_local uint32_t cached_shift = 0;
  if (rest != cached_rest) {
    cached_shift = shift_bytes(rest);
    cached_rest = rest;
  }
  return icrc ^ multmodp(cached_shift, effect);
}

IcrcVerdict icrc_verify(const Ipv4UdpTuple& t, std::span<const uint8_t> udp_payload) noexcept {
  IcrcVerdict v;
  if (udp_payload.size() < kBthBytes + kIcrcBytes) return v;
  const size_t body = udp_payload.size() - kIcrcBytes;
  const uint8_t* tail = udp_payload.data() + body;
  const uint32_t received = uint32_t{tail[0]} | (uint32_t{tail[1]} << 8) |
                            (uint32_t{tail[2]} << 16) | (uint32_t{tail[3]} << 24);
  const uint32_t computed = icrc_compute(t, udp_payload.first(body));
  if (computed == received) {
    v.ok = v.exact = true;
    v.ip_id = t.ip_id;
    v.dont_fragment = t.dont_fragment;
    return v;
  }

  // The CRC is affine in the message: flipping message bits changes the final raw state
  // (and so the ICRC) by the raw CRC of the flip pattern alone, i.e. by the flips' effect
  // on the state right after the 8-byte prefix holding the id and DF, advanced over the
  // remaining message bytes (multiplication by x^(8·rest)). Undo that advance and solve.
  const uint64_t rest = kIpv4Bytes + kUdpBytes + body - kPrefixBytes;
  uint32_t x = 0;
  if (!solve(multmodp(unshift_bytes(rest), computed ^ received), x)) return v;
  v.ok = true;
  v.exact = false;
  v.ip_id = static_cast<uint16_t>(t.ip_id ^ (x & 0xffff));
  v.dont_fragment = t.dont_fragment != ((x >> 16) & 1);
  return v;
}

void encode_ipv4_udp(const Ipv4UdpTuple& t, size_t udp_payload_bytes, uint8_t ttl, uint8_t tos,
                     std::span<uint8_t> out) noexcept {
  if (out.size() < kIpv4UdpHeaderBytes) return;
  uint8_t* p = out.data();
  write_ipv4_udp(t, udp_payload_bytes, tos, ttl, /*ip_csum=*/0, /*udp_csum=*/0, p);
  uint32_t sum = 0;
  for (size_t i = 0; i < kIpv4Bytes; i += 2) sum += (uint32_t{p[i]} << 8) | p[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  put16(p + 10, static_cast<uint16_t>(~sum));
}

uint32_t crc32(uint32_t crc, std::span<const uint8_t> bytes) noexcept {
  return crc_update(crc, bytes.data(), bytes.size());
}

}  // namespace softrdma::wire
