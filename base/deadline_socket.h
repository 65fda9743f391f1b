// Sending and receiving on a stream socket within a deadline: the few calls the ccl bootstrap
// and the kv metadata/handshake sockets share. Deadlines are on the virtual clock
// (base/clock.h: dilated under SOFTRDMA_TDF); the kernel waits are converted to real time.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/clock.h"

namespace softrdma::base {

/// Milliseconds left until `deadline` (virtual), clamped to [0, 1e9]: 0 once it has passed.
int remaining_ms(clock::Steady::time_point deadline);

/// Sends all of `data` on the stream socket `fd` (blocking or not: MSG_DONTWAIT, and poll
/// for POLLOUT while the socket is full), retrying on EINTR, until `deadline`. MSG_NOSIGNAL:
/// a closed peer is an error, not SIGPIPE. Returns false on an error (errno from send) or
/// when the deadline passes first (errno unchanged: the caller names the timeout).
bool send_all(int fd, std::string_view data, clock::Steady::time_point deadline);

/// Receives exactly `n` bytes from the stream socket `fd` into `out` (resized to n), waiting
/// in slices of at most 1 s, until `deadline`. Returns false when the peer closes (0 bytes),
/// on an error, or when the deadline passes first.
bool recv_exact(int fd, size_t n, std::string& out, clock::Steady::time_point deadline);

}  // namespace softrdma::base
