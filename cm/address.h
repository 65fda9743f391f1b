// IPv4 address questions the RDMA-CM asks the host (no RDMA involved): which source address
// the kernel's routing would use towards a destination, whether an address is this host's,
// and whether a RoCEv2 endpoint (a UDP socket on port 4791: a softrdma device, or rxe) lives
// on a local address. All addresses are host order.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <cstdint>
#include <string>

namespace softrdma::cm {

/// The source address the kernel routes `dst` from (a connected UDP socket's local address;
/// no packet is sent). Returns 0 and sets `err` (ENETUNREACH, EHOSTUNREACH, …) when there is
/// no route.
uint32_t route_source(uint32_t dst, int& err);

/// True when `ip` is one of this host's addresses (127.0.0.0/8 or an interface's address).
bool is_local_address(uint32_t ip);

/// True when a UDP socket is bound to `ip`:4791 (or to 0.0.0.0:4791) on this host, read from
/// /proc/net/udp without binding anything (a probe bind could steal the address from a
/// device being opened at that moment). A miss is read twice more before it counts (the
/// file is not a snapshot: a row can be skipped while sockets close).
bool roce_endpoint_at(uint32_t ip);

/// The RoCEv2 GID of an IPv4 address: ::ffff:a.b.c.d (IPv4-mapped).
ibv_gid ipv4_gid(uint32_t ip);
/// The IPv4 address of an IPv4-mapped GID; 0 when it is not one.
uint32_t gid_ipv4(const uint8_t (&raw)[16]);

/// "a.b.c.d".
std::string ip_string(uint32_t ip);
/// The IPv4 address and port of `sa` when it is AF_INET (host order); false otherwise.
bool sockaddr_ipv4(const sockaddr* sa, uint32_t& ip, uint16_t& port);
/// Fills `sin` with AF_INET, `ip` and `port` (host order in, network order stored).
void make_sockaddr(sockaddr_in& sin, uint32_t ip, uint16_t port);

}  // namespace softrdma::cm
