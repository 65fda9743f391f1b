// Places a device's Counters in a shared-memory file (/dev/shm/softrdma.<ipv4>.<pid>)
// that `softrdma stat` reads; falls back to private memory when /dev/shm is unusable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/counters.h"

namespace softrdma::engine {

/// Owns the published counter block of one device; unlinks the file on destruction.
class CounterPublisher {
 public:
  /// `ip` host order. With `publish` false the counters live in private memory only.
  CounterPublisher(uint32_t ip, bool publish);
  ~CounterPublisher();
  CounterPublisher(const CounterPublisher&) = delete;
  CounterPublisher& operator=(const CounterPublisher&) = delete;
  Counters& counters() { return *counters_; }
  /// The shared-memory file, empty when not published.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::unique_ptr<Counters> owned_;
  Counters* counters_ = nullptr;
};

}  // namespace softrdma::engine
