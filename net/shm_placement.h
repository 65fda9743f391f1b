// Direct placement on the same-host path (issue 25, item 3): one copy from the requester's
// memory into the responder's.
//
// Over the same-host rings (net/shm_port.h) an RDMA WRITE's payload is copied twice — into the
// ring by the sender, out of it by the receiver's progress thread — and lands only when that
// thread runs. A device therefore publishes, in a table inside its mailbox, what a peer may
// write into directly: each registered region that allows remote writes (its R_Key, its
// address range as requests name it, where that range lies in the owner's address space,
// its protection domain) and each QP that takes RDMA WRITEs (its QPN and protection domain).
// A same-host sender checks a WRITE against that table as the responder would (the QP allows
// it, the region is in the QP's protection domain, the range lies inside) and copies the
// payload straight into the responder's memory with process_vm_writev(2) (cross-memory attach:
// no root between processes of one user; refused where ptrace rules forbid it, and then the
// payload travels in the ring as before). The ring then carries the packet's headers only, and
// the responder runs every check of its own on them (engine/placement.h).
//
// Memory safety across processes: a sender *pins* a region's entry (a count in the entry's state
// word, taken with a compare-and-swap that fails if the owner changed the entry) for the one
// system call, and the owner's withdraw() — called when the region is deregistered or its
// translation changes — first unpublishes the entry and then waits until no sender holds a pin,
// so memory is never written after ibv_dereg_mr returned.
//
// Senders that die holding a pin (SIGKILL lands inside the copy more often than not: a sender
// streaming WRITEs spends most of its time in process_vm_writev): a pin is taken only while the
// sender holds one of kPinners *pinner* entries, a robust process-shared mutex
// (pthread_mutexattr_setrobust(3)) beside a record of the entries it pinned. When a holder dies
// the kernel marks its mutex "owner died" (the robust futex list; no pid is involved, so this
// holds across pid namespaces), and the next thread to take it — a sender looking for a free
// entry, or an owner whose withdraw() finds pins outstanding — takes the dead holder's pins off
// as its record says. A record is written after its pin is taken and cleared before the pin is
// released, so a repair never releases a pin twice; a holder killed between those two steps
// leaks its pin, which withdraw() waits for at most kWithdrawWaitNs (then logged by the caller).
//
// Identity: a pid names a process only in its pid namespace. Before the first placement into a
// peer the sender reads a random 64-bit cookie from the owner's memory at the address the table
// publishes (process_vm_readv(2)) and compares it with the cookie in the table; only a match
// lets it write (verify_owner()).
//
// Shared layout: a header line, kPinners pinner entries of 64 bytes, and kSlots entries of 64
// bytes (an open-addressing hash table by kind and key with linear probing); 264 KiB in all.
// Only the owner writes entries (under its device lock); senders only read them and move pin
// counts.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace softrdma::net {

/// The unit the same-host mailbox aligns its parts to (its header, ring controls, this table),
/// and to which PlacementTable::region_bytes() rounds: bytes.
inline constexpr uint64_t kMailboxPageBytes = 4096;

namespace detail {
struct PlacementHeader;
struct PlacementPinner;
struct PlacementSlot;
}  // namespace detail

/// What a table entry describes.
enum class PlaceKind : uint8_t {
  kRegion = 1,  ///< a memory region remote writes may target; key: its R_Key
  kQp = 2,      ///< a QP that takes RDMA WRITEs; key: its QPN
};

/// One published entry. For kRegion: requests name [addr, addr + length) (the MR's iova
/// range), which lies at `host` in the owner's address space; `tag` is its protection domain.
/// For kQp: `tag` is the QP's protection domain; addr, length and host are 0.
struct PlaceEntry {
  uint64_t addr = 0;    ///< first byte as remote requests name it (iova)
  uint64_t length = 0;  ///< bytes
  uint64_t host = 0;    ///< owner's virtual address of byte `addr`
  uint32_t tag = 0;     ///< protection domain, compared between a region and a QP
};

/// Outcome of PlacementTable::place().
enum class PlaceResult : uint8_t {
  kPlaced,   ///< every byte was written into the owner's memory
  kRefused,  ///< nothing published allows it (no such QP or region, another protection
             ///< domain, out of range, the entry changing): send the payload in the ring,
             ///< where the responder decides
  kFailed,   ///< the system call failed or wrote less (errno in *err): EFAULT (our memory or
             ///< theirs unmapped) is per request; EPERM/ENOSYS/ESRCH mean never for this peer
};

/// The table of one mailbox: owned (init_owner) by the device that publishes, or attached
/// (attach) by a sender to a peer's. Not thread-safe on either side: the owner calls it under
/// its device lock, a sender under its own.
class PlacementTable {
 public:
  static constexpr uint32_t kSlots = 4096;  ///< entries: regions plus QPs
  /// Senders that may hold pins in one table at one time (each holds a pinner entry from pin()
  /// to unpin(); with all taken, pin() refuses and the payload takes the ring).
  static constexpr uint32_t kPinners = 64;
  /// withdraw() waits this long at most for senders' pins to go, ns (real time: a pin is held
  /// for one system call; a sender that died holding one is found at once — see the file
  /// comment — unless it died in the few instructions between a pin and its record).
  static constexpr uint64_t kWithdrawWaitNs = 2'000'000'000;
  /// Bytes of the shared region: header + kPinners + kSlots entries, a multiple of 4096.
  static size_t region_bytes();

  PlacementTable() = default;
  PlacementTable(const PlacementTable&) = delete;
  PlacementTable& operator=(const PlacementTable&) = delete;

  /// Owner: formats `region` (region_bytes(), zero-filled, page-aligned) and publishes this
  /// object's cookie. The object must not move while the table is in use.
  void init_owner(void* region);
  /// Sender: attaches to a peer's `region` of `bytes` owned by process `pid`. False when the
  /// header is not a table's (then nothing is ever placed into that peer).
  bool attach(void* region, size_t bytes, uint32_t pid);
  /// Detaches (either side); the memory stays mapped by its owner (ShmPort).
  void reset();
  bool attached() const { return hdr_ != nullptr; }

  /// Owner: publishes (or replaces) the entry of (kind, key). False when the table is full
  /// (the entry is then simply not placed into: requests take the ring).
  bool publish(PlaceKind kind, uint32_t key, const PlaceEntry& e);
  /// Owner: removes the entry of (kind, key), if any, and returns once no sender can still
  /// write through it — at once when none holds a pin, else after they finish or are found
  /// dead (at most kWithdrawWaitNs). Returns the pins still held when it gave up waiting (0
  /// normally).
  uint32_t withdraw(PlaceKind kind, uint32_t key);
  /// Owner: entries published now.
  size_t published() const { return owned_.size(); }

  /// Sender: whether the owner is the process this table's pid names (see the file comment);
  /// false with *err set to the failing call's errno (EPERM: ptrace rules forbid cross-memory
  /// attach) or 0 for a cookie mismatch.
  bool verify_owner(int* err) const;
  /// Sender: a region pinned for one copy (pin()).
  struct Pinned {
    detail::PlacementPinner* pinner = nullptr;  ///< held from pin() to unpin()
    detail::PlacementSlot* qp = nullptr;
    detail::PlacementSlot* region = nullptr;
    uint64_t remote = 0;  ///< the owner's address of the first byte
    size_t len = 0;
  };
  /// Sender: checks that `len` bytes at `va` of region `rkey` may be written through QP `qpn`
  /// of the owner — the QP is published, the region is published in the QP's protection
  /// domain and [va, va + len) lies inside it — and pins the QP's and the region's entries
  /// (kPlaced, *out set): the owner's withdraw() of either waits until unpin(), which the same
  /// thread must call. So the owner, before it tears the QP down, can wait for a sender that
  /// placed bytes to have sent their headers too (engine: modify_qp to ERR). kRefused
  /// otherwise (nothing pinned; also when all kPinners entries are held).
  PlaceResult pin(uint32_t qpn, uint32_t rkey, uint64_t va, size_t len, Pinned* out) const;
  /// Sender: copies the pinned range from iov[0..iovcnt) (iovcnt ≤ IOV_MAX, `len` bytes in all)
  /// with process_vm_writev(2): kPlaced, or kFailed with *err. Leaves the pin.
  PlaceResult copy(const Pinned& p, const iovec* iov, size_t iovcnt, int* err) const;
  /// Sender: releases a pin().
  void unpin(const Pinned& p) const;
  /// Sender: pin(), copy(), unpin().
  PlaceResult place(uint32_t qpn, uint32_t rkey, uint64_t va, const iovec* iov, size_t iovcnt,
                    size_t len, int* err) const;

 private:
  using Slot = detail::PlacementSlot;
  /// Pins `s` if its state, but for pins, is still `seen`.
  static bool try_pin(Slot* s, uint64_t seen);
  using Pinner = detail::PlacementPinner;
  /// The slot holding (kind, key) on the sender's side: index, or -1.
  int find(uint64_t ident) const;
  Slot* slot(uint32_t i) const;
  Pinner* pinner(uint32_t i) const;
  enum class PinnerLock : uint8_t {
    kBusy,      ///< not taken: a live holder has it
    kTaken,     ///< taken, it was free
    kRepaired,  ///< taken from a holder that died, whose recorded pins were taken off
  };
  /// Either side: tries to lock `p`, repairing it when its holder died.
  PinnerLock try_lock_pinner(Pinner* p) const;
  /// Sender: locks a free pinner entry (repairing one whose holder died), or nullptr.
  Pinner* take_pinner() const;
  /// Owner: repairs every pinner entry whose holder died; returns how many it found.
  uint32_t repair_dead_pinners();

  detail::PlacementHeader* hdr_ = nullptr;
  uint32_t pid_ = 0;                  // sender: the owner's pid
  uint64_t cookie_ = 0;               // owner: the value whose address the header publishes
  mutable uint32_t pinner_hint_ = 0;  // sender: the pinner entry it took last
  std::unordered_map<uint64_t, uint32_t> owned_;  // owner: ident → slot
};

}  // namespace softrdma::net
