// Blocking TCP helpers with deadlines, for the metadata store and the QP handshake (namespace
// kv::tcp: not the net/ layer, which kv does not use).
// (ccl/bootstrap_wire.h has its own for the ccl bootstrap: both are small, and a shared
// base/ socket library is the place to merge them once a third user appears.)
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/deadline_socket.h"

namespace softrdma::kv::tcp {

using Clock = clock::Steady;  // virtual under time dilation (base/clock.h)

/// An owned file descriptor (closed on destruction; movable).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  ~Fd();
  int get() const { return fd_; }
  int release();
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// Connects to host:port (a name or an address), retrying refused connections until
/// `deadline` when `retry` is set. Throws std::runtime_error with the errno text.
Fd connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline, bool retry);
/// A listening socket on host:port (port 0: any); `bound_port` gets the port. Throws
/// std::runtime_error.
Fd listen_tcp(const std::string& host, uint16_t port, uint16_t& bound_port);
/// Waits up to `timeout_ms` for a connection on `listener`; an invalid Fd on timeout.
Fd accept_tcp(int listener, int timeout_ms);

// All of `data`, exactly `n` bytes: false on error, end of stream or past the deadline
// (base/deadline_socket.h, shared with the ccl bootstrap).
using base::recv_exact;
using base::send_all;

/// Little-endian u32 append / read (the kv wire formats are little-endian).
void put_u32(std::string& s, uint32_t v);
uint32_t get_u32(std::string_view s, size_t at);
void put_u64(std::string& s, uint64_t v);
uint64_t get_u64(std::string_view s, size_t at);
/// u32 length followed by the bytes.
void put_bytes(std::string& s, std::string_view b);

}  // namespace softrdma::kv::tcp
