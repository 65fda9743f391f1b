// WanShaper: the link emulator on a device's transmit path. For every packet the device
// sends it finds the topology link the packet crosses (none inside a site: sent untouched),
// asks that link's LinkEmulator what happens, and either lets the packet go now, drops it,
// or keeps a copy in a timed queue until its departure time. The device releases due
// packets from its progress loop and sleeps no longer than next_due_ns() — no thread spins
// for them.
//
// Sharing a bottleneck: the rate limit's state (the time the link is free again) lives in a
// small file in /dev/shm named after the topology's text, one cache line per link, so every
// process of a site sending over the same link queues behind the others, as ranks behind a
// real WAN link do. Each process keeps its own loss/jitter random state. The file is removed
// by the last process that closes it (flock-counted); a killed process leaves it for the
// next run or `softrdma stat --clean`. Everything else is per process.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <queue>
#include <span>
#include <string>
#include <vector>

#include "net/link_emulator.h"
#include "net/wan_topology.h"

namespace softrdma::net {

/// Where WanShaper keeps its shared link clocks.
struct WanShaperConfig {
  std::string dir = "/dev/shm";           ///< directory of the shared clock file
  std::string name_prefix = "softrdma-";  ///< file: <dir>/<prefix>wan-<hash of the topology>
  bool share_clock = true;                ///< false: a private bottleneck per process
};

/// Totals over every link this process sends on (packets).
struct WanCounters {
  uint64_t shaped = 0;         ///< packets that crossed a link
  uint64_t held = 0;           ///< copied into the timed queue (delay, queueing, duplicate…)
  uint64_t released = 0;       ///< left the timed queue
  uint64_t dropped_loss = 0;   ///< random loss
  uint64_t dropped_burst = 0;  ///< Gilbert–Elliott loss
  uint64_t dropped_queue = 0;  ///< tail drop at the link's FIFO limit
  uint64_t ecn_marked = 0;
  uint64_t duplicated = 0;
  uint64_t corrupted = 0;
  uint64_t reordered = 0;
};

/// What submit() decided.
enum class WanVerdict : uint8_t {
  kSendNow,  ///< not shaped, or due now and unmodified: send it as it is
  kHeld,     ///< copied into the timed queue; release() hands it back when due
  kDropped,  ///< lost on the link (counted)
};

/// The emulator on one device's transmit path (see the file comment). Not thread-safe: the
/// device calls it under its lock.
class WanShaper {
 public:
  /// A packet coming out of the timed queue.
  struct Packet {
    uint32_t dst_ip = 0;
    bool ecn_ce = false;  ///< the link marked it Congestion Experienced
    std::vector<uint8_t> bytes;
  };

  WanShaper() = default;
  ~WanShaper();
  WanShaper(const WanShaper&) = delete;
  WanShaper& operator=(const WanShaper&) = delete;

  /// Starts shaping the packets of device `local_ip` (IPv4, host order) by `topo`; `text`
  /// is the topology's source text (names the shared clock file). Returns 0 or an errno
  /// (the shared clock file could not be created or mapped).
  int open(uint32_t local_ip, const WanTopology& topo, const std::string& text,
           const WanShaperConfig& cfg = {});
  /// Stops shaping and drops the timed queue (its packets are lost, as on a link that went
  /// down); removes the shared clock file if no other process holds it.
  void close();
  bool is_open() const { return open_; }

  /// Decides the fate of a packet to `dst_ip` of `len` bytes gathered from `iov`, submitted
  /// at `now_ns` (clock::now_ns(), virtual). `ecn_ce` is set when it goes now CE-marked.
  WanVerdict submit(uint32_t dst_ip, const iovec* iov, size_t iovcnt, size_t len, uint64_t now_ns,
                    bool& ecn_ce);
  /// Hands every packet due at `now_ns` to fn(const Packet&), in departure order (ties in
  /// submission order). Returns how many.
  template <class F>
  size_t release(uint64_t now_ns, F&& fn) {
    size_t n = 0;
    while (!due_.empty() && due_.top().due_ns <= now_ns) {
      Held h = std::move(const_cast<Held&>(due_.top()));
      due_.pop();
      fn(static_cast<const Packet&>(h.pkt));
      ++counters_.released;
      ++n;
    }
    return n;
  }
  /// Departure time of the next held packet, or UINT64_MAX.
  uint64_t next_due_ns() const { return due_.empty() ? UINT64_MAX : due_.top().due_ns; }
  /// Packets in the timed queue.
  size_t held() const { return due_.size(); }
  const WanCounters& counters() const { return counters_; }

 private:
  struct Held {
    uint64_t due_ns;
    uint64_t seq;
    Packet pkt;
    bool operator>(const Held& o) const {
      return due_ns != o.due_ns ? due_ns > o.due_ns : seq > o.seq;
    }
  };
  void hold(uint64_t due_ns, uint32_t dst_ip, bool ce, const iovec* iov, size_t iovcnt, size_t len,
            int64_t flip_bit);

  bool open_ = false;
  uint32_t ip_ = 0;
  WanTopology topo_;
  std::vector<std::unique_ptr<LinkClock>> clocks_;
  std::vector<std::unique_ptr<LinkEmulator>> links_;  // by topology link index
  std::priority_queue<Held, std::vector<Held>, std::greater<>> due_;
  uint64_t seq_ = 0;
  WanCounters counters_;
  // Shared clock file.
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::string path_;
};

}  // namespace softrdma::net
