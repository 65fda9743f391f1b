// Same-host shared-memory packet path; see shm_port.h for the contract.
//
// Mailbox file layout (all offsets page-aligned; every field little-endian native):
//   [0, 4096)            MailboxHeader (immutable line, last_poll_ns line, claimed line)
//   [ctl_offset, …)      K × RingCtl (owner/epoch line, tail line, head line: 192 bytes)
//   [data_offset, …)     K × ring_bytes of record data
//
// Ring ownership word (RingCtl::owner): bits 63:62 state, 61:32 producer pid, 31:0 producer
// ip. States: 0 free (whole word 0), Active, Released (producer stopped writing for good),
// Quarantined (receiver found garbage; the producer must give it back). Transitions:
//   free → Active          producer, CAS (the only thing a producer does to a foreign ring)
//   Active → Released      producer (close, or acknowledging a quarantine)
//   Active → Quarantined   receiver, malformed records
//   any → free             receiver only, once no producer can write (Released, or producer
//                          pid dead) and what it wrote is delivered (head = tail; a
//                          quarantined ring's records are discarded instead)
// Because only the receiver frees a ring and only when its producer is gone, head and tail
// never have two writers, and a new producer starts at the tail the receiver left.
//
// Records: 8-byte header {u32 length, u32 source ip} + packet bytes, padded to 64 bytes so
// every record starts on its own cache line (the producer filling record n+1 never shares a
// line with the consumer reading record n; the padding costs < 64 B per ≤ 4 KiB packet and
// turns a 20-byte ACK into one line). A record that would cross the end of the data area is
// preceded by a wrap marker (length 0xFFFFFFFF) and starts at offset 0. head and tail are
// free-running byte counters (mod ring_bytes, a power of two).
#include "net/shm_port.h"

#include "net/address_share.h"
#include "net/fault_guard.h"
#include "net/netns.h"
#include "net/peer_liveness.h"
#include "net/unix_address.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <deque>

#include "base/clock.h"
#include "net/udp_port.h"

namespace softrdma::net {

namespace {

constexpr uint64_t kMailboxMagic = 0x314d48534d445253ull;  // "SRDMSHM1"
// 2: records carry no ICRC (the engine computes it only for packets that cross a wire or a
// capture file), so a version-1 peer must not be talked to over shared memory.
// 3: bit 31 of a record's length word is the ECN CE mark (kRecordCe); a version-2 reader
// would take such a record for a broken ring.
// 4: the header names the owner's network namespace (netns) and file names carry it; a
// version-3 sender would write into another namespace's mailbox of the same address.
// 5: a direct-placement table (net/shm_placement.h) follows the ring control pages, and
// records may carry a WRITE's headers only (the payload placed by the sender).
// 6: the table starts with pinner entries (robust mutexes: a sender that dies holding pins is
// found at once); a version-5 sender would pin without one and could not be repaired.
constexpr uint32_t kVersion = 6;
constexpr uint64_t kAlign = 64;  // record alignment, bytes
constexpr uint64_t kRingRecordHeader = 8;
constexpr uint32_t kWrapMarker = 0xFFFFFFFFu;
// Record header word 0: the packet length (≤ 1 GiB / 4) | this bit when CE-marked.
constexpr uint32_t kRecordCe = 0x80000000u;
constexpr uint64_t kMinRingBytes = 64u << 10;
constexpr uint64_t kMaxRingBytes = 1ull << 30;

constexpr uint64_t kStateShift = 62;
constexpr uint64_t kActive = 1;
constexpr uint64_t kReleased = 2;
constexpr uint64_t kQuarantined = 3;

constexpr uint64_t owner_word(uint64_t state, uint32_t pid, uint32_t ip) {
  return state << kStateShift | (uint64_t{pid} & 0x3FFFFFFFu) << 32 | ip;
}
constexpr uint64_t owner_state(uint64_t w) {
  return w >> kStateShift;
}
constexpr uint32_t owner_pid(uint64_t w) {
  return static_cast<uint32_t>(w >> 32) & 0x3FFFFFFFu;
}
constexpr uint64_t with_state(uint64_t w, uint64_t state) {
  return (w & ~(uint64_t{3} << kStateShift)) | state << kStateShift;
}

constexpr uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) & ~(a - 1);
}

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// CLOCK_MONOTONIC_COARSE (dilated): a few ns through the vDSO, ms resolution — enough for
// the 100 ms retry/liveness timers that send() and poll() keep without taking a time argument.
uint64_t coarse_ns() {
  return clock::coarse_now_ns();
}

// A process with that pid exists and is not a zombie (net/peer_liveness.h: a killed peer
// whose parent has not reaped it yet is as gone as one that was). pid reuse can make a dead
// peer look alive; that only delays cleanup.
bool pid_alive(uint32_t pid) {
  return sample_process(pid).state != ProcessState::kGone;
}

uint64_t random_epoch() {
  uint64_t e = 0;
  if (getrandom(&e, sizeof e, GRND_NONBLOCK) != sizeof e) {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);  // a seed, not a time: dilated or not is all one
    e = (uint64_t(ts.tv_sec) << 32) ^ uint64_t(ts.tv_nsec) ^ (uint64_t(getpid()) << 20);
  }
  return e ? e : 1;
}

bool valid_geometry(uint64_t ring_count, uint64_t ring_bytes) {
  return ring_count >= 1 && ring_count <= 64 && std::has_single_bit(ring_bytes) &&
         ring_bytes >= kMinRingBytes && ring_bytes <= kMaxRingBytes;
}
}  // namespace

// ---- shared layout ---------------------------------------------------------------------

struct detail::ShmMailboxHeader {
  // Line 0: written once by the owner before `magic` is published (and `closed` at the end).
  std::atomic<uint64_t> magic;
  uint32_t version;
  uint32_t ring_count;
  uint64_t ring_bytes;
  uint64_t total_bytes;
  uint64_t ctl_offset;
  uint64_t data_offset;
  uint64_t epoch;
  uint32_t owner_pid;
  uint32_t ip;
  std::atomic<uint32_t> closed;
  uint32_t reserved;
  uint64_t netns;         // the owner's network namespace (net/netns.h; 0: unknown)
  uint64_t place_offset;  // the direct-placement table (net/shm_placement.h)
  // Line 1: the receiver's busy-poll clock, written often by the receiver, read by senders;
  // and how stale that clock may get before senders ring (0: the sender's own
  // ShmConfig::doorbell_threshold_ns), written rarely by the receiver.
  alignas(64) std::atomic<uint64_t> last_poll_ns;
  std::atomic<uint64_t> doorbell_after_ns;
  // Line 2: bit i set while ring i is claimed (set by producers, cleared by the receiver).
  alignas(64) std::atomic<uint64_t> claimed;
};

struct detail::ShmRingCtl {
  alignas(64) std::atomic<uint64_t> owner;
  std::atomic<uint64_t> sender_epoch;
  alignas(64) std::atomic<uint64_t> tail;  // producer-written byte counter
  alignas(64) std::atomic<uint64_t> head;  // consumer-written byte counter
};

static_assert(sizeof(detail::ShmMailboxHeader) <= kMailboxPageBytes);
static_assert(sizeof(detail::ShmRingCtl) == 192);

namespace {
struct Geometry {
  uint64_t ctl_offset, place_offset, data_offset, total_bytes;
};
Geometry geometry(uint64_t ring_count, uint64_t ring_bytes) {
  Geometry g;
  g.ctl_offset = kMailboxPageBytes;
  g.place_offset =
      g.ctl_offset + align_up(ring_count * sizeof(detail::ShmRingCtl), kMailboxPageBytes);
  g.data_offset = g.place_offset + PlacementTable::region_bytes();
  g.total_bytes = g.data_offset + ring_count * ring_bytes;
  return g;
}
}  // namespace

// ---- sender-side peer state ------------------------------------------------------------

struct ShmPort::Peer {
  uint32_t ip = 0;
  // Mapping of the peer's mailbox (hdr == nullptr: not mapped).
  int fd = -1;  // kept for fallocate() of the rings we claim
  uint8_t* base = nullptr;
  size_t bytes = 0;
  MailboxHeader* hdr = nullptr;
  uint32_t owner_pid = 0;
  uint64_t epoch = 0;
  uint32_t ring_count = 0;
  uint64_t ring_bytes = 0;
  uint64_t ctl_offset = 0;
  uint64_t data_offset = 0;
  // Its direct-placement table, and whether its owner was verified (placement_to()):
  // 0 not yet, 1 yes, -1 never (another process behind the pid, or cross-memory attach refused).
  PlacementTable placement;
  int8_t place_state = 0;
  // Our ring in it (ring < 0: none).
  int ring = -1;
  RingCtl* ctl = nullptr;
  uint8_t* data = nullptr;
  uint64_t tail = 0;        // our copy of ctl->tail
  uint64_t head_cache = 0;  // last head we read; reloaded only when the ring looks full
  // Timers (coarse ns).
  uint64_t next_lookup = 0;
  uint64_t next_claim = 0;
  uint64_t next_pid_check = 0;
  bool dirty = false;  // written since the last ring_doorbells()
  // Packets that found the ring full, oldest first (ShmConfig::backlog_bytes).
  struct Held {
    std::vector<uint8_t> bytes;
    bool ce = false;
  };
  std::deque<Held> backlog;
  uint64_t backlog_bytes = 0;
  sockaddr_un bell{};
  socklen_t bell_len = 0;
};

// ---- helpers -----------------------------------------------------------------------------

namespace {
uint64_t resolved_netns(const ShmConfig& cfg) {
  return cfg.netns == kCurrentNetns ? current_netns() : cfg.netns;
}
}  // namespace

std::string shm_mailbox_path(const ShmConfig& cfg, uint32_t ip) {
  return cfg.dir + "/" + cfg.name_prefix + "shm-" + netns_scope(resolved_netns(cfg)) +
         ipv4_to_string(ip);
}

std::string shm_doorbell_name(const ShmConfig& cfg, uint32_t ip) {
  return cfg.name_prefix + "bell-" + ipv4_to_string(ip);
}

uint64_t shm_monotonic_ns() {
  return clock::now_ns();
}

ShmPort::RingCtl* ShmPort::ring_ctl(uint32_t index) const {
  return reinterpret_cast<RingCtl*>(reinterpret_cast<uint8_t*>(hdr_) + hdr_->ctl_offset) + index;
}

uint8_t* ShmPort::ring_data(uint32_t index) const {
  return reinterpret_cast<uint8_t*>(hdr_) + hdr_->data_offset + index * hdr_->ring_bytes;
}

// ---- open / close -----------------------------------------------------------------------

ShmPort::ShmPort() = default;

ShmPort::~ShmPort() {
  close();
}

std::vector<std::string> shm_remove_stale_mailboxes(const ShmConfig& config) {
  std::vector<std::string> removed;
  ShmConfig cfg = config;
  cfg.netns = resolved_netns(config);
  const std::string lead = cfg.name_prefix + "shm-" + netns_scope(cfg.netns);
  for (uint32_t ip : addresses_in_file_names(cfg.dir, lead)) {
    // Opening takes the address lock, replaces the stale mailbox (marking it closed) and
    // closing removes the replacement: nothing of the address is left. A live owner makes
    // open() fail with EADDRINUSE, and its file stays.
    ShmPort port;
    if (port.open(ip, cfg) != 0) continue;
    port.close();
    removed.push_back(shm_mailbox_path(cfg, ip));
  }
  return removed;
}

int ShmPort::open(uint32_t ip, const ShmConfig& cfg) {
  if (hdr_ != nullptr || bell_fd_ >= 0) return EINVAL;
  if (!valid_geometry(cfg.ring_count, cfg.ring_bytes) || cfg.max_packet_bytes == 0 ||
      cfg.dir.empty())
    return EINVAL;
  cfg_ = cfg;
  cfg_.netns = resolved_netns(cfg);  // peers are looked up in the namespace we open in
  ip_ = ip;
  pid_ = static_cast<uint32_t>(getpid());
  path_ = shm_mailbox_path(cfg_, ip);

  // 1. The address lock: the receiver's doorbell socket.
  sockaddr_un sa;
  socklen_t sl = abstract_unix_address(shm_doorbell_name(cfg_, ip), sa);
  if (sl == 0) return ENAMETOOLONG;
  int bell = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (bell < 0) return errno;
  if (::bind(bell, reinterpret_cast<sockaddr*>(&sa), sl) != 0) {
    int e = errno;
    ::close(bell);
    return e;  // EADDRINUSE: a live process owns this address
  }
  int stale_fd = -1;  // step 2: the previous owner's mailbox, to be marked closed
  auto fail = [&](int e) {
    ::close(bell);
    if (stale_fd >= 0) ::close(stale_fd);
    return e;
  };

  // 2. An existing file: refuse if it names a live, open owner; else it is stale. A stale
  // mailbox whose owner died without close() is still "open" for senders that mapped it:
  // they would keep writing into it until their next liveness check (liveness_check_ns),
  // losing everything meant for us. It is marked closed below once ours is published, so
  // they look again on their next send and find the new one.
  {
    int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
      alignas(64) uint8_t raw[sizeof(MailboxHeader)] = {};
      ssize_t n = ::pread(fd, raw, sizeof raw, 0);
      uint64_t magic;
      uint32_t pid, closed;
      std::memcpy(&magic, raw + offsetof(MailboxHeader, magic), sizeof magic);
      std::memcpy(&pid, raw + offsetof(MailboxHeader, owner_pid), sizeof pid);
      std::memcpy(&closed, raw + offsetof(MailboxHeader, closed), sizeof closed);
      const bool valid = n == static_cast<ssize_t>(sizeof raw) && magic == kMailboxMagic;
      if (valid && closed == 0 && pid_alive(pid)) {
        ::close(fd);
        return fail(EADDRINUSE);
      }
      struct stat st;
      if (valid && closed == 0 && (::fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR &&
          ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
          static_cast<uint64_t>(st.st_size) >= kMailboxPageBytes)
        stale_fd = fd;
      else
        ::close(fd);
    }
    if (::unlink(path_.c_str()) != 0 && errno != ENOENT) return fail(errno);
  }
  auto close_stale = [&] {
    if (stale_fd < 0) return;
    if (void* old =
            ::mmap(nullptr, kMailboxPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, stale_fd, 0);
        old != MAP_FAILED) {
      static_cast<MailboxHeader*>(old)->closed.store(1, std::memory_order_release);
      ::munmap(old, kMailboxPageBytes);
    }
    ::close(stale_fd);
    stale_fd = -1;
  };

  // 3. Build the new mailbox under a private name, publish it with rename() (atomic), so a
  // sender never maps a half-initialised file.
  Geometry g = geometry(cfg_.ring_count, cfg_.ring_bytes);
  std::string tmp = path_ + ".new-" + std::to_string(pid_);
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return fail(errno);
  auto fail_fd = [&](int e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return fail(e);
  };
  if (::ftruncate(fd, static_cast<off_t>(g.total_bytes)) != 0) return fail_fd(errno);
  // Reserve the header and ring control pages now: touching an unbacked tmpfs page when the
  // filesystem is full is SIGBUS. Ring data pages are reserved by each producer on claim.
  int fr = ::fallocate(fd, 0, 0, static_cast<off_t>(g.data_offset));
  if (fr != 0 && errno != EOPNOTSUPP && errno != ENOSYS) return fail_fd(errno);
  void* m = ::mmap(nullptr, g.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return fail_fd(errno);
  auto* h = static_cast<MailboxHeader*>(m);  // zero-filled by ftruncate
  h->version = kVersion;
  h->ring_count = cfg_.ring_count;
  h->ring_bytes = cfg_.ring_bytes;
  h->total_bytes = g.total_bytes;
  h->ctl_offset = g.ctl_offset;
  h->data_offset = g.data_offset;
  h->place_offset = g.place_offset;
  placement_.init_owner(static_cast<uint8_t*>(m) + g.place_offset);
  epoch_ = random_epoch();
  h->epoch = epoch_;
  h->owner_pid = pid_;
  h->ip = ip;
  h->netns = cfg_.netns;
  h->closed.store(0, std::memory_order_relaxed);
  h->last_poll_ns.store(0, std::memory_order_relaxed);
  h->doorbell_after_ns.store(0, std::memory_order_relaxed);
  h->claimed.store(0, std::memory_order_relaxed);
  h->magic.store(kMailboxMagic, std::memory_order_release);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    int e = errno;
    placement_.reset();
    ::munmap(m, g.total_bytes);
    return fail_fd(e);
  }
  ::close(fd);
  close_stale();  // after the rename: a sender that sees `closed` finds ours right away

  int tx = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (tx < 0) {
    int e = errno;
    h->closed.store(1, std::memory_order_release);
    ::unlink(path_.c_str());
    placement_.reset();
    ::munmap(m, g.total_bytes);
    return fail(e);
  }
  hdr_ = h;
  map_bytes_ = g.total_bytes;
  bell_fd_ = bell;
  bell_tx_fd_ = tx;
  rr_ = 0;
  next_housekeeping_ = 0;
  local_poll_ns_ = 0;
  local_after_ns_ = cfg_.doorbell_threshold_ns;  // the header says 0: this default
  stats_ = ShmStats{};
  return 0;
}

void ShmPort::close() {
  for (auto& [ip, p] : peers_) drop_peer(*p, true);
  peers_.clear();
  holds_ = 0;
  for (auto& [base, bytes] : graveyard_) ::munmap(base, bytes);
  graveyard_.clear();
  last_peer_ = nullptr;
  dirty_.clear();
  backlogged_.clear();
  if (hdr_ != nullptr) {
    hdr_->closed.store(1, std::memory_order_release);
    placement_.reset();
    // The doorbell socket still locks the address, so the file at path_ is ours.
    ::unlink(path_.c_str());
    ::munmap(hdr_, map_bytes_);
    hdr_ = nullptr;
    map_bytes_ = 0;
  }
  if (bell_tx_fd_ >= 0) ::close(bell_tx_fd_);
  bell_tx_fd_ = -1;
  if (bell_fd_ >= 0) ::close(bell_fd_);  // last: releases the address
  bell_fd_ = -1;
  epoch_ = 0;
}

// ---- sender side ------------------------------------------------------------------------

ShmPort::Peer& ShmPort::peer_for(uint32_t dst_ip) {
  if (last_peer_ != nullptr && last_peer_->ip == dst_ip) return *last_peer_;
  auto& slot = peers_[dst_ip];
  if (!slot) {
    slot = std::make_unique<Peer>();
    slot->ip = dst_ip;
    slot->bell_len = abstract_unix_address(shm_doorbell_name(cfg_, dst_ip), slot->bell);
  }
  last_peer_ = slot.get();
  return *slot;
}

bool ShmPort::lookup_peer(Peer& p, uint64_t now) {
  p.next_lookup = now + cfg_.peer_retry_ns;
  std::string path = shm_mailbox_path(cfg_, p.ip);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < kMailboxPageBytes) {
    ::close(fd);
    return false;
  }
  size_t bytes = static_cast<size_t>(st.st_size);
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    ::close(fd);
    return false;
  }
  auto* h = static_cast<MailboxHeader*>(m);
  bool ok = h->magic.load(std::memory_order_acquire) == kMailboxMagic && h->version == kVersion &&
            h->ip == p.ip && h->netns == cfg_.netns && valid_geometry(h->ring_count, h->ring_bytes);
  if (ok) {
    Geometry g = geometry(h->ring_count, h->ring_bytes);
    ok = h->ctl_offset == g.ctl_offset && h->data_offset == g.data_offset &&
         h->place_offset == g.place_offset && h->total_bytes == g.total_bytes &&
         g.total_bytes <= bytes && h->closed.load(std::memory_order_acquire) == 0 &&
         pid_alive(h->owner_pid);
  }
  // The mailbox is only worth writing to if its owner can be woken: its doorbell must be
  // reachable from here (it is not from another network namespace, e.g. when /proc was
  // unavailable and names are unscoped).
  if (ok && !doorbell_reachable(p)) {
    ok = false;
    ++stats_.unreachable_peers;
  }
  if (!ok) {
    ::munmap(m, bytes);
    ::close(fd);
    return false;
  }
  p.fd = fd;
  p.base = static_cast<uint8_t*>(m);
  p.bytes = bytes;
  p.hdr = h;
  p.owner_pid = h->owner_pid;
  p.epoch = h->epoch;
  p.ring_count = h->ring_count;
  p.ring_bytes = h->ring_bytes;
  p.ctl_offset = h->ctl_offset;
  p.data_offset = h->data_offset;
  p.placement.attach(p.base + h->place_offset, PlacementTable::region_bytes(), p.owner_pid);
  p.place_state = 0;
  p.ring = -1;
  p.next_claim = 0;
  p.next_pid_check = now + cfg_.liveness_check_ns;
  ++stats_.peers_found;
  return true;
}

const PlacementTable* ShmPort::placement_to(uint32_t dst_ip) {
  if (hdr_ == nullptr) return nullptr;
  Peer* p = &peer_for(dst_ip);
  // Not mapped yet: look it up now (as send() would, rate-limited), so that a stream's very
  // first WRITE is placed — sent with its payload, it would keep every later one in-band
  // for as long as the requester keeps the path full (requester.cpp, placed_run()).
  if (p->hdr == nullptr) {
    const uint64_t now = coarse_ns();
    if (now < p->next_lookup || !lookup_peer(*p, now)) return nullptr;
  }
  if (p->place_state < 0 || !p->placement.attached() ||
      p->hdr->closed.load(std::memory_order_acquire) != 0)
    return nullptr;
  if (p->place_state == 0) {
    int err = 0;
    p->place_state = p->placement.verify_owner(&err) ? 1 : -1;
    if (p->place_state < 0) ++stats_.placement_refused_peers;
  }
  return p->place_state > 0 ? &p->placement : nullptr;
}

void ShmPort::release_mappings() {
  if (holds_ > 0 && --holds_ == 0) {
    for (auto& [base, bytes] : graveyard_) ::munmap(base, bytes);
    graveyard_.clear();
  }
}

bool ShmPort::doorbell_reachable(const Peer& p) const {
  if (p.bell_len == 0) return false;
  // connect(2) finds the name without sending anything. Through our own doorbell socket,
  // which lives in the namespace this port was opened in (the calling thread's may differ),
  // disconnected again right after (AF_UNSPEC): ring_doorbells() names its peer per datagram.
  const bool ok =
      ::connect(bell_tx_fd_, reinterpret_cast<const sockaddr*>(&p.bell), p.bell_len) == 0 ||
      (errno != ECONNREFUSED && errno != ENOENT);
  sockaddr unspec{};
  unspec.sa_family = AF_UNSPEC;
  ::connect(bell_tx_fd_, &unspec, sizeof unspec);
  return ok;
}

// Gives our ring back (if asked and still ours) and unmaps the peer's mailbox.
void ShmPort::drop_peer(Peer& p, bool release_ring) {
  drop_backlog(p);
  if (p.hdr == nullptr) return;
  if (release_ring && p.ring >= 0 && p.hdr->closed.load(std::memory_order_acquire) == 0) {
    uint64_t mine = owner_word(kActive, pid_, ip_);
    uint64_t expect = mine;
    if (!p.ctl->owner.compare_exchange_strong(expect, owner_word(kReleased, pid_, ip_),
                                              std::memory_order_acq_rel)) {
      expect = owner_word(kQuarantined, pid_, ip_);
      p.ctl->owner.compare_exchange_strong(expect, owner_word(kReleased, pid_, ip_),
                                           std::memory_order_acq_rel);
    }
  }
  p.placement.reset();
  if (holds_ > 0)
    graveyard_.emplace_back(p.base, p.bytes);  // unmapped by release_mappings()
  else
    ::munmap(p.base, p.bytes);
  ::close(p.fd);
  p.fd = -1;
  p.base = nullptr;
  p.bytes = 0;
  p.hdr = nullptr;
  p.ring = -1;
  p.ctl = nullptr;
  p.data = nullptr;
}

bool ShmPort::claim_ring(Peer& p, uint64_t now) {
  p.next_claim = now + cfg_.peer_retry_ns;
  const uint64_t mine = owner_word(kActive, pid_, ip_);
  // Start the scan at a per-sender spot so concurrent claimers rarely collide.
  uint32_t start = static_cast<uint32_t>((uint64_t{ip_} * 0x9E3779B1u + pid_) % p.ring_count);
  for (uint32_t i = 0; i < p.ring_count; ++i) {
    uint32_t idx = (start + i) % p.ring_count;
    auto* ctl = reinterpret_cast<RingCtl*>(p.base + p.ctl_offset) + idx;
    uint64_t expect = 0;
    if (ctl->owner.load(std::memory_order_relaxed) != 0 ||
        !ctl->owner.compare_exchange_strong(expect, mine, std::memory_order_acq_rel))
      continue;
    ctl->sender_epoch.store(epoch_, std::memory_order_relaxed);
    uint64_t off = p.data_offset + idx * p.ring_bytes;
    // Reserve the ring's pages so a full tmpfs shows here, not as SIGBUS on a later write.
    if (::fallocate(p.fd, 0, static_cast<off_t>(off), static_cast<off_t>(p.ring_bytes)) != 0 &&
        errno != EOPNOTSUPP && errno != ENOSYS) {
      ctl->owner.store(owner_word(kReleased, pid_, ip_), std::memory_order_release);
      return false;
    }
    uint64_t tail = ctl->tail.load(std::memory_order_acquire);
    uint64_t head = ctl->head.load(std::memory_order_acquire);
    if (head != tail || tail % kAlign != 0) {
      // The receiver leaves a free ring empty; this one is not: let it sort the ring out.
      ctl->owner.store(owner_word(kReleased, pid_, ip_), std::memory_order_release);
      p.hdr->claimed.fetch_or(uint64_t{1} << idx, std::memory_order_seq_cst);
      continue;
    }
    p.ring = static_cast<int>(idx);
    p.ctl = ctl;
    p.data = p.base + off;
    p.tail = tail;
    p.head_cache = head;
    // After the CAS: the receiver clears the bit before it frees the ring (see free_ring).
    p.hdr->claimed.fetch_or(uint64_t{1} << idx, std::memory_order_seq_cst);
    ++stats_.rings_claimed;
    return true;
  }
  return false;
}

ShmSendResult ShmPort::send(uint32_t dst_ip, const iovec* iov, size_t iovcnt, bool ecn_ce) {
  auto no_peer = [&] {
    ++stats_.no_peer;
    return ShmSendResult::kNoPeer;
  };
  if (hdr_ == nullptr) return no_peer();
  uint64_t len = 0;
  for (size_t i = 0; i < iovcnt; ++i) len += iov[i].iov_len;

  Peer& p = peer_for(dst_ip);
  uint64_t now = coarse_ns();
  if (p.hdr == nullptr && (now < p.next_lookup || !lookup_peer(p, now))) return no_peer();

  // Is the receiver still there? closed: one load per send; pid: every liveness_check_ns.
  bool gone = p.hdr->closed.load(std::memory_order_acquire) != 0;
  if (!gone && now >= p.next_pid_check) {
    p.next_pid_check = now + cfg_.liveness_check_ns;
    gone = !pid_alive(p.owner_pid);
  }
  if (gone) {
    drop_peer(p, false);
    ++stats_.peers_lost;
    // A restarted receiver has already replaced the file: look again now (rate-limited).
    if (!lookup_peer(p, now)) return no_peer();
  }

  if (len > cfg_.max_packet_bytes || len > p.ring_bytes / 4) return no_peer();

  if (p.ring >= 0 &&
      p.ctl->owner.load(std::memory_order_relaxed) != owner_word(kActive, pid_, ip_)) {
    // The receiver quarantined our ring (it found garbage): acknowledge, take another.
    uint64_t expect = owner_word(kQuarantined, pid_, ip_);
    p.ctl->owner.compare_exchange_strong(expect, owner_word(kReleased, pid_, ip_),
                                         std::memory_order_acq_rel);
    p.ring = -1;
    p.ctl = nullptr;
    p.data = nullptr;
    p.next_claim = 0;
  }
  if (p.ring < 0 && (now < p.next_claim || !claim_ring(p, now))) return no_peer();

  // Records keep send() order: while older packets wait, this one waits behind them.
  if (p.backlog.empty() || drain_peer(p)) {
    bool faulted = false;
    if (write_record(p, iov, iovcnt, len, ecn_ce, &faulted)) return ShmSendResult::kSent;
    if (faulted) return ShmSendResult::kFault;
  }
  if (p.backlog_bytes + len > cfg_.backlog_bytes) {
    ++stats_.full_drops;
    return ShmSendResult::kFull;
  }
  Peer::Held& h = p.backlog.emplace_back();
  h.bytes.resize(len);
  uint8_t* dst = h.bytes.data();
  for (size_t i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len == 0) continue;
    if (!guarded_copy(dst, iov[i].iov_base, iov[i].iov_len)) {  // as in write_record
      p.backlog.pop_back();
      return ShmSendResult::kFault;
    }
    dst += iov[i].iov_len;
  }
  h.ce = ecn_ce;
  if (p.backlog_bytes == 0) backlogged_.push_back(&p);
  p.backlog_bytes += len;
  ++stats_.backlogged;
  return ShmSendResult::kQueued;
}

bool ShmPort::write_record(Peer& p, const iovec* iov, size_t iovcnt, uint64_t len, bool ecn_ce,
                           bool* faulted) {
  const uint64_t cap = p.ring_bytes;
  const uint64_t need = align_up(kRingRecordHeader + len, kAlign);
  uint64_t pos = p.tail & (cap - 1);
  uint64_t pad = pos + need > cap ? cap - pos : 0;
  if (p.tail + pad + need - p.head_cache > cap) {
    p.head_cache = p.ctl->head.load(std::memory_order_acquire);
    if (p.tail + pad + need - p.head_cache > cap) return false;
  }
  if (pad != 0) {
    uint32_t wrap[2] = {kWrapMarker, ip_};
    std::memcpy(p.data + pos, wrap, sizeof wrap);
    p.tail += pad;
    pos = 0;
  }
  uint32_t rh[2] = {static_cast<uint32_t>(len) | (ecn_ce ? kRecordCe : 0), ip_};
  uint8_t* dst = p.data + pos;
  std::memcpy(dst, rh, sizeof rh);
  dst += kRingRecordHeader;
  for (size_t i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len == 0) continue;
    // Payload comes straight from registered memory, which may have been unmapped: the
    // record stays unpublished (tail not moved) if the copy faults.
    if (!guarded_copy(dst, iov[i].iov_base, iov[i].iov_len)) {
      if (faulted) *faulted = true;
      return false;
    }
    dst += iov[i].iov_len;
  }
  p.tail += need;
  p.ctl->tail.store(p.tail, std::memory_order_release);
  ++stats_.packets_out;
  stats_.bytes_out += len;
  if (!p.dirty) {
    p.dirty = true;
    dirty_.push_back(&p);
  }
  return true;
}

bool ShmPort::drain_peer(Peer& p) {
  if (p.ring < 0 || p.hdr == nullptr) return p.backlog.empty();
  while (!p.backlog.empty()) {
    Peer::Held& h = p.backlog.front();
    const iovec v{h.bytes.data(), h.bytes.size()};
    if (!write_record(p, &v, 1, h.bytes.size(), h.ce)) return false;
    p.backlog_bytes -= h.bytes.size();
    p.backlog.pop_front();
  }
  std::erase(backlogged_, &p);
  return true;
}

void ShmPort::drop_backlog(Peer& p) {
  if (p.backlog.empty()) return;
  stats_.backlog_lost += p.backlog.size();
  p.backlog.clear();
  p.backlog_bytes = 0;
  std::erase(backlogged_, &p);
}

uint64_t ShmPort::drain_backlog() {
  uint64_t left = 0;
  // drain_peer() may erase from backlogged_: walk a copy (it is short: peers, not packets).
  const std::vector<Peer*> peers = backlogged_;
  for (Peer* p : peers) {
    const uint64_t now = coarse_ns();
    bool dead = false;
    if (p->hdr != nullptr && now >= p->next_pid_check) {
      // A receiver killed outright never closes its mailbox: look at its pid here too, not
      // only in send() — a requester parked on this backlog sends nothing.
      p->next_pid_check = now + cfg_.liveness_check_ns;
      dead = !pid_alive(p->owner_pid);
    }
    if (dead || p->hdr == nullptr || p->hdr->closed.load(std::memory_order_acquire) != 0 ||
        p->ring < 0) {
      // Gone (or our ring was taken back): what waited for it is lost, as packets in a dead
      // receiver's ring are; RC notices. send() looks the peer up again.
      drop_backlog(*p);
      continue;
    }
    if (!drain_peer(*p)) left += p->backlog_bytes;
  }
  return left;
}

bool ShmPort::backlogged_slow(uint32_t dst_ip) const {
  for (const Peer* p : backlogged_)
    if (p->ip == dst_ip) return true;
  return false;
}

size_t ShmPort::ring_doorbells(uint64_t now_ns) {
  if (dirty_.empty()) return 0;
  size_t refused = 0;
  // Pairs with the fence in note_sleeping(): our tail stores vs. its last_poll_ns store.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (Peer* p : dirty_) {
    p->dirty = false;
    if (p->hdr == nullptr || p->bell_len == 0) continue;
    uint64_t lp = p->hdr->last_poll_ns.load(std::memory_order_relaxed);
    uint64_t after = p->hdr->doorbell_after_ns.load(std::memory_order_relaxed);
    if (after == 0) after = cfg_.doorbell_threshold_ns;
    if (lp != 0 && (now_ns <= lp || now_ns - lp <= after)) continue;
    uint8_t b = 1;
    if (::sendto(bell_tx_fd_, &b, 1, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&p->bell),
                 p->bell_len) == 1) {
      ++stats_.doorbells;
    } else if (errno == ECONNREFUSED || errno == ENOENT) {
      // Nobody here holds the doorbell: the receiver is gone, or it is in another network
      // namespace and would never be woken. Stop writing to it (send() answers kNoPeer until
      // a later lookup finds a mailbox whose doorbell answers).
      ++refused;
      ++stats_.doorbell_failures;
      drop_peer(*p, true);
      p->next_lookup = coarse_ns() + cfg_.peer_retry_ns;
    }
  }
  dirty_.clear();
  return refused;
}

// ---- receiver side ----------------------------------------------------------------------

void ShmPort::drain_doorbell() {
  if (bell_fd_ < 0) return;
  uint8_t buf[64];
  for (int i = 0; i < 4096; ++i)
    if (::recv(bell_fd_, buf, sizeof buf, MSG_DONTWAIT) < 0 && errno != EINTR) break;
}

void ShmPort::note_polling(uint64_t now_ns) {
  if (hdr_ == nullptr) return;
  // Skip the store (a write to a line every sender reads) while the published value is
  // within a quarter of the threshold: senders then ring a little early, never too late.
  if (local_poll_ns_ != 0 && now_ns >= local_poll_ns_ &&
      now_ns - local_poll_ns_ < std::min(cfg_.doorbell_threshold_ns, local_after_ns_) / 4)
    return;
  local_poll_ns_ = now_ns ? now_ns : 1;
  hdr_->last_poll_ns.store(local_poll_ns_, std::memory_order_relaxed);
}

void ShmPort::set_doorbell_threshold(uint64_t ns) {
  if (hdr_ == nullptr) return;
  const uint64_t v = ns ? ns : cfg_.doorbell_threshold_ns;
  if (v == local_after_ns_) return;
  local_after_ns_ = v;
  hdr_->doorbell_after_ns.store(ns, std::memory_order_relaxed);
}

void ShmPort::note_sleeping() {
  if (hdr_ == nullptr) return;
  local_poll_ns_ = 0;
  hdr_->last_poll_ns.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ShmPort::free_ring(uint32_t idx) {
  RingCtl* c = ring_ctl(idx);
  c->head.store(c->tail.load(std::memory_order_acquire), std::memory_order_release);
  // Clear the claimed bit before the owner goes to 0: the next claimer sets it after its CAS.
  hdr_->claimed.fetch_and(~(uint64_t{1} << idx), std::memory_order_seq_cst);
  c->sender_epoch.store(0, std::memory_order_relaxed);
  c->owner.store(0, std::memory_order_release);
  ++stats_.rings_freed;
}

void ShmPort::quarantine_ring(uint32_t idx, uint64_t tail) {
  ++stats_.broken_rings;
  RingCtl* c = ring_ctl(idx);
  hdr_->claimed.fetch_and(~(uint64_t{1} << idx), std::memory_order_seq_cst);
  c->head.store(tail, std::memory_order_release);  // discard what is there
  uint64_t o = c->owner.load(std::memory_order_acquire);
  if (owner_state(o) == kActive &&
      c->owner.compare_exchange_strong(o, with_state(o, kQuarantined), std::memory_order_acq_rel))
    return;  // the producer acknowledges (→ Released) on its next send; housekeeping frees
  if (owner_state(o) == kReleased) free_ring(idx);
}

void ShmPort::housekeeping() {
  const uint32_t k = hdr_->ring_count;
  const uint64_t bits = hdr_->claimed.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < k; ++i) {
    RingCtl* c = ring_ctl(i);
    uint64_t o = c->owner.load(std::memory_order_acquire);
    switch (owner_state(o)) {
      case 0:
        break;
      case kReleased:
        // Deliver what a closed producer left, then free (a quarantined one: free now).
        if (!(bits >> i & 1) ||
            c->head.load(std::memory_order_relaxed) == c->tail.load(std::memory_order_acquire))
          free_ring(i);
        break;
      default:
        // Active or Quarantined, and the producer is dead. Its records below tail are whole
        // (tail is published after the copy): deliver them first, as a socket buffer keeps a
        // dead sender's datagrams — an ACK written just before a SIGKILL still counts. A
        // quarantined ring's contents are garbage: free it now.
        if (!pid_alive(owner_pid(o)) &&
            (owner_state(o) == kQuarantined || !(bits >> i & 1) ||
             c->head.load(std::memory_order_relaxed) == c->tail.load(std::memory_order_acquire)))
          free_ring(i);
        break;
    }
  }
}

size_t ShmPort::poll_impl(PacketFn fn, void* ctx, size_t budget) {
  if (hdr_ == nullptr) return 0;
  uint64_t now = coarse_ns();
  if (now >= next_housekeeping_) {
    next_housekeeping_ = now + cfg_.liveness_check_ns;
    housekeeping();
  }
  uint64_t bits = hdr_->claimed.load(std::memory_order_acquire);
  if (bits == 0 || budget == 0) return 0;
  const uint64_t cap = hdr_->ring_bytes;
  const uint64_t max_len = cap / 4;
  size_t done = 0;
  const uint32_t start = rr_;
  rr_ = (rr_ + 1) % hdr_->ring_count;
  uint64_t rot = std::rotr(bits, static_cast<int>(start));
  while (rot != 0 && done < budget) {
    int tz = std::countr_zero(rot);
    rot &= rot - 1;
    uint32_t idx = (start + static_cast<uint32_t>(tz)) & 63;
    RingCtl* c = ring_ctl(idx);
    uint64_t tail = c->tail.load(std::memory_order_acquire);
    uint64_t head = c->head.load(std::memory_order_relaxed);
    if (tail == head) continue;
    if (tail - head > cap || head % kAlign != 0 || tail % kAlign != 0) {
      quarantine_ring(idx, tail);
      continue;
    }
    uint8_t* d = ring_data(idx);
    bool broken = false;
    while (head != tail && done < budget) {
      uint64_t pos = head & (cap - 1);
      uint64_t avail = tail - head;
      uint32_t rh[2];
      std::memcpy(rh, d + pos, sizeof rh);  // read once: the peer could be changing it
      if (rh[0] == kWrapMarker) {
        if (cap - pos > avail) {
          broken = true;
          break;
        }
        head += cap - pos;
        c->head.store(head, std::memory_order_release);
        continue;
      }
      uint64_t len = rh[0] & ~kRecordCe;
      uint64_t need = align_up(kRingRecordHeader + len, kAlign);
      if (len > max_len || pos + need > cap || need > avail) {
        broken = true;
        break;
      }
      // The next record's header was written by another core: start fetching it now, so
      // the miss overlaps with this packet's handling (its payload copy) instead of
      // stalling the next parse.
      if (need < avail) __builtin_prefetch(d + ((head + need) & (cap - 1)));
      fn(ctx, rh[1], std::span<const uint8_t>(d + pos + kRingRecordHeader, len),
         (rh[0] & kRecordCe) != 0);
      ++done;
      ++stats_.packets_in;
      stats_.bytes_in += len;
      head += need;
      c->head.store(head, std::memory_order_release);
    }
    if (broken) quarantine_ring(idx, tail);
  }
  return done;
}

}  // namespace softrdma::net
