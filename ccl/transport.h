// The point-to-point interface softrdma's collective algorithms are written against — the
// Gloo model (gloo/transport/pair.h): algorithms over a tiny transport, so an algorithm can
// be read and tested without the network and a transport changes no algorithm.
//
// An algorithm sees ranks, registered buffers and tagged, non-blocking send/recv of buffer
// ranges — never QPs. The transport does the rendezvous and the flow control: a recv
// advertises where its bytes go, and the matching send writes them there (the verbs
// transport: the receiver sends {addr, rkey, tag} over a control channel, the sender does an
// RDMA WRITE with immediate, the immediate completes the recv), so a send never overwrites a
// buffer its receiver has not offered.
//
// Implementations: ccl/verbs_transport (RC QPs over plain libibverbs) and the in-process
// LoopbackTransport (ccl/loopback_transport.h: threads and memcpy, for testing algorithms).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace softrdma::ccl {

/// Raised when a peer dies, stalls past the timeout, or a transfer to it fails. The
/// message names the operation, the local rank and the peer rank, e.g.
/// "AllReduce: rank 2: peer rank 3 (127.0.0.4): no progress within 10000 ms".
class PeerError : public std::runtime_error {
 public:
  PeerError(const std::string& what, int peer) : std::runtime_error(what), peer_(peer) {}
  /// The peer rank at fault (-1 when unknown).
  int peer() const { return peer_; }

 private:
  int peer_;
};

/// Memory registered with the transport (an MR on verbs). Registration is the expensive
/// step: algorithms keep buffers across calls (the communicator's registration cache).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() const = 0;
  /// Bytes.
  virtual size_t size() const = 0;
};

/// Identifies one posted send or recv until wait() completes it.
using RequestId = uint64_t;

/// Point-to-point operations among the ranks of one communicator; one thread per rank
/// calls them. Errors: PeerError (peer dead or stalled past timeout(), or transfer
/// failure), std::invalid_argument (bad rank, range outside the buffer, zero tag reuse).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// A peer for error messages, e.g. "rank 3 (127.0.0.4)".
  virtual std::string peer_description(int peer) const = 0;
  /// How long a blocking call waits without progress from a peer before PeerError.
  virtual std::chrono::milliseconds timeout() const = 0;

  /// Registers [data, data+bytes) for sends and receives.
  virtual std::unique_ptr<Buffer> register_buffer(void* data, size_t bytes) = 0;

  /// Posts a send of `bytes` at `offset` of `buf` to `peer`, matched with the recv that
  /// `peer` posts with the same `tag` (tags are per ordered pair of ranks; a tag may be
  /// reused once its previous transfer completed). Zero-byte transfers are allowed.
  virtual RequestId send(int peer, const Buffer& buf, size_t offset, size_t bytes,
                         uint64_t tag) = 0;
  /// Posts a recv of exactly `bytes` into `offset` of `buf` from `peer` with `tag`.
  virtual RequestId recv(int peer, Buffer& buf, size_t offset, size_t bytes, uint64_t tag) = 0;
  /// Blocks until the request completed (send: source reusable; recv: data landed).
  /// `op` names the collective for error messages.
  virtual void wait(RequestId id, const char* op) = 0;
  /// Non-blocking: true once the request completed (then it needs no wait()).
  virtual bool test(RequestId id, const char* op) = 0;

  /// Blocks until every rank has called barrier().
  virtual void barrier(const char* op) = 0;

  /// Bytes in flight that keep the path to `peer` busy — its bandwidth-delay product, e.g.
  /// the round-trip time measured at connect × the local port's rate. 0 when unknown (the
  /// collectives then keep Config::depth chunks in flight). Never blocks.
  virtual uint64_t path_bytes(int /*peer*/) const { return 0; }
};

}  // namespace softrdma::ccl
