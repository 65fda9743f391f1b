// Multi-device engines (issue 10, item 2): a process given several softrdma devices
// (SOFTRDMA_ADDR=A,B lists srdma0 at A and srdma1 at B) stripes its QPs to a peer over them
// — QP i on local device i % n and the peer's device i % m. Each side runs in its own forked
// process with its own addresses (127.0.40.x initiators, 127.0.41.x targets); the gtest
// process opens no device. Checked: 64 MiB WRITE and READ batches over 4 QPs arrive byte for
// byte and every device of both sides carried packets (their published counters grew);
// 2-device and 1-device peers work with each other; a named device that does not exist is
// an error naming it; the device list of the verbs layer itself.
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>

#include "engine/counters.h"
#include "kv/engine.h"
#include "kv/tests/kv_fork_util.h"
#include "kv/tests/kv_test_util.h"

/// Set by a test: ibv_reg_mr on a PD of this device fails with ENOMEM (the kv engine, linked
/// statically into this executable, calls the ibv_reg_mr below; everything else goes on to
/// libibverbs').
static const char* g_fail_reg_mr_on = nullptr;
/// Live MRs (on any device) of exactly kWatchedBytes, the failing test's buffer size.
constexpr size_t kWatchedBytes = 3 << 20;
static int g_watched_mrs = 0;

extern "C" ibv_mr*(ibv_reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) {
  using Fn = ibv_mr* (*)(ibv_pd*, void*, size_t, int);
  static Fn real = reinterpret_cast<Fn>(dlvsym(RTLD_NEXT, "ibv_reg_mr", "IBVERBS_1.1"));
  if (g_fail_reg_mr_on && pd &&
      std::string(ibv_get_device_name(pd->context->device)) == g_fail_reg_mr_on) {
    errno = ENOMEM;
    return nullptr;
  }
  ibv_mr* mr = real(pd, addr, length, access);
  if (mr && length == kWatchedBytes) ++g_watched_mrs;
  return mr;
}

extern "C" int ibv_dereg_mr(ibv_mr* mr) {
  using Fn = int (*)(ibv_mr*);
  static Fn real = reinterpret_cast<Fn>(dlvsym(RTLD_NEXT, "ibv_dereg_mr", "IBVERBS_1.1"));
  if (mr && mr->length == kWatchedBytes) --g_watched_mrs;
  return real(mr);
}

namespace softrdma::kv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::Child;

/// Packets sent plus received by this process's device at `addr` (its published counters).
uint64_t packets(const std::string& addr) {
  engine::DeviceStats st;
  if (!engine::read_device_stats(addr, st, getpid()))
    throw std::runtime_error("no published counters for " + addr);
  return st.get("sent_pkts") + st.get("rcvd_pkts");
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t c; (c = s.find(',', at)) != std::string::npos; at = c + 1)
    out.push_back(s.substr(at, c - at));
  out.push_back(s.substr(at));
  return out;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

/// Moves `size` bytes initiator → target (WRITE, 16 transfers in one batch) and target →
/// initiator (READ, likewise) over `qps` QPs, checks every byte, and (when `min_packets`)
/// that each device of both sides sent or received at least `min_packets` packets meanwhile.
void transfer_between(const std::string& initiator_addrs, const std::string& target_addrs,
                      uint32_t qps, size_t size, uint64_t min_packets) {
  test::TempStore store;
  const size_t kParts = 16;
  auto options = [&] {
    EngineOptions o = test::test_options();
    o.qps_per_peer = qps;
    o.slice_bytes = 256 * 1024;
    o.max_wr = 64;
    return o;
  };
  auto check_devices = [&](const Engine& e, const std::string& addrs,
                           const std::vector<uint64_t>& before) {
    const auto list = split(addrs);
    require(e.devices().size() == list.size(),
            "engine opened " + std::to_string(e.devices().size()) + " devices, expected " +
                std::to_string(list.size()));
    for (size_t i = 0; i < list.size(); ++i) {
      const uint64_t grown = packets(list[i]) - before[i];
      require(grown >= min_packets, "device " + e.devices()[i] + " (" + list[i] + ") carried " +
                                        std::to_string(grown) + " packets, expected at least " +
                                        std::to_string(min_packets));
    }
  };
  auto snapshot = [&](const std::string& addrs) {
    std::vector<uint64_t> v;
    for (const std::string& a : split(addrs)) v.push_back(packets(a));
    return v;
  };
  // The target: `size` bytes written into its first half, its second half (seed 9) read.
  Child target(target_addrs, [&] {
    std::vector<uint8_t> buf(2 * size);
    test::fill(buf.data() + size, size, 9);
    Engine e("target", store.store(), options());
    const auto before = snapshot(target_addrs);
    e.register_memory(buf.data(), buf.size(), "cpu:0", "buf");
    auto n = e.wait_notification(120s);
    require(n && n->message == "done", "no notification 'done' from the initiator");
    if (int64_t at = test::first_mismatch(buf.data(), size, 5); at >= 0)
      throw std::runtime_error("WRITE: byte " + std::to_string(at) + " differs");
    check_devices(e, target_addrs, before);
    e.notify("initiator", "checked");
  });
  Child initiator(initiator_addrs, [&] {
    std::vector<uint8_t> buf(2 * size);
    test::fill(buf.data(), size, 5);
    Engine e("initiator", store.store(), options());
    const auto before = snapshot(initiator_addrs);
    e.register_memory(buf.data(), buf.size());
    SegmentHandle h = 0;
    for (int i = 0; i < 1000 && !h; ++i) {  // the target may not have registered yet
      try {
        h = e.open_segment("target", "buf");
      } catch (const KvError&) {
        std::this_thread::sleep_for(10ms);
      }
    }
    require(h != 0, "target never published 'buf'");
    const size_t part = size / kParts;
    for (Opcode op : {Opcode::kWrite, Opcode::kRead}) {
      std::vector<TransferRequest> reqs;
      for (size_t i = 0; i < kParts; ++i) {
        const size_t off = i * part + (op == Opcode::kRead ? size : 0);
        reqs.push_back({op, buf.data() + off, h, off, part});
      }
      const BatchId b = e.allocate_batch(reqs.size());
      e.submit_transfer(b, reqs);
      const BatchStatus s = e.wait(b, 120s);
      require(s.state == BatchState::kCompleted, "batch: " + s.error);
      e.free_batch(b);
    }
    if (int64_t at = test::first_mismatch(buf.data() + size, size, 9); at >= 0)
      throw std::runtime_error("READ: byte " + std::to_string(at) + " differs");
    check_devices(e, initiator_addrs, before);
    e.notify("target", "done");
    auto n = e.wait_notification(120s);
    require(n && n->message == "checked", "the target did not confirm");
  });
  EXPECT_EQ(0, initiator.wait_for(180s));
  EXPECT_EQ(0, target.wait_for(180s));
}

TEST(Devices, TwoDevicesEachMove64MiBWriteAndReadOver4QpsOnBothDevices) {
  // 32 MiB per device and direction: ≥ 8192 packets at a 4 KiB MTU; 1000 proves use.
  transfer_between("127.0.40.1,127.0.40.2", "127.0.41.1,127.0.41.2", 4, 64 << 20, 1000);
}

TEST(Devices, TwoDeviceInitiatorWithOneDeviceTarget) {
  transfer_between("127.0.40.3,127.0.40.4", "127.0.41.3", 4, 8 << 20, 100);
}

TEST(Devices, OneDeviceInitiatorWithTwoDeviceTarget) {
  transfer_between("127.0.40.5", "127.0.41.5,127.0.41.6", 3, 8 << 20, 100);
}

TEST(Devices, AnUnknownDeviceIsAnErrorNamingIt) {
  Child c("127.0.40.7,127.0.40.8", [] {
    test::TempStore store;
    EngineOptions o = test::test_options();
    o.devices = {"srdma1", "srdma9"};
    try {
      Engine e("x", store.store(), o);
    } catch (const KvError& e) {
      const std::string what = e.what();
      require(what.find("'srdma9'") != std::string::npos, "error does not name srdma9: " + what);
      require(what.find("srdma0, srdma1") != std::string::npos,
              "error does not list the devices: " + what);
      return;
    }
    throw std::runtime_error("an engine opened a device named srdma9");
  });
  EXPECT_EQ(0, c.wait_for(60s));
}

TEST(Devices, ARegistrationThatFailsOnOneDeviceLeavesNothingAndNamesIt) {
  Child c("127.0.40.13,127.0.40.14", [] {
    test::TempStore store;
    Engine e("x", store.store(), test::test_options());
    require(e.devices().size() == 2, "two devices");
    std::vector<uint8_t> buf(kWatchedBytes);
    g_fail_reg_mr_on = "srdma1";
    try {
      e.register_memory(buf.data(), buf.size(), "cpu:0", "buf");
      throw std::runtime_error("registered although srdma1 refused");
    } catch (const KvError& err) {
      const std::string what = err.what();
      require(what.find("srdma1") != std::string::npos, "error does not name srdma1: " + what);
    }
    g_fail_reg_mr_on = nullptr;
    require(e.segments().empty(), "a segment is left after the failure");
    require(g_watched_mrs == 0,
            "srdma0's MR was not deregistered (" + std::to_string(g_watched_mrs) + " live)");
    // The same range then registers afresh on both devices, and goes with one deregister.
    const Segment s = e.register_memory(buf.data(), buf.size(), "cpu:0", "buf");
    require(s.name == "buf" && e.segments().size() == 1 && g_watched_mrs == 2,
            "registration after the failure");
    e.deregister_memory("buf");
    require(e.segments().empty() && g_watched_mrs == 0, "one reference only");
  });
  EXPECT_EQ(0, c.wait_for(60s));
}

TEST(Devices, EnvironmentListsDevicesAndRejectsAnEmptyName) {
  Child c("127.0.40.9", [] {
    setenv("SOFTRDMA_KV_IB_DEVICE", "srdma0,srdma1", 1);
    const EngineOptions o = EngineOptions::from_environment();
    require(o.devices == std::vector<std::string>{"srdma0", "srdma1"}, "list not read");
    for (const char* bad : {"srdma0,", ",srdma0", "srdma0,,srdma1"}) {
      setenv("SOFTRDMA_KV_IB_DEVICE", bad, 1);
      try {
        EngineOptions::from_environment();
      } catch (const std::invalid_argument&) {
        continue;
      }
      throw std::runtime_error(std::string("accepted '") + bad + "'");
    }
  });
  EXPECT_EQ(0, c.wait_for(60s));
}

TEST(Devices, VerbsListsOneDevicePerAddress) {
  Child c("127.0.40.10,127.0.40.11", [] {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    require(list && n == 2, "expected 2 devices, got " + std::to_string(n));
    require(std::string(ibv_get_device_name(list[0])) == "srdma0" &&
                std::string(ibv_get_device_name(list[1])) == "srdma1" &&
                std::string(list[1]->dev_name) == "uverbs1" && ibv_get_device_index(list[1]) == 1,
            "names");
    ibv_context* c0 = ibv_open_device(list[0]);
    ibv_context* c1 = ibv_open_device(list[1]);
    require(c0 && c1, "open");
    require(c1->device == list[1], "the context's device");
    ibv_gid g0{}, g1{};
    require(ibv_query_gid(c0, 1, 0, &g0) == 0 && ibv_query_gid(c1, 1, 0, &g1) == 0, "gid");
    require(g0.raw[15] == 10 && g1.raw[15] == 11, "each device is at its own address");
    ibv_close_device(c1);
    ibv_close_device(c0);
    ibv_free_device_list(list);
    // A malformed entry: opening fails as a malformed single address does.
    setenv("SOFTRDMA_ADDR", "127.0.40.12,bogus", 1);
    list = ibv_get_device_list(&n);
    require(n == 2, "a malformed list still names 2 devices");
    errno = 0;
    require(ibv_open_device(list[1]) == nullptr && errno == EINVAL, "malformed entry opened");
    require(ibv_open_device(list[0]) == nullptr && errno == EINVAL, "malformed list opened");
    ibv_free_device_list(list);
  });
  EXPECT_EQ(0, c.wait_for(60s));
}

}  // namespace
}  // namespace softrdma::kv
