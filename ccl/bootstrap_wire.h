// The TCP bootstrap's wire protocol (internal to ccl/), shared by the root
// (bootstrap_root.cpp) and its clients (bootstrap_client.cpp).
//
// Every frame = u32 type + u32 length, network byte order, then `length` bytes:
//   client → root  HELLO {u64 magic, u32 nranks, u32 rank}   once, first
//   client → root  DATA  {bytes}                             one per all_gather round
//   root → client  DATA  {n × (u32 length, bytes)}           when every rank sent its DATA
//   client → root  BYE   {}                                  done; the root exits after all
//   root → client  ERROR {text}                              the job failed; the root exits
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "base/clock.h"
#include "base/deadline_socket.h"

namespace softrdma::ccl::bootstrap_wire {

using Clock = clock::Steady;  // virtual under time dilation (base/clock.h)

enum Frame : uint32_t { kHello = 1, kData = 2, kBye = 3, kError = 4 };
/// Largest payload accepted; a longer length field marks the stream malformed.
inline constexpr uint32_t kMaxFrame = 64u << 20;

/// "30000 ms".
std::string ms_text(std::chrono::milliseconds t);
using base::remaining_ms;  // milliseconds until a deadline (base/deadline_socket.h)

void put_u32(std::string& s, uint32_t v);
uint32_t get_u32(const char* p);
void put_u64(std::string& s, uint64_t v);
uint64_t get_u64(const char* p);

/// One frame of `type` carrying `payload`.
std::string frame(uint32_t type, const std::string& payload);

using base::send_all;  // all of a frame before a deadline (base/deadline_socket.h)

/// Accumulates bytes from a non-blocking socket and splits frames.
struct FrameReader {
  std::string buf;
  /// True with type/payload filled when a whole frame is buffered; `malformed` when the
  /// next frame's length exceeds kMaxFrame.
  bool next(uint32_t& type, std::string& payload, bool& malformed);
  /// Reads what is available; returns false on EOF or error.
  bool fill(int fd);
};

}  // namespace softrdma::ccl::bootstrap_wire
