#include "net/udp_port.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <utility>
#include <vector>

namespace softrdma::net {

std::string ipv4_to_string(uint32_t ip) {
  in_addr a{htonl(ip)};
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

bool ipv4_from_string(const std::string& s, uint32_t& ip) {
  in_addr a{};
  if (inet_pton(AF_INET, s.c_str(), &a) != 1) return false;
  ip = ntohl(a.s_addr);
  return true;
}

namespace {

/// Asks for `bytes` of socket buffer: SO_RCVBUFFORCE / SO_SNDBUFFORCE where permitted
/// (CAP_NET_ADMIN), else the plain option, which net.core.{r,w}mem_max caps.
void ask_buffer(int fd, int force_opt, int opt, int bytes) {
  if (bytes > 0 && setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof bytes) != 0)
    setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof bytes);
}

}  // namespace

UdpPort::~UdpPort() {
  if (fd_ >= 0) ::close(fd_);
}

int UdpPort::bind(uint32_t ip, uint16_t port, int buffer_bytes) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  // No SO_REUSEADDR: for UDP it would let two devices share an address.
  int pmtu = IP_PMTUDISC_DO;
  setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  ask_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, buffer_bytes);
  ask_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, buffer_bytes);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(ip);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    int e = errno;
    ::close(fd);
    return e;
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  // Multicast sends (UD to a multicast GID) leave by this address's interface, not by the
  // default route (which a container without a network lacks), and loop back to the
  // host's members.
  ip_mreqn via{};
  via.imr_address.s_addr = htonl(ip);
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &via, sizeof via);
  int loop = 1;
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof loop);
  // Each datagram carries the socket's count of datagrams dropped for a full receive buffer
  // (socket(7) SO_RXQ_OVFL): losses nobody else counts (receive_overflows()).
  int ovfl = 1;
  rxq_ovfl_ = setsockopt(fd, SOL_SOCKET, SO_RXQ_OVFL, &ovfl, sizeof ovfl) == 0;
  fd_ = fd;
  ip_ = ip;
  port_ = ntohs(sa.sin_port);
  return 0;
}

int UdpPort::join_group(uint32_t group, uint16_t port, uint32_t iface_ip, int buffer_bytes) {
  if (fd_ >= 0 || !IN_MULTICAST(group)) return EINVAL;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int on = 1, off = 0;
  // SO_REUSEADDR on a multicast address: each member socket gets a copy (udp(7)).
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &off, sizeof off);
  ask_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, buffer_bytes);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(group);
  ip_mreqn m{};
  m.imr_multiaddr.s_addr = htonl(group);
  m.imr_address.s_addr = htonl(iface_ip);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m) != 0) {
    const int e = errno;
    ::close(fd);
    return e;
  }
  fd_ = fd;
  ip_ = group;
  port_ = port;
  group_ = group;
  return 0;
}

int UdpPort::rebind(uint32_t ip, uint16_t port, int buffer_bytes) {
  UdpPort fresh;
  if (int e = fresh.bind(ip, port, buffer_bytes); e != 0) return e;
  if (gso_) fresh.enable_gso();
  if (gro_) fresh.enable_gro();
  if (header_info_) fresh.enable_header_info();
  if (recverr_) fresh.enable_error_queue();
  if (tos_ & 0x3) fresh.set_ecn_capable();
  std::swap(fd_, fresh.fd_);  // the old socket closes with `fresh`
  ip_ = fresh.ip_;
  port_ = fresh.port_;
  gso_ = fresh.gso_;
  gro_ = fresh.gro_;
  rxq_ovfl_ = fresh.rxq_ovfl_;
  overflow_base_ += overflows_;  // the new socket counts from 0
  overflows_ = 0;
  return 0;
}

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

bool UdpPort::enable_gso() {
  // Probe: setting a socket-wide segment size of 0 (off) succeeds only where the option
  // exists (Linux ≥ 4.18); sends then set the size per message in a cmsg.
  int zero = 0;
  gso_ = setsockopt(fd_, SOL_UDP, UDP_SEGMENT, &zero, sizeof zero) == 0;
  return gso_;
}

bool UdpPort::enable_gro() {
  int on = 1;
  gro_ = setsockopt(fd_, SOL_UDP, UDP_GRO, &on, sizeof on) == 0;
  return gro_;
}

size_t UdpPort::send_batch(std::span<const TxDatagram> batch, size_t& errors) {
  errors = 0;
  constexpr size_t kMax = 64;
  constexpr size_t kCtl = CMSG_SPACE(sizeof(uint16_t)) + CMSG_SPACE(sizeof(int));
  std::array<mmsghdr, kMax> msgs;
  std::array<sockaddr_in, kMax> addrs;
  alignas(cmsghdr) std::array<std::array<uint8_t, kCtl>, kMax> ctl;
  // Without GSO a segmented datagram goes out segment by segment (as its own sendmmsg
  // entries): split its gather list at segment boundaries.
  std::vector<TxDatagram> split;
  std::vector<iovec> split_iov;
  if (!gso_) {
    bool any = false;
    for (const TxDatagram& d : batch) any |= d.segment_size != 0;
    if (any) {
      size_t total_iov = 0;
      for (const TxDatagram& d : batch) total_iov += d.iov_count * 2 + 1;
      split_iov.reserve(total_iov * 2);
      std::vector<std::pair<size_t, size_t>> ranges;  // (first iov, count) per datagram
      std::vector<const TxDatagram*> owner;
      for (const TxDatagram& d : batch) {
        if (!d.segment_size) {
          ranges.emplace_back(split_iov.size(), d.iov_count);
          split_iov.insert(split_iov.end(), d.iov, d.iov + d.iov_count);
          owner.push_back(&d);
          continue;
        }
        size_t left = d.segment_size, first = split_iov.size();
        for (size_t k = 0; k < d.iov_count; ++k) {
          auto* p = static_cast<uint8_t*>(d.iov[k].iov_base);
          size_t len = d.iov[k].iov_len;
          while (len) {
            const size_t take = std::min(len, left);
            split_iov.push_back({p, take});
            p += take;
            len -= take;
            left -= take;
            if (left == 0) {
              ranges.emplace_back(first, split_iov.size() - first);
              owner.push_back(&d);
              first = split_iov.size();
              left = d.segment_size;
            }
          }
        }
        if (split_iov.size() > first) {
          ranges.emplace_back(first, split_iov.size() - first);
          owner.push_back(&d);
        }
      }
      split.reserve(ranges.size());
      for (size_t i = 0; i < ranges.size(); ++i)
        split.push_back({split_iov.data() + ranges[i].first, ranges[i].second, owner[i]->dst_ip,
                         owner[i]->dst_port, 0, owner[i]->ecn_ce});
      batch = split;
    }
  }
  size_t done = 0;
  while (done < batch.size()) {
    size_t n = std::min(kMax, batch.size() - done);
    for (size_t i = 0; i < n; ++i) {
      const TxDatagram& d = batch[done + i];
      addrs[i] = sockaddr_in{};
      addrs[i].sin_family = AF_INET;
      addrs[i].sin_port = htons(d.dst_port);
      addrs[i].sin_addr.s_addr = htonl(d.dst_ip);
      msgs[i] = mmsghdr{};
      msgs[i].msg_hdr.msg_name = &addrs[i];
      msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
      msgs[i].msg_hdr.msg_iov = const_cast<iovec*>(d.iov);
      msgs[i].msg_hdr.msg_iovlen = d.iov_count;
      if (d.segment_size || d.ecn_ce) {
        msgs[i].msg_hdr.msg_control = ctl[i].data();
        msgs[i].msg_hdr.msg_controllen = (d.segment_size ? CMSG_SPACE(sizeof(uint16_t)) : 0) +
                                         (d.ecn_ce ? CMSG_SPACE(sizeof(int)) : 0);
        cmsghdr* c = CMSG_FIRSTHDR(&msgs[i].msg_hdr);
        if (d.segment_size) {
          c->cmsg_level = SOL_UDP;
          c->cmsg_type = UDP_SEGMENT;
          c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
          std::memcpy(CMSG_DATA(c), &d.segment_size, sizeof(uint16_t));
          c = CMSG_NXTHDR(&msgs[i].msg_hdr, c);
        }
        if (d.ecn_ce) {
          // ip(7) IP_TOS as ancillary data: this datagram's TOS byte, ECN bits CE.
          const int tos = tos_ | 0x3;
          c->cmsg_level = IPPROTO_IP;
          c->cmsg_type = IP_TOS;
          c->cmsg_len = CMSG_LEN(sizeof(int));
          std::memcpy(CMSG_DATA(c), &tos, sizeof tos);
        }
      }
    }
    int r = ::sendmmsg(fd_, msgs.data(), static_cast<unsigned>(n), MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if ((errno == EIO || errno == EINVAL) && gso_ && batch[done].segment_size) {
        // The route's device cannot segment (no checksum offload: EIO), or the kernel
        // refuses this batch's shape: stop using GSO on this socket and send the rest
        // segment by segment. Without this, every retransmission would fail the same way.
        gso_ = false;
        size_t more = 0;
        send_batch(batch.subspan(done), more);
        errors += more;
        return batch.size();
      }
      // The first datagram failed (buffer full, unreachable, …): count it lost and go on;
      // the transport's retransmission timer owns recovery.
      ++errors;
      ++done;
      continue;
    }
    done += static_cast<size_t>(r);
  }
  return batch.size();
}

void UdpPort::enable_header_info() {
  int on = 1;
  setsockopt(fd_, IPPROTO_IP, IP_RECVTTL, &on, sizeof on);
  setsockopt(fd_, IPPROTO_IP, IP_RECVTOS, &on, sizeof on);
  header_info_ = true;
}

void UdpPort::enable_error_queue() {
  int on = 1;
  recverr_ = setsockopt(fd_, IPPROTO_IP, IP_RECVERR, &on, sizeof on) == 0;
}

size_t UdpPort::read_unreachable(std::vector<uint32_t>& out) {
  size_t n = 0;
  for (; n < 256; ++n) {
    sockaddr_in to{};
    uint8_t data[64];
    iovec iov{data, sizeof data};
    alignas(cmsghdr) uint8_t ctl[CMSG_SPACE(sizeof(sock_extended_err) + sizeof(sockaddr_in))];
    msghdr m{};
    m.msg_name = &to;
    m.msg_namelen = sizeof to;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (::recvmsg(fd_, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) break;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != IPPROTO_IP || c->cmsg_type != IP_RECVERR) continue;
      sock_extended_err e;
      std::memcpy(&e, CMSG_DATA(c), sizeof e);
      // msg_name is the address the failed datagram was sent to (ip(7), IP_RECVERR).
      if (e.ee_origin == SO_EE_ORIGIN_ICMP && e.ee_type == 3 && m.msg_namelen >= sizeof to)
        out.push_back(ntohl(to.sin_addr.s_addr));
    }
  }
  return n;
}

int UdpPort::set_ecn_capable() {
  const int tos = (tos_ & ~0x3) | 0x2;  // ECT(0)
  if (setsockopt(fd_, IPPROTO_IP, IP_TOS, &tos, sizeof tos) != 0) return errno;
  tos_ = static_cast<uint8_t>(tos);
  return 0;
}

uint8_t UdpPort::tx_ttl() const {
  int v = 64;
  socklen_t len = sizeof v;
  getsockopt(fd_, IPPROTO_IP, IP_TTL, &v, &len);
  return static_cast<uint8_t>(v);
}

uint8_t UdpPort::tx_tos() const {
  int v = 0;
  socklen_t len = sizeof v;
  getsockopt(fd_, IPPROTO_IP, IP_TOS, &v, &len);
  return static_cast<uint8_t>(v);
}

size_t UdpPort::recv_batch(std::span<RxDatagram> slots) {
  constexpr size_t kMax = 64;
  constexpr size_t kCtl = CMSG_SPACE(sizeof(int)) * 3 + CMSG_SPACE(sizeof(uint32_t));
  std::array<mmsghdr, kMax> msgs;
  std::array<iovec, kMax> iovs;
  std::array<sockaddr_in, kMax> addrs;
  alignas(cmsghdr) std::array<std::array<uint8_t, kCtl>, kMax> ctl;
  size_t n = std::min(kMax, slots.size());
  for (size_t i = 0; i < n; ++i) {
    iovs[i] = iovec{slots[i].data, slots[i].capacity};
    msgs[i] = mmsghdr{};
    msgs[i].msg_hdr.msg_name = &addrs[i];
    msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
    msgs[i].msg_hdr.msg_iov = &iovs[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
    if (header_info_ || gro_ || rxq_ovfl_) {
      msgs[i].msg_hdr.msg_control = ctl[i].data();
      msgs[i].msg_hdr.msg_controllen = kCtl;
    }
  }
  int r;
  do {
    r = ::recvmmsg(fd_, msgs.data(), static_cast<unsigned>(n), MSG_DONTWAIT, nullptr);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return 0;
  for (int i = 0; i < r; ++i) {
    RxDatagram& s = slots[static_cast<size_t>(i)];
    s.length = msgs[i].msg_len;
    s.truncated = (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) != 0;
    s.src_ip = ntohl(addrs[i].sin_addr.s_addr);
    s.src_port = ntohs(addrs[i].sin_port);
    s.dst_ip = group_;
    s.ttl = s.tos = 0;
    s.segment_size = 0;
    if (!header_info_ && !gro_ && !rxq_ovfl_) continue;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c; c = CMSG_NXTHDR(&msgs[i].msg_hdr, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
        uint32_t v;
        std::memcpy(&v, CMSG_DATA(c), sizeof v);
        overflows_ = v;  // the socket's running total (sk_drops)
        continue;
      }
      if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
        int v;
        std::memcpy(&v, CMSG_DATA(c), sizeof v);
        // A "coalesced" buffer of one datagram is just a datagram.
        if (v > 0 && static_cast<size_t>(v) < s.length) s.segment_size = static_cast<uint16_t>(v);
        continue;
      }
      if (c->cmsg_level != IPPROTO_IP) continue;
      if (c->cmsg_type == IP_TTL) {
        int v;
        std::memcpy(&v, CMSG_DATA(c), sizeof v);
        s.ttl = static_cast<uint8_t>(v);
      } else if (c->cmsg_type == IP_TOS) {
        s.tos = *CMSG_DATA(c);
      }
    }
  }
  return static_cast<size_t>(r);
}

}  // namespace softrdma::net
