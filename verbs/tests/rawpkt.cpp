#include "verbs/tests/rawpkt.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace softrdma::verbs_test::raw {

namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> r{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      r[i] = c;
    }
    return r;
  }();
  return t;
}

void put_be16(std::vector<uint8_t>& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}
void put_be24(std::vector<uint8_t>& b, uint32_t v) {
  b.push_back(static_cast<uint8_t>(v >> 16));
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}
void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  put_be16(b, static_cast<uint16_t>(v >> 16));
  put_be16(b, static_cast<uint16_t>(v));
}
void put_be64(std::vector<uint8_t>& b, uint64_t v) {
  put_be32(b, static_cast<uint32_t>(v >> 32));
  put_be32(b, static_cast<uint32_t>(v));
}

}  // namespace

uint32_t crc32(const uint8_t* p, size_t n, uint32_t crc) {
  const auto& t = crc_table();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t icrc(const Tuple& t, const uint8_t* udp_payload, size_t len) {
  // Annex A17.3.3: eight 0xFF bytes for the (absent) LRH, then the IPv4 header with
  // TOS, TTL and checksum masked to ones, the UDP header with its checksum masked, and the
  // BTH with its resv8a byte (byte 4) masked; everything after the BTH as is.
  std::vector<uint8_t> m;
  m.reserve(8 + 28 + len);
  m.insert(m.end(), 8, 0xff);
  const size_t udp_len = 8 + len + 4;
  m.push_back(0x45);
  m.push_back(0xff);  // TOS
  put_be16(m, static_cast<uint16_t>(20 + udp_len));
  put_be16(m, t.ip_id);
  put_be16(m, t.dont_fragment ? 0x4000 : 0);
  m.push_back(0xff);    // TTL
  m.push_back(17);      // UDP
  put_be16(m, 0xffff);  // header checksum
  put_be32(m, t.src_ip);
  put_be32(m, t.dst_ip);
  put_be16(m, t.src_port);
  put_be16(m, t.dst_port);
  put_be16(m, static_cast<uint16_t>(udp_len));
  put_be16(m, 0xffff);  // UDP checksum
  m.insert(m.end(), udp_payload, udp_payload + len);
  if (len >= 5) m[8 + 28 + 4] = 0xff;
  return crc32(m.data(), m.size());
}

bool icrc_matches(Tuple t, const std::vector<uint8_t>& pkt, unsigned max_id, uint16_t* id) {
  if (pkt.size() < 16) return false;
  const size_t n = pkt.size() - 4;
  uint32_t carried = 0;
  for (int k = 3; k >= 0; --k) carried = carried << 8 | pkt[n + k];
  for (bool df : {true, false}) {
    t.dont_fragment = df;
    for (unsigned i = 0; i <= max_id && i <= 0xffff; ++i) {
      t.ip_id = static_cast<uint16_t>(i);
      if (icrc(t, pkt.data(), n) == carried) {
        if (id) *id = t.ip_id;
        return true;
      }
    }
  }
  return false;
}

PacketBuilder::PacketBuilder(const Bth& h) {
  b_.push_back(h.opcode);
  b_.push_back(static_cast<uint8_t>((h.solicited ? 0x80 : 0) | (h.mig_req ? 0x40 : 0) |
                                    (h.tver & 0xf)));  // pad count set in finish()
  put_be16(b_, h.pkey);
  b_.push_back(0);  // FECN/BECN/resv
  put_be24(b_, h.dest_qpn & 0xffffff);
  b_.push_back(static_cast<uint8_t>((h.ack_req ? 0x80 : 0) | (h.selective ? 0x40 : 0) |
                                    (h.resend ? 0x20 : 0) | (h.placed ? 0x08 : 0)));
  put_be24(b_, h.psn & 0xffffff);
}

PacketBuilder& PacketBuilder::reth(uint64_t va, uint32_t rkey, uint32_t dma_len) {
  put_be64(b_, va);
  put_be32(b_, rkey);
  put_be32(b_, dma_len);
  return *this;
}

PacketBuilder& PacketBuilder::aeth(uint8_t syndrome, uint32_t msn) {
  b_.push_back(syndrome);
  put_be24(b_, msn & 0xffffff);
  return *this;
}

PacketBuilder& PacketBuilder::atomic_eth(uint64_t va, uint32_t rkey, uint64_t swap_add,
                                         uint64_t compare) {
  put_be64(b_, va);
  put_be32(b_, rkey);
  put_be64(b_, swap_add);
  put_be64(b_, compare);
  return *this;
}

PacketBuilder& PacketBuilder::atomic_ack(uint64_t orig) {
  put_be64(b_, orig);
  return *this;
}

PacketBuilder& PacketBuilder::immdt(uint32_t imm_be) {
  const auto* p = reinterpret_cast<const uint8_t*>(&imm_be);
  b_.insert(b_.end(), p, p + 4);
  return *this;
}

PacketBuilder& PacketBuilder::payload(const void* p, size_t n) {
  const auto* s = static_cast<const uint8_t*>(p);
  b_.insert(b_.end(), s, s + n);
  return *this;
}

std::vector<uint8_t> PacketBuilder::finish(const Tuple& t) {
  std::vector<uint8_t> out = b_;
  const size_t payload_len = out.size() - header_bytes(out[0]);
  const uint8_t pad = static_cast<uint8_t>((4 - (payload_len & 3)) & 3);
  out.insert(out.end(), pad, 0);
  out[1] = static_cast<uint8_t>((out[1] & ~0x30) | (pad << 4));
  const uint32_t c = icrc(t, out.data(), out.size());
  for (int k = 0; k < 4; ++k) out.push_back(static_cast<uint8_t>(c >> (8 * k)));
  return out;
}

uint16_t get_be16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] << 8 | p[1]);
}
uint32_t get_be24(const uint8_t* p) {
  return uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2];
}
uint32_t get_be32(const uint8_t* p) {
  return uint32_t(get_be16(p)) << 16 | get_be16(p + 2);
}
uint64_t get_be64(const uint8_t* p) {
  return uint64_t(get_be32(p)) << 32 | get_be32(p + 4);
}

bool parse_bth(const std::vector<uint8_t>& pkt, ParsedBth& o) {
  if (pkt.size() < 12) return false;
  o.opcode = pkt[0];
  o.solicited = pkt[1] & 0x80;
  o.pad = (pkt[1] >> 4) & 3;
  o.tver = pkt[1] & 0xf;
  o.pkey = get_be16(&pkt[2]);
  o.dest_qpn = get_be24(&pkt[5]);
  o.ack_req = pkt[8] & 0x80;
  o.psn = get_be24(&pkt[9]);
  return true;
}

size_t header_bytes(uint8_t op) {
  switch (op) {
    case kSendFirst:
    case kSendMiddle:
    case kSendLast:
    case kSendOnly:
    case kWriteMiddle:
    case kWriteLast:
    case kReadResponseMiddle:
      return 12;
    case kSendLastImm:
    case kSendOnlyImm:
    case kWriteLastImm:
    case kReadResponseFirst:
    case kReadResponseLast:
    case kReadResponseOnly:
    case kAcknowledge:
      return 16;
    case kAtomicAcknowledge:
      return 24;
    case kWriteFirst:
    case kWriteOnly:
    case kReadRequest:
      return 28;
    case kWriteOnlyImm:
      return 32;
    case kCompareSwap:
    case kFetchAdd:
      return 40;
    default:
      return 12;
  }
}

FakePeer::~FakePeer() {
  if (fd_ >= 0) close(fd_);
}

bool FakePeer::open() {
  for (uint32_t x = 1; x <= 250; ++x) {
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const int pmtu = IP_PMTUDISC_DO;  // DF set: the kernel sends IPv4 id 0 (DESIGN.md)
    setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    const int rcvbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(kRocePort);
    const uint32_t ip = (127u << 24) | (3u << 8) | x;  // 127.0.3.x
    a.sin_addr.s_addr = htonl(ip);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      fd_ = fd;
      ip_ = ip;
      return true;
    }
    close(fd);
  }
  return false;
}

ibv_gid FakePeer::gid() const {
  ibv_gid g{};
  g.raw[10] = 0xff;
  g.raw[11] = 0xff;
  const uint32_t be = htonl(ip_);
  memcpy(&g.raw[12], &be, 4);
  return g;
}

bool FakePeer::send_to(uint32_t dst_ip, const std::vector<uint8_t>& p) {
  return send_to(dst_ip, p.data(), p.size());
}

bool FakePeer::send_to(uint32_t dst_ip, const uint8_t* p, size_t n) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(kRocePort);
  a.sin_addr.s_addr = htonl(dst_ip);
  return sendto(fd_, p, n, 0, reinterpret_cast<sockaddr*>(&a), sizeof a) == static_cast<ssize_t>(n);
}

bool FakePeer::recv_from(uint32_t from_ip, std::vector<uint8_t>& out,
                         std::chrono::milliseconds timeout, uint16_t* from_port) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          end - std::chrono::steady_clock::now())
                          .count();
    if (left < 0) return false;
    pollfd pfd{fd_, POLLIN, 0};
    const int pr = poll(&pfd, 1, static_cast<int>(left));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return false;
    out.resize(65536);
    sockaddr_in a{};
    socklen_t al = sizeof a;
    const ssize_t r =
        recvfrom(fd_, out.data(), out.size(), 0, reinterpret_cast<sockaddr*>(&a), &al);
    if (r < 0) return false;
    if (ntohl(a.sin_addr.s_addr) != from_ip) continue;
    out.resize(static_cast<size_t>(r));
    if (from_port) *from_port = ntohs(a.sin_port);
    return true;
  }
}

size_t FakePeer::drain() {
  size_t n = 0;
  uint8_t sink[65536];
  while (recv(fd_, sink, sizeof sink, MSG_DONTWAIT) >= 0) ++n;
  return n;
}

FakePeerQp::FakePeerQp(Device& dev, uint32_t peer_qpn, uint32_t peer_psn, uint32_t device_psn) {
  o.path_mtu = IBV_MTU_1024;
  o.timeout = 18;  // ~1 s
  o.psn = device_psn;
  if (!peer.open()) fail_fatal("no free 127.0.3.x:4791 for the fake peer");
  if (!create_endpoint(dev, o, ep)) fail_fatal("create_endpoint");
  if (!connect_endpoint(ep, o, peer.gid(), peer_qpn, peer_psn)) fail_fatal("connect");
}

FakePeerQp::~FakePeerQp() {
  destroy_endpoint(ep);
}

}  // namespace softrdma::verbs_test::raw
