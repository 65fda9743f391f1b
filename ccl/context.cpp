#include "ccl/context.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

namespace softrdma::ccl::detail {

void validate_config(const Config& c) {
  switch (c.algorithm) {
    case Algorithm::kAuto:
    case Algorithm::kRing:
    case Algorithm::kRecursiveDoubling:
    case Algorithm::kRabenseifner:
    case Algorithm::kHierarchical:
      break;
    default:
      throw std::invalid_argument("Config: unknown algorithm value " +
                                  std::to_string(static_cast<int>(c.algorithm)));
  }
  if (c.chunk_bytes == 0 || c.chunk_bytes > Config::kMaxChunkBytes)
    throw std::invalid_argument("Config: chunk_bytes " + std::to_string(c.chunk_bytes) +
                                " outside [1, 1 GiB]");
  if (c.site.size() > Config::kMaxSiteName || c.site.find('\0') != std::string::npos)
    throw std::invalid_argument("Config: site '" + c.site +
                                "' longer than 63 characters or holding a NUL");
  if (static_cast<unsigned>(c.wan_compress) > static_cast<unsigned>(WanCompression::kBfloat16))
    throw std::invalid_argument("Config: unknown wan_compress value " +
                                std::to_string(static_cast<int>(c.wan_compress)));
  if (c.depth < 1 || c.depth > Config::kMaxDepth)
    throw std::invalid_argument("Config: depth " + std::to_string(c.depth) + " outside [1, " +
                                std::to_string(Config::kMaxDepth) + "]");
}

size_t depth_for_path(const Config& config, uint64_t path_bytes) {
  const auto floor = static_cast<size_t>(config.depth);
  if (!config.depth_from_path || path_bytes == 0) return floor;
  const uint64_t chunks = path_bytes / config.chunk_bytes + (path_bytes % config.chunk_bytes != 0);
  return std::max(floor, static_cast<size_t>(
                             std::min<uint64_t>(chunks, static_cast<uint64_t>(Config::kMaxDepth))));
}

size_t Context::depth(int peer) const {
  return depth_for_path(config_, t_.path_bytes(peer));
}

std::shared_ptr<Buffer> RegistrationCache::find_or_register(const void* p, size_t bytes,
                                                            size_t& offset) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->addr <= addr && addr - it->addr <= it->bytes &&
        bytes <= it->bytes - (addr - it->addr)) {
      lru_.splice(lru_.begin(), lru_, it);
      offset = addr - it->addr;
      ++hits_;
      return it->buf;
    }
  }
  ++misses_;
  std::shared_ptr<Buffer> buf = t_.register_buffer(const_cast<void*>(p), bytes);
  // Entries inside the new range are redundant now.
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (addr <= it->addr && it->addr - addr <= bytes && it->bytes <= bytes - (it->addr - addr))
      it = lru_.erase(it);
    else
      ++it;
  }
  lru_.push_front({addr, bytes, buf});
  while (lru_.size() > cap_) lru_.pop_back();
  offset = 0;
  return buf;
}

struct ScratchArena::Block {
  explicit Block(size_t n) : bytes(n), mem(static_cast<char*>(std::aligned_alloc(64, n))) {
    if (mem == nullptr) throw std::bad_alloc();
  }
  ~Block() {
    reg.reset();  // deregister before the memory goes
    std::free(mem);
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  size_t bytes;
  char* mem;
  std::unique_ptr<Buffer> reg;
};

std::shared_ptr<void> ScratchArena::get(size_t bytes, Region& out) {
  if (!block_ || block_->bytes < bytes) {
    // Round up to 64 KiB (aligned_alloc wants a multiple of the alignment) and at least
    // double, so a sequence of growing requests reallocates O(log) times.
    constexpr size_t kGrain = 64 * 1024;
    size_t want = bytes < kGrain ? kGrain : (bytes + kGrain - 1) / kGrain * kGrain;
    if (block_ && want < 2 * block_->bytes) want = 2 * block_->bytes;
    auto b = std::make_shared<Block>(want);
    b->reg = t_.register_buffer(b->mem, b->bytes);
    block_ = std::move(b);
  }
  out = Region{block_->reg.get(), 0, block_->mem};
  return block_;
}

size_t ScratchArena::capacity() const {
  return block_ ? block_->bytes : 0;
}

Context::Context(Transport& transport, const Config& config, RegistrationCache& cache,
                 ScratchArena& scratch, const char* op, uint64_t tag_base)
    : t_(transport),
      config_(config),
      cache_(cache),
      scratch_(scratch),
      op_(op),
      tag_base_(tag_base),
      rank_(transport.rank()),
      size_(transport.size()) {}

Region Context::user(const void* p, size_t bytes) {
  size_t offset = 0;
  std::shared_ptr<Buffer> buf = cache_.find_or_register(p, bytes, offset);
  Region r{buf.get(), offset, static_cast<char*>(const_cast<void*>(p))};
  pins_.push_back(std::move(buf));
  return r;
}

Region Context::scratch(size_t bytes) {
  Region r;
  pins_.push_back(scratch_.get(reserved_ + bytes, r));
  return r.at(reserved_);
}

Region Context::scratch_reserve(size_t bytes) {
  const Region r = scratch(bytes);
  reserved_ += (bytes + 63) / 64 * 64;  // keeps the next region 64-byte aligned
  return r;
}

size_t Context::chunk_elems(DataType type) const {
  const size_t n = config_.chunk_bytes / type_size(type);
  return n == 0 ? 1 : n;
}

}  // namespace softrdma::ccl::detail
