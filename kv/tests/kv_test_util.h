// Helpers of the kv tests: a fresh file store per test, byte patterns, engine options that
// find dead peers fast.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/engine.h"

namespace softrdma::kv::test {

/// A directory store under /tmp, removed with the object.
class TempStore {
 public:
  TempStore() {
    char tmpl[] = "/tmp/kv-test-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    store_ = std::make_shared<FileMetadataStore>(dir_);
  }
  ~TempStore() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::shared_ptr<MetadataStore> store() const { return store_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::shared_ptr<MetadataStore> store_;
};

/// Options for tests: several QPs and small slices (striping is exercised), and the engine's
/// own ACK timeout and retry count (4.096 µs·2^14 ≈ 67 ms, 8 tries ≈ 537 ms). A killed peer
/// still shows at the first timeout (the engine names a dead same-host process at once:
/// net/peer_liveness.h). A shorter timeout is wrong here, not just slow: with 4 QPs of READs
/// in flight the same-host path's queue (its lossless backlog) holds megabytes, and on a
/// loaded 2-core machine the peer drains it in tens of ms — 4.096 µs·2^10 (8 tries ≈ 34 ms)
/// exhausted retry_cnt with both peers alive (kv_devices under ctest -j2, CI stop 39).
inline EngineOptions test_options() {
  EngineOptions o = EngineOptions::from_environment();
  o.qps_per_peer = 3;
  o.slice_bytes = 64 * 1024;
  o.max_wr = 16;
  o.ib_timeout = 14;
  o.retry_cnt = 7;
  o.spin = std::chrono::microseconds(20);
  o.connect_timeout = std::chrono::milliseconds(5000);
  return o;
}

/// Byte i of a buffer tagged `seed`.
inline uint8_t pattern(uint64_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed * 0xbf58476d1ce4e5b9ull;
  return static_cast<uint8_t>(x >> 29);
}

inline void fill(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = pattern(seed, i);
}

/// The index of the first byte that differs from the pattern, or -1.
inline int64_t first_mismatch(const void* p, size_t n, uint64_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != pattern(seed, i)) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace softrdma::kv::test
