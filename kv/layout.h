// Paged KV-cache layout: model shapes and where each (layer, K/V, block) lives in memory.
//
// vLLM's paged attention keeps one tensor per layer shaped [2, num_blocks, block_size,
// num_kv_heads, head_size] (K then V; vllm/attention/backends/flash_attn.py,
// get_kv_cache_shape), so one block of one layer is block_size·kv_heads·head_dim elements
// per part. DeepSeek-V3's multi-head latent attention caches one compressed latent per token
// per layer (kv_lora_rank 512 + qk_rope_head_dim 64 = 576 elements; DeepSeek-V3 config.json)
// instead of K and V: one part.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace softrdma::kv {

/// A model's KV-cache shape. Bytes per token (BF16): 2·layers·kv_heads·head_dim·2 for
/// K+V models; layers·latent_dim·2 for MLA.
struct ModelShape {
  std::string_view name;
  uint32_t layers = 0;
  uint32_t kv_heads = 0;    ///< K/V heads (grouped-query attention); 0 for MLA
  uint32_t head_dim = 0;    ///< elements per head; 0 for MLA
  uint32_t latent_dim = 0;  ///< MLA: elements per token per layer; 0 otherwise
  uint32_t elem_bytes = 2;  ///< BF16

  bool mla() const { return latent_dim != 0; }
  /// Parts per layer: 2 (K, V) or 1 (the MLA latent).
  uint32_t parts() const { return mla() ? 1 : 2; }
  /// Bytes of one part for one token in one layer.
  uint64_t part_bytes_per_token() const {
    return uint64_t{mla() ? latent_dim : kv_heads * head_dim} * elem_bytes;
  }
  /// Bytes of the whole cache for one token (every layer, every part).
  uint64_t bytes_per_token() const { return uint64_t{layers} * parts() * part_bytes_per_token(); }
};

/// The built-in shapes: Llama-3-8B (32 layers, 8 KV heads, 128; 128 KiB/token),
/// Llama-3-70B (80, 8, 128; 320 KiB), Qwen2.5-7B (28, 4, 128; 56 KiB), DeepSeek-V3 MLA
/// (61 layers × 576; ≈ 68.6 KiB). Sources: each model's config.json on Hugging Face.
std::span<const ModelShape> model_shapes();
/// The shape called `name` (case-sensitive, as listed). Throws std::invalid_argument listing
/// the known names.
const ModelShape& model_shape(std::string_view name);

/// One paged cache of `num_blocks` blocks of `block_tokens` tokens per layer, laid out as
/// vLLM does: layer-major, then part (K, V), then block.
class PagedKvLayout {
 public:
  /// Throws std::invalid_argument for zero block_tokens / num_blocks.
  PagedKvLayout(const ModelShape& model, uint32_t block_tokens, uint32_t num_blocks);

  const ModelShape& model() const { return *model_; }
  uint32_t block_tokens() const { return block_tokens_; }
  uint32_t num_blocks() const { return num_blocks_; }
  /// Bytes of one part of one block of one layer.
  uint64_t block_bytes() const { return uint64_t{block_tokens_} * model_->part_bytes_per_token(); }
  /// Bytes of one layer (all parts, all blocks).
  uint64_t layer_bytes() const { return uint64_t{model_->parts()} * num_blocks_ * block_bytes(); }
  /// Bytes of the whole cache.
  uint64_t total_bytes() const { return uint64_t{model_->layers} * layer_bytes(); }
  /// Byte offset of (layer, part, block). Throws std::out_of_range past the cache.
  uint64_t offset(uint32_t layer, uint32_t part, uint32_t block) const;
  /// Blocks that hold `tokens` tokens.
  uint32_t blocks_for(uint64_t tokens) const {
    return static_cast<uint32_t>((tokens + block_tokens_ - 1) / block_tokens_);
  }

 private:
  const ModelShape* model_;
  uint32_t block_tokens_;
  uint32_t num_blocks_;
};

}  // namespace softrdma::kv
