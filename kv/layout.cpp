// Model shapes and the paged layout (layout.h).
#include "kv/layout.h"

#include <stdexcept>
#include <string>

namespace softrdma::kv {

namespace {

// config.json of each model: num_hidden_layers, num_key_value_heads, head_dim (hidden_size /
// num_attention_heads); DeepSeek-V3: kv_lora_rank + qk_rope_head_dim.
constexpr ModelShape kShapes[] = {
    {.name = "llama3-8b", .layers = 32, .kv_heads = 8, .head_dim = 128},
    {.name = "llama3-70b", .layers = 80, .kv_heads = 8, .head_dim = 128},
    {.name = "qwen2.5-7b", .layers = 28, .kv_heads = 4, .head_dim = 128},
    {.name = "deepseek-v3", .layers = 61, .latent_dim = 512 + 64},
};

}  // namespace

std::span<const ModelShape> model_shapes() {
  return kShapes;
}

const ModelShape& model_shape(std::string_view name) {
  std::string known;
  for (const ModelShape& m : kShapes) {
    if (m.name == name) return m;
    known += (known.empty() ? "" : ", ") + std::string(m.name);
  }
  throw std::invalid_argument("kv::model_shape: unknown model '" + std::string(name) +
                              "' (known: " + known + ")");
}

PagedKvLayout::PagedKvLayout(const ModelShape& model, uint32_t block_tokens, uint32_t num_blocks)
    : model_(&model), block_tokens_(block_tokens), num_blocks_(num_blocks) {
  if (block_tokens == 0 || num_blocks == 0)
    throw std::invalid_argument("kv::PagedKvLayout: block_tokens and num_blocks must be >= 1");
}

uint64_t PagedKvLayout::offset(uint32_t layer, uint32_t part, uint32_t block) const {
  if (layer >= model_->layers || part >= model_->parts() || block >= num_blocks_)
    throw std::out_of_range("kv::PagedKvLayout::offset: (layer " + std::to_string(layer) +
                            ", part " + std::to_string(part) + ", block " + std::to_string(block) +
                            ") is outside " + std::string(model_->name) + " with " +
                            std::to_string(num_blocks_) + " blocks");
  return layer * layer_bytes() + (uint64_t{part} * num_blocks_ + block) * block_bytes();
}

}  // namespace softrdma::kv
