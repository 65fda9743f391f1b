// What a collective algorithm sees while it runs (internal to ccl/): the transport, the
// tunables, registered views of the user's buffers and of internal scratch memory, and the
// tags of this operation. Gloo's Context plays the same part for its algorithms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "ccl/ccl.h"
#include "ccl/transport.h"

namespace softrdma::ccl::detail {

/// Throws std::invalid_argument naming the bad field of `c` (bounds: Config::kMaxChunkBytes,
/// Config::kMaxDepth).
void validate_config(const Config& c);

/// Registered memory: `ptr` lies `offset` bytes into the registered buffer `buf`.
struct Region {
  Buffer* buf = nullptr;
  size_t offset = 0;
  char* ptr = nullptr;

  /// The region `bytes` further on.
  Region at(size_t bytes) const { return {buf, offset + bytes, ptr + bytes}; }
};

/// User-buffer registrations, cached by address range so that repeated collectives on the
/// same buffers register nothing. A lookup hits when a cached registration covers the whole
/// requested range (a registration is never used beyond its range); a miss registers
/// exactly the requested range and drops cached entries it contains. At most `capacity`
/// entries are kept, least recently used evicted first; a registration stays alive while an
/// operation still holds it (shared ownership), even after eviction.
///
/// Like NCCL's user-buffer registration, the cache assumes a cached range is not unmapped
/// and remapped with other pages while the communicator lives: softrdma resolves virtual
/// addresses at transfer time, so that is harmless there, but a NIC's MR pins the pages it
/// saw at registration.
class RegistrationCache {
 public:
  RegistrationCache(Transport& transport, size_t capacity) : t_(transport), cap_(capacity) {}

  /// A registration covering [p, p+bytes) and the offset of p inside it. Errors: those of
  /// Transport::register_buffer.
  std::shared_ptr<Buffer> find_or_register(const void* p, size_t bytes, size_t& offset);
  /// Entries currently cached.
  size_t size() const { return lru_.size(); }
  /// Lookups served from the cache / by a new registration, since construction.
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  struct Entry {
    uintptr_t addr;
    size_t bytes;
    std::shared_ptr<Buffer> buf;
  };
  Transport& t_;
  size_t cap_;
  std::list<Entry> lru_;  // most recently used first
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

/// Internal memory for received chunks and accumulators, 64-byte aligned, registered once
/// and grown (never shrunk) when an operation needs more.
class ScratchArena {
 public:
  explicit ScratchArena(Transport& transport) : t_(transport) {}
  /// A block of at least `bytes`; the returned owner keeps it alive even if a later call
  /// grows the arena.
  std::shared_ptr<void> get(size_t bytes, Region& out);
  /// Bytes currently allocated.
  size_t capacity() const;

 private:
  struct Block;
  Transport& t_;
  std::shared_ptr<Block> block_;
};

/// Chunks in flight per peer over a path of `path_bytes` (its bandwidth-delay product, 0 =
/// unknown): Config::depth, raised to ⌈path_bytes ÷ chunk_bytes⌉ when depth_from_path, at
/// most Config::kMaxDepth.
size_t depth_for_path(const Config& config, uint64_t path_bytes);

/// One running operation: transport calls annotated with the operation name, tags unique
/// to this operation, and the registrations it pins until it returns.
class Context {
 public:
  /// `tag_base` holds the operation's sequence number (bits 32..63); tag() adds a phase and
  /// a transfer index below it.
  Context(Transport& transport, const Config& config, RegistrationCache& cache,
          ScratchArena& scratch, const char* op, uint64_t tag_base);

  /// The transport, the tunables, and this rank's place in the communicator.
  Transport& transport() { return t_; }
  const Config& config() const { return config_; }
  /// The operation's name, for error messages ("AllReduce").
  const char* op() const { return op_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  /// The user's [p, p+bytes) as a registered region (through the cache; pinned until this
  /// Context is destroyed).
  Region user(const void* p, size_t bytes);
  /// Scratch memory of at least `bytes` (contents undefined), valid until this Context is
  /// destroyed even if it is called again. Successive calls may return the same memory
  /// (the arena is one block), except what scratch_reserve() set aside.
  Region scratch(size_t bytes);
  /// Scratch memory of at least `bytes` that later scratch() calls of this Context never
  /// overlap (an algorithm's own buffer that lives while it runs pipelines).
  Region scratch_reserve(size_t bytes);

  /// The tag of transfer `index` of sub-phase `phase` of this operation. Per ordered pair of
  /// ranks, (phase, index mod 2^24) must be unique among the transfers in flight.
  uint64_t tag(uint8_t phase, uint64_t index) const {
    return tag_base_ | (uint64_t{phase} << 24) | (index & 0xffffffu);
  }
  /// Elements per pipeline chunk for `type` (Config::chunk_bytes, at least one element).
  size_t chunk_elems(DataType type) const;
  /// Chunks to keep in flight to and from `peer`: depth_for_path(config(),
  /// transport().path_bytes(peer)).
  size_t depth(int peer) const;

  /// Transport::send / recv of `bytes` at region `r` (its buffer and offset).
  RequestId send(int peer, const Region& r, size_t bytes, uint64_t tag) {
    return t_.send(peer, *r.buf, r.offset, bytes, tag);
  }
  RequestId recv(int peer, const Region& r, size_t bytes, uint64_t tag) {
    return t_.recv(peer, *r.buf, r.offset, bytes, tag);
  }
  /// Transport::wait / test, naming this operation in errors.
  void wait(RequestId id) { t_.wait(id, op_); }
  bool test(RequestId id) { return t_.test(id, op_); }

 private:
  Transport& t_;
  const Config& config_;
  RegistrationCache& cache_;
  ScratchArena& scratch_;
  const char* op_;
  uint64_t tag_base_;
  size_t reserved_ = 0;  // bytes at the arena's start set aside by scratch_reserve()
  int rank_;
  int size_;
  std::vector<std::shared_ptr<void>> pins_;
};

/// Element segment k of n near-equal parts of `count` elements: [offset, offset + elems).
struct Segment {
  size_t offset;
  size_t elems;
};
inline Segment segment(size_t count, int n, int k) {
  const size_t base = count / static_cast<size_t>(n);
  const size_t rem = count % static_cast<size_t>(n);
  const auto ku = static_cast<size_t>(k);
  return {ku * base + (ku < rem ? ku : rem), base + (ku < rem ? 1 : 0)};
}

/// (a mod n) for possibly negative a.
inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}

}  // namespace softrdma::ccl::detail
