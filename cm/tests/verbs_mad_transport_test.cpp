// QP1 over a real softrdma device (two devices of one process, SOFTRDMA_ADDR=A,B): a burst of
// MADs bigger than the old 64-WQE receive queue reaches a QP1 nobody polls meanwhile whole.
// UD has no flow control, so a MAD that finds no receive WQE is dropped; Debian's dtestcm
// (100 connection requests at once) lost 40 REQs and RTUs that way, each a 4.3 s resend —
// and one lost RTU let dtestcm's server take a DISCONNECTED for an ESTABLISHED and fail.
#include <infiniband/verbs.h>

#include <array>
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "cm/address.h"
#include "cm/verbs_mad_transport.h"

namespace softrdma::cm {
namespace {

using Clock = std::chrono::steady_clock;

struct Devices {
  ibv_device** list = nullptr;
  ibv_context* ctx[2] = {nullptr, nullptr};
  ~Devices() {
    for (ibv_context* c : ctx)
      if (c) ibv_close_device(c);
    if (list) ibv_free_device_list(list);
  }
};

/// The device's IPv4 address (host order), from GID index 0.
uint32_t device_ip(ibv_context* ctx) {
  ibv_gid gid{};
  if (ibv_query_gid(ctx, 1, 0, &gid) != 0) return 0;
  return gid_ipv4(gid.raw);
}

TEST(VerbsMadTransport, ABurstOf400MadsReachesAnUnpolledQp1Whole) {
  Devices d;
  int n = 0;
  d.list = ibv_get_device_list(&n);
  ASSERT_GE(n, 2) << "run with SOFTRDMA_ADDR=A,B (two devices)";
  for (int i = 0; i < 2; ++i) ASSERT_NE(nullptr, d.ctx[i] = ibv_open_device(d.list[i]));
  std::string error;
  int err = 0;
  auto a = VerbsMadTransport::create(d.ctx[0], error, err);
  ASSERT_TRUE(a) << error;
  auto b = VerbsMadTransport::create(d.ctx[1], error, err);
  ASSERT_TRUE(b) << error;
  const uint32_t to = device_ip(d.ctx[1]);
  ASSERT_NE(0u, to);

  constexpr size_t kBurst = 400;  // over the old 64, under Linux's 512
  static_assert(kBurst < VerbsMadTransport::kRecvSlots);
  std::array<uint8_t, kMadBytes> mad{};
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (size_t i = 0; i < kBurst; ++i) {
    mad[0] = uint8_t(i);
    mad[1] = uint8_t(i >> 8);
    // Only the sender's own slots pace it: b is never polled while the burst arrives.
    while (a->sends_in_flight() == VerbsMadTransport::kSendSlots && Clock::now() < deadline) {
      a->poll(nullptr);
      std::this_thread::yield();
    }
    a->send(MadAddress{to, kGsiQpn}, mad);
  }
  EXPECT_EQ(0u, a->send_drops());

  size_t got = 0;
  std::array<bool, kBurst> seen{};
  while (got < kBurst && Clock::now() < deadline) {
    b->poll([&](std::span<const uint8_t> m, const MadAddress&) {
      const size_t i = size_t(m[0]) | size_t(m[1]) << 8;
      if (i < kBurst && !seen[i]) {
        seen[i] = true;
        ++got;
      }
    });
    if (got < kBurst) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(kBurst, got) << "MADs lost at the receiver (no receive WQE posted)";
  EXPECT_EQ(0u, b->recv_drops());
}

}  // namespace
}  // namespace softrdma::cm
