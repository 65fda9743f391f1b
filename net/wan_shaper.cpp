// The link emulator on the transmit path; see wan_shaper.h.
#include "net/wan_shaper.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <string>

#include "base/clock.h"

namespace softrdma::net {

namespace {

constexpr size_t kLine = 64;  // one link clock per cache line

// FNV-1a 64 of the topology text: processes given the same topology share its clocks.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex(uint64_t v) {
  static const char* d = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = d[v & 15];
  return s;
}

}  // namespace

WanShaper::~WanShaper() {
  close();
}

int WanShaper::open(uint32_t local_ip, const WanTopology& topo, const std::string& text,
                    const WanShaperConfig& cfg) {
  close();
  ip_ = local_ip;
  topo_ = topo;
  const size_t n = topo_.links.size();
  if (cfg.share_clock && n > 0) {
    // The link's free time is on the clock of base/clock.h: processes with another time
    // dilation factor must not share it (a K = 1 time read at K = 10 is 10× in the future).
    std::string key = clock::dilated() ? text + "@tdf=" + std::to_string(clock::tdf()) : text;
    // The one-line form's one link stands for each direction alike, not for one medium both
    // directions take turns on: its clock is the sending address's (every process sending
    // from it queues behind the others), so two endpoints get a full-duplex link. Shared by
    // both ends, the data's queue held the ACKs going the other way too: a 100 Gbit/s ×
    // 50 ms kv hand-off's round trip grew to 61 ms (docs/kv.md).
    if (topo_.one_line()) key += "@src=" + std::to_string(local_ip);
    path_ = cfg.dir + "/" + cfg.name_prefix + "wan-" + hex(fnv1a(key));
    map_bytes_ = n * kLine;
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd_ < 0) {
      const int e = errno;
      path_.clear();
      return e;
    }
    struct stat st {};
    // Zero-filled when new; two processes growing it at once both write the same size.
    if (::flock(fd_, LOCK_SH) != 0 || ::fstat(fd_, &st) != 0 ||
        (static_cast<size_t>(st.st_size) < map_bytes_ &&
         ::ftruncate(fd_, static_cast<off_t>(map_bytes_)) != 0)) {
      const int e = errno;
      close();
      return e;
    }
    map_ = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      const int e = errno;
      close();
      return e;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (map_ != nullptr) {
      auto* word = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(map_) + i * kLine);
      clocks_.push_back(std::make_unique<SharedLinkClock>(word));
    } else {
      clocks_.push_back(std::make_unique<LocalLinkClock>());
    }
    LinkParams p = topo_.links[i].params;
    p.seed ^= (uint64_t{local_ip} << 16) ^ (i + 1) * 0x9E3779B97F4A7C15ull;  // per sender
    links_.push_back(std::make_unique<LinkEmulator>(p, clocks_.back().get()));
  }
  open_ = true;
  return 0;
}

void WanShaper::close() {
  while (!due_.empty()) due_.pop();
  links_.clear();
  clocks_.clear();
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  if (fd_ >= 0) {
    // The last user (no other shared lock) removes the file.
    if (!path_.empty() && ::flock(fd_, LOCK_EX | LOCK_NB) == 0) ::unlink(path_.c_str());
    ::close(fd_);
  }
  fd_ = -1;
  path_.clear();
  topo_ = WanTopology{};
  open_ = false;
}

void WanShaper::hold(uint64_t due_ns, uint32_t dst_ip, bool ce, const iovec* iov, size_t iovcnt,
                     size_t len, int64_t flip_bit) {
  Held h;
  h.due_ns = due_ns;
  h.seq = seq_++;
  h.pkt.dst_ip = dst_ip;
  h.pkt.ecn_ce = ce;
  h.pkt.bytes.resize(len);
  size_t off = 0;
  for (size_t i = 0; i < iovcnt && off < len; ++i) {
    const size_t k = std::min(iov[i].iov_len, len - off);
    if (k) std::memcpy(h.pkt.bytes.data() + off, iov[i].iov_base, k);
    off += k;
  }
  if (flip_bit >= 0 && static_cast<size_t>(flip_bit / 8) < len)
    h.pkt.bytes[static_cast<size_t>(flip_bit / 8)] ^= static_cast<uint8_t>(1u << (flip_bit % 8));
  due_.push(std::move(h));
  ++counters_.held;
}

WanVerdict WanShaper::submit(uint32_t dst_ip, const iovec* iov, size_t iovcnt, size_t len,
                             uint64_t now_ns, bool& ecn_ce) {
  ecn_ce = false;
  if (!open_) return WanVerdict::kSendNow;
  const WanTopology::Link* l = topo_.link_for(ip_, dst_ip);
  if (l == nullptr) return WanVerdict::kSendNow;
  ++counters_.shaped;
  LinkEmulator& e = *links_[topo_.index_of(l)];
  const LinkDecision d = e.submit(now_ns, len);
  switch (d.verdict) {
    case LinkVerdict::kDropLoss:
      ++counters_.dropped_loss;
      return WanVerdict::kDropped;
    case LinkVerdict::kDropBurst:
      ++counters_.dropped_burst;
      return WanVerdict::kDropped;
    case LinkVerdict::kDropQueue:
      ++counters_.dropped_queue;
      return WanVerdict::kDropped;
    case LinkVerdict::kSend:
      break;
  }
  counters_.ecn_marked += d.ecn_ce;
  counters_.duplicated += d.copies > 1;
  counters_.corrupted += d.corrupt_bit >= 0;
  counters_.reordered += d.reordered;
  // Anything delayed, duplicated or corrupted goes through the queue (a corrupted packet is
  // a modified copy; the original bytes belong to the caller).
  if (d.depart_ns <= now_ns && d.copies == 1 && d.corrupt_bit < 0) {
    ecn_ce = d.ecn_ce;
    return WanVerdict::kSendNow;
  }
  hold(d.depart_ns, dst_ip, d.ecn_ce, iov, iovcnt, len, d.corrupt_bit);
  if (d.copies > 1) hold(d.depart_ns, dst_ip, d.ecn_ce, iov, iovcnt, len, -1);
  return WanVerdict::kHeld;
}

}  // namespace softrdma::net
