// Model shapes (bytes per token as published) and the paged layout's offsets.
#include <gtest/gtest.h>

#include "kv/layout.h"

namespace softrdma::kv {
namespace {

TEST(ModelShapes, BytesPerTokenMatchTheModelConfigs) {
  EXPECT_EQ(128u * 1024, model_shape("llama3-8b").bytes_per_token());
  EXPECT_EQ(320u * 1024, model_shape("llama3-70b").bytes_per_token());
  EXPECT_EQ(56u * 1024, model_shape("qwen2.5-7b").bytes_per_token());
  EXPECT_EQ(61u * 576 * 2, model_shape("deepseek-v3").bytes_per_token());  // ≈ 68.6 KiB
  EXPECT_EQ(1u, model_shape("deepseek-v3").parts());
  EXPECT_EQ(2u, model_shape("llama3-8b").parts());
  EXPECT_EQ(4u, model_shapes().size());
}

TEST(ModelShapes, UnknownNameListsTheKnownOnes) {
  try {
    model_shape("gpt-5");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("llama3-8b")) << e.what();
  }
}

TEST(PagedKvLayout, OffsetsAreLayerThenPartThenBlock) {
  const PagedKvLayout l(model_shape("llama3-8b"), 16, 10);
  const uint64_t bb = 16u * 8 * 128 * 2;  // 16 tokens × 8 heads × 128 × bf16
  EXPECT_EQ(bb, l.block_bytes());
  EXPECT_EQ(2 * 10 * bb, l.layer_bytes());
  EXPECT_EQ(32 * l.layer_bytes(), l.total_bytes());
  EXPECT_EQ(0u, l.offset(0, 0, 0));
  EXPECT_EQ(3 * bb, l.offset(0, 0, 3));
  EXPECT_EQ(10 * bb + 3 * bb, l.offset(0, 1, 3));
  EXPECT_EQ(5 * l.layer_bytes() + 10 * bb + 9 * bb, l.offset(5, 1, 9));
  EXPECT_EQ(l.total_bytes(), l.offset(31, 1, 9) + bb);
  EXPECT_THROW(l.offset(32, 0, 0), std::out_of_range);
  EXPECT_THROW(l.offset(0, 2, 0), std::out_of_range);
  EXPECT_THROW(l.offset(0, 0, 10), std::out_of_range);
  EXPECT_EQ(128u, l.blocks_for(2048));
  EXPECT_EQ(129u, l.blocks_for(2049));
  // A whole 2 K-token Llama-3-8B cache is 256 MiB.
  EXPECT_EQ(256u << 20, PagedKvLayout(model_shape("llama3-8b"), 16, 128).total_bytes());
}

TEST(PagedKvLayout, MlaHasOnePart) {
  const PagedKvLayout l(model_shape("deepseek-v3"), 64, 4);
  EXPECT_EQ(64u * 576 * 2, l.block_bytes());
  EXPECT_EQ(4 * l.block_bytes(), l.layer_bytes());
  EXPECT_THROW(l.offset(0, 1, 0), std::out_of_range);
  EXPECT_THROW(PagedKvLayout(model_shape("deepseek-v3"), 0, 4), std::invalid_argument);
}

}  // namespace
}  // namespace softrdma::kv
