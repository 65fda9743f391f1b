// Streaming traffic shared by the verbs tests: a window loop that keeps WRs in flight and
// checks their completions in order, sequenced messages (a sequence number, then a
// pattern), and the exactly-once-in-order workload that loss_test and paths_test drive
// through injected loss (SENDs, WRITEs with immediate, READs), each checked at its end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {

/// Posts WRs 0 … count − 1 with `post(i)` (which posts WR i with wr_id i), at most `window`
/// outstanding, and polls their completions from `scq`, waiting up to `timeout` for each:
/// each must be a success of wr_id i, in order (fatal failure otherwise; the message names
/// `what`, the index and ends with `context()`). `check(i)` runs after WR i completed.
/// Returns at the first fatal failure, also one recorded by `post` or `check`.
void run_window(ibv_cq* scq, const char* what, int count, int window, milliseconds timeout,
                const std::function<void(int)>& post, const std::function<void(int)>& check = {},
                const std::function<std::string()>& context = {});

/// Writes a sequenced message into p[0, len), len ≥ 4: `seq` in its first 4 bytes (host
/// order), pattern bytes [4, len) of `seed` after it.
void fill_sequenced(uint8_t* p, uint32_t len, uint32_t seq, uint64_t seed);
/// gtest predicate: p[0, len) is the message fill_sequenced(p, len, seq, seed) wrote; a
/// different sequence number means a message delivered out of order or twice.
::testing::AssertionResult IsSequenced(const uint8_t* p, uint32_t len, uint32_t seq, uint64_t seed);

/// The exactly-once-in-order workload between a requester and a target role:
///  - `sends` SENDs, SEND i a sequenced message of send_len(i) bytes (seq i, pattern i);
///  - `writes` WRITEs with immediate, WRITE j: imm j (network order), write_len(j) bytes of
///    pattern write_seed0 + j at the target's write_base + j · write_stride;
///  - `reads` READs, READ j: read_len(j) bytes at offset read_off(j) of the target's
///    pattern region (read_span bytes of pattern read_seed at read_base).
/// The requester keeps `window` SENDs / WRITEs and `read_window` READs in flight, each in
/// its own `slot`-byte piece of its buffer (so it needs window · slot bytes); the target
/// keeps `recv_depth` receives of `recv_size` bytes posted from the start of its buffer.
struct OrderedTraffic {
  int sends = 0;
  int writes = 0;
  int reads = 0;
  int window = 64;
  int read_window = 32;
  uint32_t slot = 8192;
  int recv_depth = 256;
  uint32_t recv_size = 4096;
  uint64_t write_base = 1 << 20;
  uint64_t write_stride = 6144;
  uint64_t write_seed0 = 0;
  uint64_t read_base = 0;
  uint64_t read_span = 1 << 20;
  uint64_t read_seed = 0;
  milliseconds timeout = 30s;  ///< for each completion

  static uint32_t send_len(int i);   ///< 8 … 3107 bytes: up to 4 packets at MTU 1024
  static uint32_t write_len(int j);  ///< 1 … 6000 bytes
  static uint32_t read_len(int j);   ///< 1 … 7000 bytes
  uint64_t read_off(int j) const;

  /// Requester, once the target is ready: the SENDs, then the WRITEs, then the READs, each
  /// through run_window; every READ's data and the guard bytes after it in its slot are
  /// checked. `context()` ends every failure message.
  void request(Role& r, const std::function<std::string()>& context = {}) const;
  /// Target, before it reports ready: fills the READ region and posts the receives.
  void prepare_target(Role& r) const;
  /// Target: every SEND and WRITE with immediate completes a receive exactly once, in order,
  /// byte for byte; each receive is posted again. `context()` ends the message of a
  /// completion that never came.
  void receive_all(Role& r, const std::function<std::string()>& context = {}) const;
};

}  // namespace softrdma::verbs_test
