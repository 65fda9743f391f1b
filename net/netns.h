// The network namespace that a same-host name is scoped to (issue 21).
//
// softrdma's same-host meeting points — the shared-memory mailbox of an address
// (net/shm_port.h), the address's share registry (net/address_share.h) and its rdma_cm port
// table (cm/shared_ports.h) — are files in /dev/shm, which every network namespace of the host
// sees, and their owners are checked with kill(pid, 0), which crosses network namespaces too.
// The abstract unix sockets that go with them (the mailbox's doorbell, the share's slot
// sockets) and the UDP port 4791 that owns an address belong to one network namespace. Two
// processes in different network namespaces are different hosts for RoCE, even when both use
// the same IPv4 address, so each of those file names carries the namespace it belongs to:
// "<prefix>shm-ns<inode>-<a.b.c.d>" and so on (netns_scope()). Processes in two namespaces then
// never find each other's files: they talk UDP, over whatever link joins the namespaces, and
// one address in two namespaces is two separate devices.
#pragma once

#include <cstdint>
#include <string>

namespace softrdma::net {

/// The network namespace of the calling thread: the inode number of /proc/thread-self/ns/net
/// (/proc/self/ns/net where thread-self is missing), which names the namespace uniquely while
/// it exists (it exists while any of its sockets does). 0 when /proc is not mounted or not
/// readable: same-host names are then unscoped, and ShmPort still only talks to a peer whose
/// doorbell it can reach. About 1 µs (two stat calls): callers resolve it once, at open.
uint64_t current_netns();

/// The part of a same-host file name that scopes it to network namespace `netns` (a
/// current_netns() value): "ns<netns>-", or "" for 0 (unscoped).
std::string netns_scope(uint64_t netns);

}  // namespace softrdma::net
