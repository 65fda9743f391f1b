// LoopbackTransport: the Transport of ccl/transport.h for N ranks that are N threads of one
// process, for testing the collective algorithms without a network.
//
// Semantics are those of the verbs transport: a send and a recv match by (source rank,
// destination rank, tag); the data is copied (memcpy) when the second of the two is posted,
// and both complete then — a send never completes before its recv was posted (rendezvous).
// Bytes must agree; a mismatch fails both requests. Waits are bounded: a wait fails with
// PeerError once the peer made no transport call for timeout() (a peer blocked in a wait
// of its own makes no progress), or at once when the peer was killed or destroyed its
// transport. Nothing spins: blocked calls sleep on a condition variable with a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "ccl/transport.h"

namespace softrdma::ccl {

namespace detail {
struct LoopbackState;
}

/// The shared medium of `size` in-process ranks. Hand transport(r) to the thread of rank r.
/// The fabric may be destroyed before or after the transports (they share its state).
/// Thread-safe.
class LoopbackFabric {
 public:
  /// `timeout`: Transport::timeout() of every rank (default 30 s). Throws
  /// std::invalid_argument for size < 1 or a non-positive timeout.
  explicit LoopbackFabric(int size,
                          std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));
  ~LoopbackFabric();
  LoopbackFabric(const LoopbackFabric&) = delete;
  LoopbackFabric& operator=(const LoopbackFabric&) = delete;

  int size() const;
  /// The transport of `rank`; at most once per rank (std::logic_error on the second call),
  /// std::invalid_argument for a rank out of range.
  std::unique_ptr<Transport> transport(int rank);

  /// Makes `rank` die: its pending and future transfers fail, every rank waiting on it gets
  /// PeerError naming it ("peer rank 2 (loopback): killed"), and its own later calls throw
  /// PeerError. Idempotent.
  void kill(int rank);
  /// Changes timeout() for all ranks (waits already blocked pick it up on their next wake).
  void set_timeout(std::chrono::milliseconds timeout);

  /// Transport::register_buffer calls made by `rank` so far (a test hook for registration
  /// caching).
  uint64_t registrations(int rank) const;
  /// Buffers of `rank` registered and not yet destroyed.
  uint64_t live_buffers(int rank) const;
  /// Transfers (completed send/recv pairs) from `src` to `dst` so far.
  uint64_t transfers(int src, int dst) const;
  /// Makes every transport's path_bytes() return `bytes` (default 0, "unknown"), as if the
  /// ranks were that many bytes of bandwidth-delay product apart.
  void set_path_bytes(uint64_t bytes);
  /// Recvs that `dst` posted from `src` and no send has matched yet (a test hook for the
  /// depth of the pipelines).
  uint64_t posted_recvs(int src, int dst) const;

 private:
  std::shared_ptr<detail::LoopbackState> state_;
};

}  // namespace softrdma::ccl
