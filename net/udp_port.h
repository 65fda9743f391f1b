// UDP endpoint of one softrdma device: a socket bound to <ipv4>:4791 with batched
// send (sendmmsg) and receive (recvmmsg). RoCEv2 peers always send to UDP port 4791, so
// one socket per device address carries every QP; the engine demultiplexes by BTH QPN.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace softrdma::net {

/// Formats a host-order IPv4 address as a dotted quad.
std::string ipv4_to_string(uint32_t host_order_ip);
/// Parses a dotted quad; returns false on malformed input.
bool ipv4_from_string(const std::string& s, uint32_t& host_order_ip);

/// One datagram to send: a gather list and the destination (host order). With
/// `segment_size` set (UDP GSO, Linux udp(7) UDP_SEGMENT) the kernel cuts the gathered bytes
/// into datagrams of `segment_size` bytes each, the last one possibly shorter; each
/// becomes its own UDP datagram on the wire (IPv4 ids counting up from the first's).
struct TxDatagram {
  const iovec* iov = nullptr;
  size_t iov_count = 0;
  uint32_t dst_ip = 0;
  uint16_t dst_port = 0;
  uint16_t segment_size = 0;  ///< 0: one datagram; else GSO segment size, bytes
  /// Leaves with the IPv4 ECN field set to Congestion Experienced (RFC 3168: 0b11) — the
  /// mark an emulated link's queue put on it (an IP_TOS cmsg on this one datagram; with
  /// segment_size, on every segment). false: the socket's TOS (set_ecn_capable()).
  bool ecn_ce = false;
};

/// Most segments one GSO send may carry (the kernel's UDP_MAX_SEGMENTS is 64 or more).
inline constexpr size_t kMaxGsoSegments = 64;
/// Most bytes one GSO send may carry: one IPv4 datagram's worth (65535 − 20 − 8).
inline constexpr size_t kMaxGsoBytes = 65507;

/// One received datagram: bytes in a caller-provided buffer and where they came from.
struct RxDatagram {
  uint8_t* data = nullptr;  ///< caller's buffer
  size_t capacity = 0;      ///< its size, bytes
  size_t length = 0;        ///< bytes received (valid after recv_batch)
  bool truncated = false;   ///< datagram was larger than capacity (MSG_TRUNC)
  /// UDP GRO (after enable_gro()): the kernel coalesced datagrams of this size (bytes), all
  /// from one sender; the buffer holds them back to back, the last possibly shorter.
  /// 0: the buffer is one datagram.
  uint16_t segment_size = 0;
  uint32_t src_ip = 0;  ///< host order
  uint16_t src_port = 0;
  uint8_t ttl = 0;  ///< IPv4 TTL as received (after enable_header_info(); else 0)
  uint8_t tos = 0;  ///< IPv4 TOS as received (after enable_header_info(); else 0)
  /// The destination address when it is not the receiving device's own: the multicast
  /// group a group socket (UdpPort::join_group) received it for. 0: the device's address.
  uint32_t dst_ip = 0;
};

/// A non-blocking UDP socket bound to one IPv4 address and port.
class UdpPort {
 public:
  UdpPort() = default;
  ~UdpPort();
  UdpPort(const UdpPort&) = delete;
  UdpPort& operator=(const UdpPort&) = delete;

  /// Binds ip:port (host order). DF is set (IP_PMTUDISC_DO) so the kernel sends IPv4 id 0
  /// from this unconnected socket, which keeps our ICRC exactly checkable by receivers.
  /// Datagrams to multicast groups leave through the interface that holds `ip`
  /// (IP_MULTICAST_IF; on 127.0.0.0/8 the loopback), looped back to this host's members.
  /// Asks for `buffer_bytes` of socket buffer each way (SO_RCVBUFFORCE when permitted,
  /// else SO_RCVBUF capped by net.core.rmem_max). Returns 0 or an errno value
  /// (EADDRINUSE when another process holds the address).
  int bind(uint32_t ip, uint16_t port, int buffer_bytes);

  /// Binds a new socket to ip:port with this one's options (buffers, GSO, GRO, header
  /// info, TOS) and, when that succeeds, closes this one and uses the new one. Returns 0 or
  /// the bind's errno (EADDRINUSE: the port is still held), this socket unchanged then.
  /// For a process that shares an address and takes port 4791 over when its owner exits.
  int rebind(uint32_t ip, uint16_t port, int buffer_bytes);

  /// Joins IPv4 multicast group `group` (host order, 224.0.0.0/4) for receiving: binds a
  /// new socket to group:port with SO_REUSEADDR — every device on the host that joins the
  /// group has its own socket and gets its own copy of each datagram, as every NIC
  /// subscribed to a group does — and adds the membership on the interface that holds
  /// `iface_ip` (RFC 1112; Linux ip(7) IP_ADD_MEMBERSHIP), IP_MULTICAST_ALL off so only this
  /// group's datagrams arrive. The membership ends when the socket closes. Returns 0 or an
  /// errno: EINVAL (not a multicast address, or already bound), ENODEV (no interface holds
  /// iface_ip), ENOBUFS (the kernel's net.ipv4.igmp_max_memberships).
  int join_group(uint32_t group, uint16_t port, uint32_t iface_ip, int buffer_bytes);
  /// The multicast group this socket was joined to (join_group), or 0.
  uint32_t group() const { return group_; }

  /// The socket descriptor (for epoll), or -1.
  int fd() const { return fd_; }
  /// The bound UDP port (host order; the one the kernel picked for a bind to port 0).
  uint16_t port() const { return port_; }
  uint32_t ip() const { return ip_; }

  /// Sends `batch` with sendmmsg (64 entries per call). Returns batch.size(): datagrams the
  /// kernel refuses with a transient error count as sent and lost (RoCE recovers them by
  /// retransmission); `errors` gets the number refused. A GSO entry the kernel rejects with
  /// EIO or EINVAL (a device without checksum offload) turns GSO off for this socket and is
  /// sent again segment by segment.
  size_t send_batch(std::span<const TxDatagram> batch, size_t& errors);

  /// Turns on UDP_SEGMENT (GSO) sends if the kernel supports it; returns whether it
  /// does. Without it, send_batch() sends TxDatagrams with segment_size set as separate
  /// datagrams (the same bytes on the wire, one system call per segment batch).
  bool enable_gso();
  bool gso() const { return gso_; }
  /// Turns on UDP_GRO receives (coalesced datagrams, reported through
  /// RxDatagram::segment_size; give recv_batch buffers of kMaxGsoBytes). Returns whether
  /// the kernel supports it.
  bool enable_gro();
  bool gro() const { return gro_; }

  /// Asks the kernel to report each received datagram's IPv4 TTL and TOS (IP_RECVTTL,
  /// IP_RECVTOS) — packet capture wants the headers that crossed the wire.
  void enable_header_info();
  /// Asks the kernel to queue ICMP errors for this unconnected socket (IP_RECVERR, ip(7)):
  /// a datagram sent to a port nobody holds (a dead peer's) draws "port unreachable", which
  /// read_unreachable() then reports. The socket turns readable with EPOLLERR while errors
  /// wait: its owner must call read_unreachable() then, or epoll keeps waking.
  void enable_error_queue();
  /// Reads every queued ICMP error (MSG_ERRQUEUE, at most 256; never blocks) and appends to
  /// `out` the destination address (host order) of each datagram that drew "destination
  /// unreachable" (ICMP type 3: port, host or network). Returns the errors read.
  size_t read_unreachable(std::vector<uint32_t>& out);
  /// Sends ECN-capable transport, ECT(0) (RFC 3168: ECN field 0b10, what RoCEv2 NICs with
  /// ECN on send), in every datagram's IPv4 header from now on. Returns 0 or an errno.
  int set_ecn_capable();
  /// This socket's outgoing IPv4 TTL and TOS.
  uint8_t tx_ttl() const;
  uint8_t tx_tos() const;

  /// Receives up to `slots.size()` datagrams without blocking. Returns the number filled
  /// (0 when none is waiting).
  size_t recv_batch(std::span<RxDatagram> slots);
  /// Datagrams the kernel dropped on this socket since it was bound because its receive
  /// buffer was full, as of the last datagram received (SO_RXQ_OVFL, socket(7); 0 where the
  /// kernel does not report it). Such losses reach no other counter: the peer sees them as
  /// NAKs or timeouts.
  uint64_t receive_overflows() const { return overflow_base_ + overflows_; }

 private:
  int fd_ = -1;
  uint32_t ip_ = 0;
  uint16_t port_ = 0;
  bool header_info_ = false;
  bool rxq_ovfl_ = false;       // SO_RXQ_OVFL on: overflows_ is kept
  uint64_t overflows_ = 0;      // receive_overflows(): this socket's
  uint64_t overflow_base_ = 0;  // and the sockets' before a rebind
  bool recverr_ = false;        // enable_error_queue()
  uint8_t tos_ = 0;             // the TOS byte this socket sends (set_ecn_capable())
  bool gso_ = false;
  bool gro_ = false;
  uint32_t group_ = 0;
};

}  // namespace softrdma::net
