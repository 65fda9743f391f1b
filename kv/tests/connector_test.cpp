// Layer-wise hand-off: the producer saves layer by layer while "computing"; the consumer
// waits per layer and finds each layer's blocks complete as soon as its wait returns.
#include <gtest/gtest.h>

#include <thread>

#include "kv/connector.h"
#include "kv/tests/kv_test_util.h"

namespace softrdma::kv {
namespace {

using namespace std::chrono_literals;

void handoff(const char* model, uint32_t block_tokens, uint32_t num_blocks) {
  test::TempStore store;
  Engine prefill("prefill", store.store(), test::test_options());
  Engine decode("decode", store.store(), test::test_options());
  const PagedKvLayout layout(model_shape(model), block_tokens, num_blocks);
  std::vector<uint8_t> src(layout.total_bytes()), dst(layout.total_bytes(), 0);
  prefill.register_memory(src.data(), src.size(), "cpu:0", "cache");
  decode.register_memory(dst.data(), dst.size(), "cpu:0", "cache");

  KvRequest req;
  req.id = 42;
  req.peer = "decode";
  req.remote = prefill.open_segment("decode", "cache");
  // Runs of consecutive blocks and single ones, placed elsewhere on the decode side.
  req.local_blocks = {0, 1, 2, 5, 7, 8};
  req.remote_blocks = {3, 4, 5, 0, 9, 1};
  auto seed = [](uint32_t layer, uint32_t part, uint32_t block) {
    return uint64_t{layer} << 32 | part << 16 | block;
  };
  std::thread producer([&] {
    KvProducer p(prefill, layout, src.data());
    for (uint32_t layer = 0; layer < layout.model().layers; ++layer) {
      for (uint32_t part = 0; part < layout.model().parts(); ++part)
        for (uint32_t blk : req.local_blocks)
          test::fill(src.data() + layout.offset(layer, part, blk), layout.block_bytes(),
                     seed(layer, part, blk));
      p.save_layer(req, layer);
    }
    p.wait_for_save(30s);
  });
  KvConsumer c(decode);
  for (uint32_t layer = 0; layer < layout.model().layers; ++layer) {
    c.wait_for_layer(42, layer, "prefill", 30s);
    for (uint32_t part = 0; part < layout.model().parts(); ++part)
      for (size_t i = 0; i < req.local_blocks.size(); ++i)
        ASSERT_EQ(
            -1, test::first_mismatch(dst.data() + layout.offset(layer, part, req.remote_blocks[i]),
                                     layout.block_bytes(), seed(layer, part, req.local_blocks[i])))
            << "layer " << layer << " part " << part << " block " << req.remote_blocks[i];
  }
  producer.join();
  EXPECT_TRUE(c.take_other_notifications().empty());
}

TEST(Connector, LayerWiseHandoffLlama3_8B) {
  handoff("llama3-8b", 16, 10);
}

TEST(Connector, LayerWiseHandoffDeepSeekV3Latent) {
  handoff("deepseek-v3", 16, 10);
}

TEST(Connector, WaitingForALayerThatNeverComesTimesOutNamingThePeer) {
  test::TempStore store;
  Engine decode("decode", store.store(), test::test_options());
  KvConsumer c(decode);
  try {
    c.wait_for_layer(1, 0, "prefill", 300ms, 50ms);
    ADD_FAILURE();
  } catch (const KvError& e) {
    EXPECT_EQ("prefill", e.peer());
  }
}

TEST(Connector, MismatchedBlockListsAreRefused) {
  test::TempStore store;
  Engine prefill("prefill", store.store(), test::test_options());
  Engine decode("decode", store.store(), test::test_options());
  const PagedKvLayout layout(model_shape("qwen2.5-7b"), 16, 4);
  std::vector<uint8_t> src(layout.total_bytes()), dst(layout.total_bytes());
  prefill.register_memory(src.data(), src.size(), "cpu:0", "cache");
  decode.register_memory(dst.data(), dst.size(), "cpu:0", "cache");
  KvProducer p(prefill, layout, src.data());
  KvRequest req{1, "decode", prefill.open_segment("decode", "cache"), {0, 1}, {0}};
  EXPECT_THROW(p.save_layer(req, 0), std::invalid_argument);
  req.remote_blocks = {0, 4};  // block 4 of 4
  EXPECT_THROW(p.save_layer(req, 0), std::invalid_argument);
}

}  // namespace
}  // namespace softrdma::kv
