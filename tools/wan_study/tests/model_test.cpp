// The wide-area performance model (tools/wan_study/model.h) against cases computed by hand;
// each test's comment holds the hand computation. Rates: 1 Gbit/s = 125,000 B/ms.
#include "tools/wan_study/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

namespace softrdma::wan_model {
namespace {

TEST(WanModelTest, SerialisationAndFibre) {
  // 125e6 B × 8 / 1 Gbit/s = 1 s.
  EXPECT_DOUBLE_EQ(serialise_ms(125e6, 1), 1000);
  // 1,500 km: 2 × 1500 × 0.005 ms × 1.3 + 0.1 = 19.5 + 0.1 = 19.6 ms.
  EXPECT_NEAR(fibre_rtt_ms(1500), 19.6, 1e-9);
  // Same DC: 0 km → the 0.1 ms base.
  EXPECT_NEAR(fibre_rtt_ms(0), 0.1, 1e-12);
  Link l;
  l.rate_gbps = 10;
  l.rtt_ms = 50;
  // 1.25e6 B/ms × 50 ms = 62.5e6 B.
  EXPECT_DOUBLE_EQ(bdp_bytes(l), 62.5e6);
}

TEST(WanModelTest, NoRoundTripMeansNoRamp) {
  // RTT 0: 1.25e6 B at 10 Gbit/s = 1.25e6 / 1.25e6 B/ms = 1 ms, no ramp.
  Link l;
  l.rate_gbps = 10;
  l.rtt_ms = 0;
  const Transfer t = bulk_transfer(1.25e6, l);
  EXPECT_DOUBLE_EQ(t.total_ms, 1.0);
  EXPECT_EQ(t.ramp_rounds, 0);
}

TEST(WanModelTest, LongPathRampGrowsFivefoldToTheBdpInThreeRounds) {
  // 100e6 B over 10 Gbit/s × 50 ms; BDP 62.5e6 B; W0 = 128 × 4096 = 524,288; g = 5:
  //   round 1: 524,288 sent, t = 50, W = 2,621,440
  //   round 2: 3,145,728 sent, t = 100, W = 13,107,200
  //   round 3: 16,252,928 sent, t = 150, W = min(62.5e6, 65,536,000) = BDP
  //   rest 83,747,072 B / 1.25e6 B/ms = 66.9976576 ms; + RTT/2 = 25
  // total = 241.9976576 ms; ideal 80 + 25 = 105; ramp 136.9976576.
  Link l;
  l.rate_gbps = 10;
  l.rtt_ms = 50;
  const Transfer t = bulk_transfer(100e6, l);
  EXPECT_EQ(t.ramp_rounds, 3);
  EXPECT_NEAR(t.total_ms, 241.9976576, 1e-6);
  EXPECT_NEAR(t.ideal_ms, 105, 1e-9);
  EXPECT_NEAR(t.ramp_ms, 136.9976576, 1e-6);
}

TEST(WanModelTest, AWarmQpHasNoRamp) {
  // The same 100e6 B over 10 Gbit/s × 50 ms on a QP whose window is at the BDP already:
  // 100e6 / 1.25e6 = 80 ms + 25 = 105 ms, the ideal.
  Link l;
  l.rate_gbps = 10;
  l.rtt_ms = 50;
  l.warm = true;
  const Transfer t = bulk_transfer(100e6, l);
  EXPECT_EQ(t.ramp_rounds, 0);
  EXPECT_NEAR(t.total_ms, 105, 1e-9);
}

TEST(WanModelTest, AMessageThatEndsInsideTheRampPaysOnlyItsRounds) {
  // 1e6 B over 10 Gbit/s × 50 ms: round 1 sends 524,288 (t = 50), the last 475,712 B fit
  // the next window (2,621,440): 475,712 / 1.25e6 = 0.3805696 ms, + 25 → 75.3805696 ms.
  Link l;
  l.rate_gbps = 10;
  l.rtt_ms = 50;
  EXPECT_NEAR(bulk_transfer(1e6, l).total_ms, 75.3805696, 1e-9);
}

TEST(WanModelTest, ShortPathsDoubleInsteadOfQuadrupling) {
  // 10e6 B over 100 Gbit/s × 0.5 ms (12.5e6 B/ms, BDP 6.25e6), g = 2:
  //   rounds send 524,288 / 1,048,576 / 2,097,152 / 4,194,304 (total 7,864,320) at
  //   t = 0.5, 1.0, 1.5, 2.0, then W = min(6.25e6, 8,388,608) = BDP;
  //   rest 2,135,680 / 12.5e6 = 0.1708544; + 0.25 → 2.4208544 ms.
  Link l;
  l.rate_gbps = 100;
  l.rtt_ms = 0.5;
  const Transfer t = bulk_transfer(10e6, l);
  EXPECT_EQ(t.ramp_rounds, 4);
  EXPECT_NEAR(t.total_ms, 2.4208544, 1e-9);
  EXPECT_DOUBLE_EQ(window_gain(0.5), 2);
  EXPECT_DOUBLE_EQ(window_gain(1.0), 5);
}

TEST(WanModelTest, AnInflightCapLimitsTheRateToCapOverRtt) {
  // 10 MiB over 10 Gbit/s × 10 ms with 2 MiB in flight at most (ccl's 4 × 512 KiB):
  //   round 1: 524,288 sent, t = 10, W = min(2,097,152, 5 × 524,288) = cap;
  //   rest 9,961,472 B at 2,097,152 B / 10 ms = 209,715.2 B/ms → 47.5 ms; + 5 → 62.5 ms.
  Link l;
  l.rate_gbps = 10;
  l.rtt_ms = 10;
  l.inflight_cap_bytes = 2097152;
  EXPECT_NEAR(bulk_transfer(10485760, l).total_ms, 62.5, 1e-9);
}

TEST(WanModelTest, ExpectedLossCostSelectiveAgainstGoBackN) {
  // N = 10,000 packets of 4096 B over 10 Gbit/s × 10 ms, p = 0.1 %:
  //   packet time 4096 / 1.25e6 = 0.0032768 ms; BDP 12.5e6 B → N_w = 12.5e6/4096 + 1
  //   = 3052.7578; tail = (1 − 0.999^3052.76)·RTT/2 + p·(max(2·10, 10) + 10)
  //   = (1 − 0.047155)·5 + 0.03 = 4.7942;
  //   selective: N·p·0.0032768 = 0.032768 → 4.8270 ms;
  //   go-back-N: factor (1 + 3051.7578·0.001)/0.999 = 4.055814; 10,000·0.0032768·3.055814
  //   = 100.1330 → 104.9272 ms.
  Link l;
  l.rate_gbps = 10;
  l.rtt_ms = 10;
  l.loss = 0.001;
  EXPECT_NEAR(loss_recovery_ms(40960000, l), 4.8270, 2e-3);
  l.recovery = Recovery::kGoBackN;
  EXPECT_NEAR(loss_recovery_ms(40960000, l), 104.9272, 2e-3);
  l.loss = 0;
  EXPECT_DOUBLE_EQ(loss_recovery_ms(40960000, l), 0);
}

TEST(WanModelTest, KvBytesPerTokenOfTheStudyModels) {
  // Llama-3-8B 32 × 8 × 128 × 2 × 2 B = 131,072; Llama-3-70B 80 × 8 × 128 × 4 = 327,680;
  // Qwen2.5-7B 28 × 4 × 128 × 4 = 57,344; DeepSeek-V3 61 × 576 × 2 = 70,272;
  // Jamba-v0.1 4 × 8 × 128 × 4 = 16,384 per token + 28 × 8192 × 20 × 2 = 9,175,040 state.
  EXPECT_DOUBLE_EQ(kv_bytes(find_model("llama3-8b"), 1), 131072);
  EXPECT_DOUBLE_EQ(kv_bytes(find_model("llama3-70b"), 1), 327680);
  EXPECT_DOUBLE_EQ(kv_bytes(find_model("qwen2.5-7b"), 1), 57344);
  EXPECT_DOUBLE_EQ(kv_bytes(find_model("deepseek-v3"), 1), 70272);
  EXPECT_DOUBLE_EQ(kv_bytes(find_model("jamba-v0.1"), 1000), 16384000 + 9175040);
  // 8 and 4 bits: a half and a quarter (2,048 tokens of Llama-3-8B: 256 MiB → 128 → 64).
  EXPECT_DOUBLE_EQ(kv_bytes(find_model("llama3-8b"), 2048, 8), 128.0 * 1048576);
  EXPECT_DOUBLE_EQ(kv_bytes(find_model("llama3-8b"), 2048, 4), 64.0 * 1048576);
  EXPECT_THROW(kv_bytes(find_model("llama3-8b"), 1, 3), std::invalid_argument);
  EXPECT_THROW(find_model("gpt-2"), std::invalid_argument);
}

TEST(WanModelTest, SlidingWindowLayersCapTheirCache) {
  // A made-up Gemma-style model: 4 attention layers of 1 KV head × 64 dim (256 B/token each
  // in bf16), 3 of them local with a 1,000-token window. 5,000 tokens:
  //   global 1 × 5000 × 256 + local 3 × 1000 × 256 = 1,280,000 + 768,000 = 2,048,000 B.
  ModelShape m{"toy", 1e9, 1e9, 4, 4, 1, 64, 0, 64, 1000, 3, 0, 1};
  EXPECT_DOUBLE_EQ(kv_bytes(m, 5000), 2048000);
  // FLOPs: 2·1e9·5000 = 1e13; attention 4·64·(1·5000²/2 + 3·(1000²/2 + 4000·1000))
  //   = 256·(12.5e6 + 3·4.5e6) = 256·26e6 = 6.656e9 → 1.0006656e13.
  EXPECT_NEAR(prefill_flops(m, 5000), 1.0006656e13, 1);
}

TEST(WanModelTest, PrefillTimeOfLlama3_8B) {
  // 1,024 tokens: 2 × 8.03e9 × 1024 = 1.644544e13; attention 4 × 4096 × 32 × 1024²/2 =
  // 2.74877907e11; 1.67203179e13 FLOP / (989e12 × 0.4 = 3.956e14) = 42.2657 ms.
  EXPECT_NEAR(prefill_ms(find_model("llama3-8b"), 1024, Gpu{}), 42.2657, 1e-3);
}

TEST(WanModelTest, LayerwiseHandoffHidesWhatComputeOverlaps) {
  // 32 MiB in 32 layers of 5 ms (160 ms prefill), RTT 0.
  // 10 Gbit/s: whole = 33,554,432 / 1.25e6 = 26.8435 ms; layer: link-bound
  //   5 + 26.8435 − 160 < 0, compute-bound = one layer 1 MiB / 1.25e6 = 0.838861 ms.
  Link l;
  l.rate_gbps = 10;
  l.rtt_ms = 0;
  EXPECT_NEAR(kv_handoff(33554432, 32, 5, Layout::kWhole, l).added_ms, 26.8435456, 1e-6);
  EXPECT_NEAR(kv_handoff(33554432, 32, 5, Layout::kLayer, l).added_ms, 0.8388608, 1e-6);
  // 1 Gbit/s: whole = 268.435456 ms; layer: link-bound 5 + 268.435456 − 160 = 113.435456,
  //   compute-bound 8.388608 → 113.435456.
  l.rate_gbps = 1;
  EXPECT_NEAR(kv_handoff(33554432, 32, 5, Layout::kLayer, l).added_ms, 113.435456, 1e-6);
  // Production rate: 33,554,432 B × 8 / 160 ms = 1.6777 Gbit/s.
  EXPECT_NEAR(kv_handoff(33554432, 32, 5, Layout::kLayer, l).produce_gbps, 1.6777216, 1e-6);
}

TEST(WanModelTest, MaxContextAtOneHundredGbitInOneDataCentre) {
  // Llama-3-8B whole cache at 100 Gbit/s, RTT 0: 200 ms × 12.5e6 B/ms = 2.5e9 B =
  // 19,073 tokens of 131,072 B → the largest multiple of 1,024 is 18,432.
  Link l;
  l.rate_gbps = 100;
  l.rtt_ms = 0;
  EXPECT_DOUBLE_EQ(max_context_tokens(find_model("llama3-8b"), 16, Layout::kWhole, l, Gpu{}),
                   18432);
  // At 4 bits four times the tokens fit: 76,293 → 75,776.
  EXPECT_DOUBLE_EQ(max_context_tokens(find_model("llama3-8b"), 4, Layout::kWhole, l, Gpu{}), 75776);
}

TEST(WanModelTest, FlatRingIsThakurAlphaBetaWithTheWideAreaHop) {
  // 2 sites × 2 ranks, 4 MiB, 1 Gbit/s, RTT 10, α = 5 + 0.01 = 5.01:
  //   2·3·5.01 = 30.06; 2·3/4 · 4,194,304 / 125,000 = 50.331648 → 80.391648 ms.
  TrainSetup s;
  s.ranks_per_site = 2;
  s.wan.rate_gbps = 1;
  s.wan.rtt_ms = 10;
  EXPECT_NEAR(ring_allreduce_ms(4194304, s), 80.391648, 1e-6);
  // ccl's rendezvous: the first advert crosses first, + RTT/2 = 5 → 85.391648 ms.
  s.rendezvous = true;
  EXPECT_NEAR(ring_allreduce_ms(4194304, s), 85.391648, 1e-6);
}

TEST(WanModelTest, AStepBeyondTheInflightCapRunsAtCapOverRtt) {
  // 2 sites × 2 ranks, 10 Gbit/s × 10 ms, 2 MiB in flight per peer at most (ccl's default).
  // 4 MiB: a step is 1 MiB ≤ cap → link rate: 30.06 + 1.5 · 4,194,304 / 1.25e6 = 35.0931648.
  // 16 MiB: a step is 4 MiB > cap → 2,097,152 / 10 = 209,715.2 B/ms:
  //   30.06 + 1.5 · 16,777,216 / 209,715.2 = 30.06 + 120 = 150.06 ms.
  TrainSetup s;
  s.ranks_per_site = 2;
  s.wan.rate_gbps = 10;
  s.wan.rtt_ms = 10;
  s.wan.inflight_cap_bytes = 2097152;
  EXPECT_NEAR(ring_allreduce_ms(4194304, s), 35.0931648, 1e-6);
  EXPECT_NEAR(ring_allreduce_ms(16777216, s), 150.06, 1e-6);
}

TEST(WanModelTest, HierarchicalIsChainWideAreaRingChain) {
  // r = 2, S = 2, intra 100 Gbit/s (12.5e6 B/ms), 4 MiB: chain = 0.01 + 0.33554432;
  //   WAN = 2·5.01 + 1 · 4,194,304/125,000 = 43.574432; total 2·0.34554432 + 43.574432
  //   = 44.26552 ms.
  TrainSetup s;
  s.ranks_per_site = 2;
  s.intra_gbps = 100;
  s.wan.rate_gbps = 1;
  s.wan.rtt_ms = 10;
  EXPECT_NEAR(hier_allreduce_ms(4194304, 4194304, s), 44.26552, 1e-6);
}

TEST(WanModelTest, DilocoAndStreamingDiloco) {
  // 1e9 params fp32 (4e9 B), 2 sites × 8 ranks, intra 3200 Gbit/s (4e8 B/ms), compute
  // 100 ms, WAN 100 Gbit/s (1.25e7 B/ms) × 20 ms, H = 100:
  //   inner = 2·7·0.01 + 2·7/8 · 4e9/4e8 = 17.64
  //   outer = 2·(7·0.01 + 4e9/4e8) + 2·10.01 + 4e9/1.25e7 = 20.14 + 340.02 = 360.16
  //   comm = 17.64 + 3.6016 = 21.2416; utilisation 100 / 121.2416 = 0.824799.
  TrainSetup s;
  s.params = 1e9;
  s.compute_ms = 100;
  s.wan.rate_gbps = 100;
  s.wan.rtt_ms = 20;
  s.outer_every = 100;
  Step st = train_step(TrainMode::kDiloco, s);
  EXPECT_NEAR(st.comm_ms, 21.2416, 1e-6);
  EXPECT_NEAR(st.utilisation, 100 / 121.2416, 1e-9);
  EXPECT_NEAR(st.wan_bytes_per_step, 4e7, 1e-3);
  // Streaming, F = 4, τ = 5, 0.5 B/param on the WAN, at 1 Gbit/s (125,000 B/ms):
  //   fragment = 2·(0.07 + 1e9/4e8) + 20.02 + 1.25e8/125,000 = 5.14 + 1020.02 = 1025.16;
  //   hidden = 5 · (100 + 17.64) = 588.2; stall 436.96 × 4/100 = 17.4784;
  //   comm = 17.64 + 17.4784 = 35.1184.
  s.wan.rate_gbps = 1;
  s.outer_bytes_per_param = 0.5;
  st = train_step(TrainMode::kStreamingDiloco, s);
  EXPECT_NEAR(st.comm_ms, 35.1184, 1e-6);
  // At 100 Gbit/s the fragment (5.14 + 30.02 ms) hides entirely: comm = inner = 17.64.
  s.wan.rate_gbps = 100;
  EXPECT_NEAR(train_step(TrainMode::kStreamingDiloco, s).comm_ms, 17.64, 1e-9);
}

TEST(WanModelTest, OverlapWithTheBackwardPassHidesUpToTwoThirdsOfCompute) {
  // The DiLoCo case above with DDP overlap: inner 17.64 ms < 2/3 · 100 → hidden; the outer
  // 360.16 / 100 = 3.6016 stays: utilisation 100 / 103.6016 = 0.965236.
  TrainSetup s;
  s.params = 1e9;
  s.compute_ms = 100;
  s.wan.rate_gbps = 100;
  s.wan.rtt_ms = 20;
  s.overlap_backward = true;
  EXPECT_NEAR(train_step(TrainMode::kDiloco, s).comm_ms, 3.6016, 1e-9);
  // Hierarchical every step: 360.16 − 66.667 = 293.493 ms exposed.
  EXPECT_NEAR(train_step(TrainMode::kHier, s).comm_ms, 360.16 - 200.0 / 3, 1e-9);
}

TEST(WanModelTest, PublishedBandwidthReductions) {
  // DiLoCo: fp32 every 500 steps against fp32 every step → 500×. INTELLECT-1: int8
  // (1 B of 4) every 100 steps → 4 × 100 = 400×.
  TrainSetup s;
  s.params = 10e9;
  s.outer_every = 500;
  const double dp = train_step(TrainMode::kHier, s).wan_bytes_per_step;
  EXPECT_NEAR(dp / train_step(TrainMode::kDiloco, s).wan_bytes_per_step, 500, 1e-9);
  s.outer_every = 100;
  s.outer_bytes_per_param = 1;
  EXPECT_NEAR(dp / train_step(TrainMode::kDiloco, s).wan_bytes_per_step, 400, 1e-9);
  // The compressed hierarchical modes carry a half and a quarter of fp32.
  EXPECT_NEAR(dp / train_step(TrainMode::kHierBf16, s).wan_bytes_per_step, 2, 1e-12);
  EXPECT_NEAR(dp / train_step(TrainMode::kHierInt8, s).wan_bytes_per_step, 4, 1e-12);
}

TEST(WanModelTest, RateForNinetyPercent) {
  // One rank per site, RTT 0, no software latency, compute 100 ms, 1e9 fp32 params:
  // hier = 4e9 B / rate; 90 % needs comm = 100/9 = 11.111 ms → 3.6e8 B/ms = 2,880 Gbit/s.
  TrainSetup s;
  s.params = 1e9;
  s.compute_ms = 100;
  s.ranks_per_site = 1;
  s.alpha_ms = 0;
  s.wan.rtt_ms = 0;
  EXPECT_NEAR(rate_for_utilisation(TrainMode::kHier, s, 0.9), 2880, 1e-6);
  // 16 ranks in a flat ring over 100 ms RTT: 2·15·50 ms of latency alone → never 90 %.
  s.ranks_per_site = 8;
  s.wan.rtt_ms = 100;
  EXPECT_EQ(rate_for_utilisation(TrainMode::kRing, s, 0.9), 0);
}

TEST(WanModelTest, BadInputsAreRefused) {
  Link l;
  l.rate_gbps = 0;
  EXPECT_THROW(bulk_transfer(1, l), std::invalid_argument);
  l.rate_gbps = 1;
  l.loss = 1;
  EXPECT_THROW(loss_recovery_ms(1, l), std::invalid_argument);
  EXPECT_THROW(parse_train_mode("allgather"), std::invalid_argument);
  EXPECT_EQ(parse_train_mode("streaming-diloco"), TrainMode::kStreamingDiloco);
  TrainSetup s;
  s.sites = 0;
  EXPECT_THROW(train_step(TrainMode::kRing, s), std::invalid_argument);
}

}  // namespace
}  // namespace softrdma::wan_model
