// Direct placement on the same-host path: the shared table (see shm_placement.h).
#include "net/shm_placement.h"

#include <pthread.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <time.h>

#include <cerrno>
#include <cstring>

namespace softrdma::net {

// The state word of an entry: bits 0-15 the senders' pins, bit 16 "valid", bits 32-63 a
// generation the owner bumps at every change, so that a sender's compare-and-swap fails when the
// entry changed since it read it (a seqlock whose read side is the pin).
namespace {
constexpr uint64_t kPinMask = 0xFFFF;
constexpr uint64_t kValid = 1ull << 16;
constexpr uint64_t kGenOne = 1ull << 32;
constexpr uint64_t kTableMagic = 0x32454341504d5253ull;  // "SRMPACE2": with pinner entries

constexpr uint64_t ident_of(PlaceKind kind, uint32_t key) {
  return uint64_t{static_cast<uint8_t>(kind)} << 32 | key;
}
constexpr uint32_t home_of(uint64_t ident) {
  // Fibonacci hashing of the key, the kind folded in.
  return static_cast<uint32_t>((ident * 0x9E3779B97F4A7C15ull) >> 52) &
         (PlacementTable::kSlots - 1);
}

uint64_t real_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // real time: a pin is one system call long
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}
}  // namespace

struct detail::PlacementHeader {
  std::atomic<uint64_t> magic;
  uint64_t cookie;       // random, also stored at cookie_addr in the owner's memory
  uint64_t cookie_addr;  // owner's virtual address of that copy
  uint32_t slots;
  uint32_t reserved;
  uint8_t pad[32];
};

// A sender's right to pin: `lock` is held from pin() to unpin(); `qp` and `region` are the
// slot indexes + 1 of the entries its holder has pinned (0: none), written after the pin is
// taken and cleared before it is released.
struct detail::PlacementPinner {
  pthread_mutex_t lock;  // robust, process-shared (init_owner)
  std::atomic<uint32_t> qp;
  std::atomic<uint32_t> region;
  uint8_t pad[64 - sizeof(pthread_mutex_t) - 2 * sizeof(uint32_t)];
};

struct detail::PlacementSlot {
  std::atomic<uint64_t> state;  // pins | valid | generation
  std::atomic<uint64_t> ident;  // kind << 32 | key; 0 = never used (ends a probe)
  std::atomic<uint64_t> addr;
  std::atomic<uint64_t> length;
  std::atomic<uint64_t> host;
  std::atomic<uint64_t> tag;
  uint64_t pad[2];
};

static_assert(sizeof(detail::PlacementHeader) == 64);
static_assert(sizeof(detail::PlacementSlot) == 64);
static_assert(sizeof(detail::PlacementPinner) == 64);

size_t PlacementTable::region_bytes() {
  const size_t b = sizeof(detail::PlacementHeader) + size_t{kPinners} * sizeof(Pinner) +
                   size_t{kSlots} * sizeof(Slot);
  return (b + kMailboxPageBytes - 1) / kMailboxPageBytes * kMailboxPageBytes;
}

PlacementTable::Pinner* PlacementTable::pinner(uint32_t i) const {
  return reinterpret_cast<Pinner*>(reinterpret_cast<uint8_t*>(hdr_) +
                                   sizeof(detail::PlacementHeader)) +
         i;
}

PlacementTable::Slot* PlacementTable::slot(uint32_t i) const {
  return reinterpret_cast<Slot*>(pinner(kPinners)) + i;
}

void PlacementTable::init_owner(void* region) {
  hdr_ = static_cast<detail::PlacementHeader*>(region);
  pid_ = 0;
  owned_.clear();
  uint64_t c = 0;
  while (c == 0) {
    if (getrandom(&c, sizeof c, GRND_NONBLOCK) != sizeof c)
      c = real_ns() ^ reinterpret_cast<uintptr_t>(this);
  }
  cookie_ = c;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  for (uint32_t i = 0; i < kPinners; ++i) {
    pthread_mutex_init(&pinner(i)->lock, &attr);
    pinner(i)->qp.store(0, std::memory_order_relaxed);
    pinner(i)->region.store(0, std::memory_order_relaxed);
  }
  pthread_mutexattr_destroy(&attr);
  hdr_->cookie = c;
  hdr_->cookie_addr = reinterpret_cast<uintptr_t>(&cookie_);
  hdr_->slots = kSlots;
  hdr_->magic.store(kTableMagic, std::memory_order_release);
}

bool PlacementTable::attach(void* region, size_t bytes, uint32_t pid) {
  reset();
  auto* h = static_cast<detail::PlacementHeader*>(region);
  if (bytes < region_bytes() || h->magic.load(std::memory_order_acquire) != kTableMagic ||
      h->slots != kSlots || pid == 0)
    return false;
  hdr_ = h;
  pid_ = pid;
  return true;
}

void PlacementTable::reset() {
  hdr_ = nullptr;
  pid_ = 0;
  owned_.clear();
}

bool PlacementTable::publish(PlaceKind kind, uint32_t key, const PlaceEntry& e) {
  if (!hdr_) return false;
  const uint64_t ident = ident_of(kind, key);
  uint32_t at = kSlots;
  if (auto it = owned_.find(ident); it != owned_.end()) {
    at = it->second;
    withdraw(kind, key);  // the old range must see no more writes before the new one shows
  } else {
    // The first slot of the probe sequence that holds no live entry: never used, or left by
    // a withdrawn one whose pins are gone (a slot still pinned by a sender withdraw() gave up
    // on keeps its count, and is not reused).
    for (uint32_t n = 0, i = home_of(ident); n < kSlots; ++n, i = (i + 1) & (kSlots - 1)) {
      const uint64_t st = slot(i)->state.load(std::memory_order_relaxed);
      if (slot(i)->ident.load(std::memory_order_relaxed) == 0 ||
          ((st & kValid) == 0 && (st & kPinMask) == 0)) {
        at = i;
        break;
      }
    }
    if (at == kSlots) return false;
  }
  Slot* s = slot(at);
  // Invalid while it changes, keeping any pins a withdraw() gave up on (they are only ever
  // taken off again, by the sender that took them).
  uint64_t st = s->state.load(std::memory_order_relaxed);
  uint64_t gen = 0;
  do {
    gen = (st & ~(kGenOne - 1)) + kGenOne;
  } while (!s->state.compare_exchange_weak(st, gen | (st & kPinMask), std::memory_order_relaxed));
  std::atomic_thread_fence(std::memory_order_release);
  s->ident.store(ident, std::memory_order_relaxed);
  s->addr.store(e.addr, std::memory_order_relaxed);
  s->length.store(e.length, std::memory_order_relaxed);
  s->host.store(e.host, std::memory_order_relaxed);
  s->tag.store(e.tag, std::memory_order_relaxed);
  s->state.fetch_add(kGenOne + kValid, std::memory_order_release);
  owned_[ident] = at;
  return true;
}

uint32_t PlacementTable::withdraw(PlaceKind kind, uint32_t key) {
  auto it = owned_.find(ident_of(kind, key));
  if (!hdr_ || it == owned_.end()) return 0;
  Slot* s = slot(it->second);
  owned_.erase(it);
  // Unpublish: a new generation, not valid; pins already taken stay counted.
  uint64_t st = s->state.load(std::memory_order_relaxed);
  while (!s->state.compare_exchange_weak(st, ((st & ~(kGenOne - 1)) + kGenOne) | (st & kPinMask),
                                         std::memory_order_acq_rel)) {
  }
  if ((st & kPinMask) == 0) return 0;
  // Senders that pinned before the change finish one system call: wait for them, yielding,
  // and take off the pins of any that died holding them.
  const uint64_t until = real_ns() + kWithdrawWaitNs;
  for (uint32_t spins = 0;; ++spins) {
    const uint64_t pins = s->state.load(std::memory_order_acquire) & kPinMask;
    if (pins == 0) return 0;
    if (real_ns() > until) return static_cast<uint32_t>(pins);
    if (spins % 16 == 0 && repair_dead_pinners() != 0) continue;
    if (spins < 64) {
      sched_yield();
    } else {
      timespec ts{0, 50'000};
      nanosleep(&ts, nullptr);
    }
  }
}

PlacementTable::PinnerLock PlacementTable::try_lock_pinner(Pinner* p) const {
  const int rc = pthread_mutex_trylock(&p->lock);
  if (rc == 0) return PinnerLock::kTaken;
  if (rc != EOWNERDEAD) return PinnerLock::kBusy;  // held by a live sender (EBUSY), or unusable
  // Its holder died: take off the pins it recorded, then the entry is as good as new.
  for (std::atomic<uint32_t>* rec : {&p->region, &p->qp}) {
    const uint32_t at = rec->exchange(0, std::memory_order_acq_rel);
    if (at != 0 && at <= kSlots) slot(at - 1)->state.fetch_sub(1, std::memory_order_release);
  }
  pthread_mutex_consistent(&p->lock);
  return PinnerLock::kRepaired;
}

PlacementTable::Pinner* PlacementTable::take_pinner() const {
  for (uint32_t n = 0; n < kPinners; ++n) {
    const uint32_t i = (pinner_hint_ + n) % kPinners;
    if (try_lock_pinner(pinner(i)) == PinnerLock::kBusy) continue;
    pinner_hint_ = i;
    return pinner(i);
  }
  return nullptr;
}

uint32_t PlacementTable::repair_dead_pinners() {
  uint32_t found = 0;
  for (uint32_t i = 0; i < kPinners; ++i) {
    const PinnerLock got = try_lock_pinner(pinner(i));
    if (got == PinnerLock::kBusy) continue;
    found += got == PinnerLock::kRepaired;
    pthread_mutex_unlock(&pinner(i)->lock);
  }
  return found;
}

bool PlacementTable::try_pin(Slot* s, uint64_t seen) {
  // Unless the owner changed the entry since `seen` was read (other senders' pins may move).
  for (uint64_t cur = seen;;) {
    if ((cur & ~kPinMask) != (seen & ~kPinMask) || (cur & kPinMask) == kPinMask) return false;
    if (s->state.compare_exchange_weak(cur, cur + 1, std::memory_order_acquire)) return true;
  }
}

int PlacementTable::find(uint64_t ident) const {
  for (uint32_t n = 0, i = home_of(ident); n < kSlots; ++n, i = (i + 1) & (kSlots - 1)) {
    const uint64_t id = slot(i)->ident.load(std::memory_order_relaxed);
    if (id == 0) return -1;
    if (id == ident) return static_cast<int>(i);
  }
  return -1;
}

bool PlacementTable::verify_owner(int* err) const {
  *err = 0;
  if (!hdr_) return false;
  uint64_t seen = 0;
  iovec local{&seen, sizeof seen};
  iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(hdr_->cookie_addr)), sizeof seen};
  const ssize_t n = process_vm_readv(static_cast<pid_t>(pid_), &local, 1, &remote, 1, 0);
  if (n != static_cast<ssize_t>(sizeof seen)) {
    *err = n < 0 ? errno : EFAULT;
    return false;
  }
  return seen == hdr_->cookie;
}

PlaceResult PlacementTable::pin(uint32_t qpn, uint32_t rkey, uint64_t va, size_t len,
                                Pinned* out) const {
  if (!hdr_) return PlaceResult::kRefused;
  // The QP: read as a seqlock, then pinned (withdrawing it waits for the sender's header).
  const int qi = find(ident_of(PlaceKind::kQp, qpn));
  if (qi < 0) return PlaceResult::kRefused;
  Slot* q = slot(static_cast<uint32_t>(qi));
  const uint64_t qs = q->state.load(std::memory_order_acquire);
  const uint64_t qid = q->ident.load(std::memory_order_relaxed);
  const uint64_t qtag = q->tag.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (!(qs & kValid) || qid != ident_of(PlaceKind::kQp, qpn)) return PlaceResult::kRefused;
  Pinner* pn = take_pinner();
  if (!pn) return PlaceResult::kRefused;
  if (!try_pin(q, qs)) {
    pthread_mutex_unlock(&pn->lock);
    return PlaceResult::kRefused;
  }
  pn->qp.store(static_cast<uint32_t>(qi) + 1, std::memory_order_release);
  Pinned held{pn, q, nullptr, 0, 0};
  // The region: pinned as well.
  const int ri = find(ident_of(PlaceKind::kRegion, rkey));
  if (ri < 0) {
    unpin(held);
    return PlaceResult::kRefused;
  }
  Slot* r = slot(static_cast<uint32_t>(ri));
  const uint64_t rs = r->state.load(std::memory_order_acquire);
  const uint64_t rid = r->ident.load(std::memory_order_relaxed);
  const uint64_t addr = r->addr.load(std::memory_order_relaxed);
  const uint64_t length = r->length.load(std::memory_order_relaxed);
  const uint64_t host = r->host.load(std::memory_order_relaxed);
  const uint64_t rtag = r->tag.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (!(rs & kValid) || rid != ident_of(PlaceKind::kRegion, rkey) || rtag != qtag || va < addr ||
      va - addr > length || len > length - (va - addr) || !try_pin(r, rs)) {
    unpin(held);
    return PlaceResult::kRefused;
  }
  pn->region.store(static_cast<uint32_t>(ri) + 1, std::memory_order_release);
  *out = Pinned{pn, q, r, host + (va - addr), len};
  return PlaceResult::kPlaced;
}

PlaceResult PlacementTable::copy(const Pinned& p, const iovec* iov, size_t iovcnt, int* err) const {
  *err = 0;
  iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(p.remote)), p.len};
  const ssize_t n = process_vm_writev(static_cast<pid_t>(pid_), iov, iovcnt, &remote, 1, 0);
  if (n == static_cast<ssize_t>(p.len)) return PlaceResult::kPlaced;
  *err = n < 0 ? errno : EFAULT;
  return PlaceResult::kFailed;
}

void PlacementTable::unpin(const Pinned& p) const {
  if (!p.pinner) return;
  // Each record cleared before its pin goes: a repair after this thread's death never takes a
  // pin off twice.
  if (p.region) {
    p.pinner->region.store(0, std::memory_order_seq_cst);
    p.region->state.fetch_sub(1, std::memory_order_release);
  }
  if (p.qp) {
    p.pinner->qp.store(0, std::memory_order_seq_cst);
    p.qp->state.fetch_sub(1, std::memory_order_release);
  }
  pthread_mutex_unlock(&p.pinner->lock);
}

PlaceResult PlacementTable::place(uint32_t qpn, uint32_t rkey, uint64_t va, const iovec* iov,
                                  size_t iovcnt, size_t len, int* err) const {
  *err = 0;
  Pinned p;
  if (pin(qpn, rkey, va, len, &p) != PlaceResult::kPlaced) return PlaceResult::kRefused;
  const PlaceResult r = copy(p, iov, iovcnt, err);
  unpin(p);
  return r;
}

}  // namespace softrdma::net
