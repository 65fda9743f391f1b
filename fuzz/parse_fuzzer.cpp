// libFuzzer target for the wire layer: parse() and icrc_verify() on arbitrary UDP
// payloads, and, for packets that parse, consistency of encode_headers() with parse()
// and of the ICRC functions with each other. Any inconsistency aborts (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "wire/icrc.h"
#include "wire/roce.h"

namespace {

using namespace softrdma::wire;

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

void store_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

/// Header bytes as encode_headers() would write them: reserved BTH bits cleared and the
/// CNP's reserved bytes zeroed, and the reserved byte of a DETH (its 5th) or XRCETH (its 1st).
void canonicalize(std::span<uint8_t> hdr, const OpcodeInfo& info) {
  hdr[4] &= 0xc0;  // FECN, BECN; resv6a
  hdr[8] &= 0x80;  // AckReq; resv7
  if (info.mask & kIsCnp) std::memset(hdr.data() + kBthBytes, 0, info.header_bytes - kBthBytes);
  if (info.mask & kHasDeth) hdr[kBthBytes + 4] = 0;
  if (info.mask & kHasXrceth) hdr[kBthBytes] = 0;
}

void check_parsed(std::span<const uint8_t> in, const Packet& p) {
  const OpcodeInfo* info = opcode_info(in[0]);
  FUZZ_CHECK(info != nullptr && p.info == info);
  const size_t pad = p.hdr.bth.pad_count;
  FUZZ_CHECK(pad < 4);
  FUZZ_CHECK(p.hdr.bth.tver == 0);
  FUZZ_CHECK(info->header_bytes + p.payload.size() + pad + kIcrcBytes == in.size());
  FUZZ_CHECK(p.payload.data() == in.data() + info->header_bytes);
  if (!(info->mask & kHasPayload)) FUZZ_CHECK(p.payload.empty() && pad == 0);
  FUZZ_CHECK(received_icrc(in) == load_le32(in.data() + in.size() - kIcrcBytes));
  FUZZ_CHECK(p.hdr.bth.dest_qpn <= kPsnMask && p.hdr.bth.psn <= kPsnMask);
  FUZZ_CHECK(p.hdr.aeth.msn <= kPsnMask);

  // Re-encoding the parsed headers gives the input's header bytes (reserved bits aside).
  uint8_t enc[kMaxTransportHeaderBytes + 8];
  std::memset(enc, 0xa5, sizeof enc);
  const size_t n = encode_headers(p.hdr, enc);
  FUZZ_CHECK(n == info->header_bytes);
  FUZZ_CHECK(enc[n] == 0xa5);  // nothing written past the headers
  uint8_t want[kMaxTransportHeaderBytes];
  std::memcpy(want, in.data(), n);
  canonicalize(std::span<uint8_t>(want, n), *info);
  FUZZ_CHECK(std::memcmp(enc, want, n) == 0);
  // Too small a buffer: nothing encoded.
  FUZZ_CHECK(encode_headers(p.hdr, std::span<uint8_t>(enc, n - 1)) == 0);

  // The canonical packet parses to the same headers.
  std::vector<uint8_t> canon(in.begin(), in.end());
  std::memcpy(canon.data(), enc, n);
  Packet q;
  FUZZ_CHECK(parse(canon, q) == ParseError::kOk);
  uint8_t enc2[kMaxTransportHeaderBytes];
  FUZZ_CHECK(encode_headers(q.hdr, enc2) == n);
  FUZZ_CHECK(std::memcmp(enc, enc2, n) == 0);
  FUZZ_CHECK(q.payload.size() == p.payload.size());
  FUZZ_CHECK(q.hdr.imm_be == p.hdr.imm_be);
}

void check_icrc(std::span<const uint8_t> in) {
  Ipv4UdpTuple t;
  t.src_ip = 0x0a000001;
  t.dst_ip = 0x0a000002;
  t.src_port = 0xc000;

  // Arbitrary input: must not crash; a verdict must be self-consistent.
  const IcrcVerdict v = icrc_verify(t, in);
  if (in.size() < kBthBytes + kIcrcBytes) {
    FUZZ_CHECK(!v.ok);
    return;
  }
  const auto body = in.first(in.size() - kIcrcBytes);
  const uint32_t received = load_le32(in.data() + body.size());
  if (v.ok) {
    Ipv4UdpTuple u = t;
    u.ip_id = v.ip_id;
    u.dont_fragment = v.dont_fragment;
    FUZZ_CHECK(icrc_compute(u, body) == received);
    FUZZ_CHECK(v.exact == (v.ip_id == t.ip_id && v.dont_fragment == t.dont_fragment));
  } else {
    FUZZ_CHECK(icrc_compute(t, body) != received);
  }

  // Accumulator over pieces (split points taken from the data) equals one-shot.
  const uint32_t one_shot = icrc_compute(t, body);
  IcrcAccumulator acc(t, in.size(), body.first(kBthBytes));
  size_t off = kBthBytes;
  size_t step = (in[1] % 17) + 1;
  while (off < body.size()) {
    const size_t k = step < body.size() - off ? step : body.size() - off;
    acc.update(body.subspan(off, k));
    acc.update({});
    off += k;
    step = step * 3 % 61 + 1;
  }
  FUZZ_CHECK(acc.finish() == one_shot);

  // Stamp an ICRC computed with an id derived from the data; verifying with id 0 must
  // recover exactly that id and DF flag.
  Ipv4UdpTuple sender = t;
  sender.ip_id = static_cast<uint16_t>((in[2] << 8 | in[3]) ^ (in.size() * 0x9e37u));
  sender.dont_fragment = (in[in.size() / 2] & 1) != 0;
  std::vector<uint8_t> stamped(in.begin(), in.end());
  store_le32(stamped.data() + body.size(), icrc_compute(sender, body));
  const IcrcVerdict r = icrc_verify(t, stamped);
  FUZZ_CHECK(r.ok);
  FUZZ_CHECK(r.ip_id == sender.ip_id && r.dont_fragment == sender.dont_fragment);
  FUZZ_CHECK(r.exact == (sender.ip_id == 0 && sender.dont_fragment));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Bound the work per input; RoCEv2 packets are at most ~4 KiB of payload + headers.
  if (size > 9000) return 0;
  const std::span<const uint8_t> in(data, size);

  Packet p;
  const ParseError e = parse(in, p);
  FUZZ_CHECK(to_string(e) != nullptr);
  if (e == ParseError::kOk) check_parsed(in, p);

  check_icrc(in);

  if (size >= 1) {
    const uint32_t rnr = rnr_timer_usec(data[0]);
    FUZZ_CHECK(rnr >= 10 && rnr <= 655360);
  }

  // encode_ipv4_udp must never write outside the buffer and must checksum correctly.
  if (size >= 8) {
    Ipv4UdpTuple t;
    std::memcpy(&t.src_ip, data, 4);
    std::memcpy(&t.dst_ip, data + 4, 4);
    uint8_t h[kIpv4UdpHeaderBytes];
    encode_ipv4_udp(t, size, data[0], data[1], h);
    uint32_t sum = 0;
    for (size_t i = 0; i < 20; i += 2) sum += (uint32_t{h[i]} << 8) | h[i + 1];
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    FUZZ_CHECK(sum == 0xffff);
  }
  return 0;
}
