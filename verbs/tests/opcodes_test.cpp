// Every RC opcode between two processes over loopback, data verified byte for byte:
// SEND, SEND with immediate, RDMA WRITE, WRITE with immediate, RDMA READ, COMPARE & SWAP,
// FETCH & ADD; SGE lists on both sides; inline sends; unsignaled sends; PSN wrap-around;
// a receive too small for the message.
#include <arpa/inet.h>

#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr uint64_t kSeed = 0x5eed;

// run_pair whose role 0 first fills its first `len` bytes with pattern kSeed, then waits
// at a barrier until role 1 has posted its receives or prepared its memory (role 1 calls
// r.barrier() when it has), then runs `send` with its link.
void run_pair_from_pattern(uint32_t len, std::function<void(Role&, Link&)> send,
                           std::function<void(Role&)> target) {
  run_pair(
      ConnOptions{},
      [len, send](Role& r) {
        fill_pattern(r.buf(), len, kSeed);
        r.barrier();
        send(r, r.link());
      },
      std::move(target));
}

TEST(Opcodes, Send) {
  static constexpr uint32_t kLen = 3000;  // three packets at MTU 1024
  run_pair_from_pattern(
      kLen,
      [](Role& r, Link& l) {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 7, r.buf(), kLen, r.lkey()));
        EXPECT_EQ(l.ep.qpn, poll_success(l.ep.scq, 7, IBV_WC_SEND).qp_num);
        EXPECT_TRUE(no_completion(l.ep.scq, 20ms));
      },
      [](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 8192);
        ASSERT_EQ(0, post_recv(l.ep.qp, 42, r.buf() + 100, 4096, r.lkey()));
        r.barrier();
        const ibv_wc wc = poll_success(l.ep.rcq, 42, IBV_WC_RECV);
        EXPECT_EQ(kLen, wc.byte_len);
        EXPECT_EQ(0u, wc.wc_flags & IBV_WC_WITH_IMM);
        EXPECT_EQ(l.ep.qpn, wc.qp_num);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 8192, 100, kLen, kSeed));
        EXPECT_TRUE(no_completion(l.ep.rcq, 20ms));
      });
}

// imm_data travels as an opaque 32-bit value: the receiver sees exactly what was posted
// (both are network order by convention), including on a zero-length message.
TEST(Opcodes, SendWithImmediate) {
  static constexpr uint32_t kLen = 500;
  run_pair_from_pattern(
      kLen,
      [](Role& r, Link& l) {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND_WITH_IMM, 1, r.buf(), kLen, r.lkey(), 0, 0,
                               htonl(0xdeadbeef)));
        ASSERT_EQ(
            0, post_send(l.ep.qp, IBV_WR_SEND_WITH_IMM, 2, nullptr, 0, 0, 0, 0, htonl(0x01020304)));
        for (uint64_t id : {1u, 2u}) poll_success(l.ep.scq, id, IBV_WC_SEND);
      },
      [](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 8192);
        ASSERT_EQ(0, post_recv(l.ep.qp, 10, r.buf(), 1024, r.lkey()));
        ASSERT_EQ(0, post_recv(l.ep.qp, 11, r.buf() + 4096, 1024, r.lkey()));
        r.barrier();
        ibv_wc wc = poll_success(l.ep.rcq, 10, IBV_WC_RECV);
        EXPECT_TRUE(CarriesImm(wc, htonl(0xdeadbeef)));
        EXPECT_EQ(kLen, wc.byte_len);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 4096, 0, kLen, kSeed));

        wc = poll_success(l.ep.rcq, 11, IBV_WC_RECV);
        EXPECT_TRUE(CarriesImm(wc, htonl(0x01020304)));
        EXPECT_EQ(0u, wc.byte_len);
        EXPECT_TRUE(AllBytesAre(r.buf() + 4096, 4096, kGuard));
      });
}

// A WRITE places data without the target's involvement and consumes no receive: the
// receive posted before it is still there for the SEND that follows.
TEST(Opcodes, RdmaWrite) {
  static constexpr uint32_t kLen = 5000;
  static constexpr uint32_t kOff = 77;
  run_pair_from_pattern(
      kLen,
      [](Role& r, Link& l) {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 3, r.buf(), kLen, r.lkey(),
                               l.remote.addr + kOff, l.remote.rkey));
        poll_success(l.ep.scq, 3, IBV_WC_RDMA_WRITE);
        r.send_value(1, uint32_t{1});
        r.barrier();  // the target has checked that the WRITE consumed no receive
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 4, r.buf(), 16, r.lkey()));
        EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.scq).status);
      },
      [](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 65536);
        ASSERT_EQ(0, post_recv(l.ep.qp, 99, r.buf() + 32768, 64, r.lkey()));
        r.barrier();
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 32768, kOff, kLen, kSeed));
        EXPECT_TRUE(no_completion(l.ep.rcq, 50ms)) << "a WRITE must not consume a receive";
        r.barrier();
        EXPECT_EQ(16u, poll_success(l.ep.rcq, 99, IBV_WC_RECV).byte_len);
        EXPECT_TRUE(HasPattern(r.buf() + 32768, 16, kSeed));
      });
}

// WRITE with immediate consumes a receive, whose buffer stays untouched; the completion is
// IBV_WC_RECV_RDMA_WITH_IMM with the immediate and byte_len = bytes written (rxe and mlx5
// report the RDMA length; ibv_poll_cq(3): "byte_len: number of bytes transferred").
TEST(Opcodes, RdmaWriteWithImmediate) {
  static constexpr uint32_t kLen = 3000;
  static constexpr uint32_t kOff = 5;
  run_pair_from_pattern(
      kLen,
      [](Role& r, Link& l) {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 5, r.buf(), kLen, r.lkey(),
                               l.remote.addr + kOff, l.remote.rkey, htonl(0xcafef00d)));
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 6, nullptr, 0, 0,
                               l.remote.addr + 20000, l.remote.rkey, htonl(7)));
        for (uint64_t id : {5u, 6u}) poll_success(l.ep.scq, id, IBV_WC_RDMA_WRITE);
      },
      [](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 65536);
        ASSERT_EQ(0, post_recv(l.ep.qp, 50, r.buf() + 40000, 4096, r.lkey()));
        ASSERT_EQ(0, post_recv(l.ep.qp, 51, nullptr, 0, 0));  // a receive without SGEs
        r.barrier();
        ibv_wc wc = poll_success(l.ep.rcq, 50, IBV_WC_RECV_RDMA_WITH_IMM);
        EXPECT_TRUE(CarriesImm(wc, htonl(0xcafef00d)));
        EXPECT_EQ(kLen, wc.byte_len);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 65536, kOff, kLen, kSeed))
            << "the receive buffer of a WRITE with immediate must stay untouched";

        wc = poll_success(l.ep.rcq, 51, IBV_WC_RECV_RDMA_WITH_IMM);
        EXPECT_TRUE(CarriesImm(wc, htonl(7)));
        EXPECT_EQ(0u, wc.byte_len);
      });
}

TEST(Opcodes, RdmaRead) {
  static constexpr uint32_t kLen = 7000;
  static constexpr uint32_t kRemoteOff = 11;
  static constexpr uint32_t kLocalOff = 3;
  run_pair(
      ConnOptions{},
      [](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 16384);
        r.barrier();  // the target has filled its buffer
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, 8, r.buf() + kLocalOff, kLen, r.lkey(),
                               l.remote.addr + kRemoteOff, l.remote.rkey));
        EXPECT_EQ(kLen, poll_success(l.ep.scq, 8, IBV_WC_RDMA_READ).byte_len);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 16384, kLocalOff, kLen, kSeed, kRemoteOff));
      },
      [](Role& r) {
        fill_pattern(r.buf(), 16384, kSeed);
        r.barrier();
      });
}

constexpr uint32_t kAtomicOff = 64;  // 8-byte aligned target word

// Posts one atomic WR whose 8-byte result lands in res[id] (poisoned first) and checks
// that it completes as `wc_opcode` with byte_len 8.
void atomic_and_poll(Role& r, ibv_wr_opcode op, ibv_wc_opcode wc_opcode, uint64_t id, uint64_t* res,
                     uint64_t raddr, uint64_t compare_add, uint64_t swap = 0) {
  auto& l = r.link();
  res[id] = 0x5555;
  SendWr w(op, id);
  w.add_sge(&res[id], 8, r.lkey()).atomic(raddr, l.remote.rkey, compare_add, swap);
  ASSERT_EQ(0, w.post(l.ep.qp));
  EXPECT_EQ(8u, poll_success(l.ep.scq, id, wc_opcode).byte_len);
}

// COMPARE & SWAP returns the original value whether or not it swapped.
TEST(Opcodes, CompareAndSwap) {
  static constexpr uint64_t kInit = 0x1111222233334444ull;
  static constexpr uint64_t kA = 0xaaaaaaaaaaaaaaaaull;
  run_pair(
      ConnOptions{},
      [](Role& r) {
        auto* res = reinterpret_cast<uint64_t*>(r.buf());
        r.barrier();
        auto cas = [&](uint64_t id, uint64_t compare, uint64_t swap) {
          atomic_and_poll(r, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WC_COMP_SWAP, id, res,
                          r.link().remote.addr + kAtomicOff, compare, swap);
        };
        cas(1, kInit, kA);  // matches: swaps
        EXPECT_EQ(kInit, res[1]);
        cas(2, kInit, 0xbbbb);  // stale compare: no swap, returns the current value
        EXPECT_EQ(kA, res[2]);
        cas(3, kA, 42);  // matches again
        EXPECT_EQ(kA, res[3]);
        r.send_value(1, uint32_t{1});
      },
      [](Role& r) {
        auto* w = reinterpret_cast<uint64_t*>(r.buf() + kAtomicOff);
        memset(r.buf(), kGuard, 4096);
        *w = kInit;
        r.barrier();
        r.recv_value<uint32_t>(0);
        EXPECT_EQ(42u, __atomic_load_n(w, __ATOMIC_ACQUIRE));
        EXPECT_TRUE(AllBytesAre(r.buf(), kAtomicOff, kGuard));
        EXPECT_TRUE(AllBytesAre(r.buf() + kAtomicOff + 8, 4096 - kAtomicOff - 8, kGuard));
      });
}

// FETCH & ADD returns the original value; the add wraps modulo 2^64.
TEST(Opcodes, FetchAndAdd) {
  run_pair(
      ConnOptions{},
      [](Role& r) {
        auto* res = reinterpret_cast<uint64_t*>(r.buf());
        r.barrier();
        auto faa = [&](uint64_t id, uint32_t off, uint64_t add) {
          atomic_and_poll(r, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WC_FETCH_ADD, id, res,
                          r.link().remote.addr + off, add);
        };
        faa(1, kAtomicOff, 5);
        EXPECT_EQ(1000u, res[1]);
        faa(2, kAtomicOff, UINT64_MAX);  // -1
        EXPECT_EQ(1005u, res[2]);
        faa(3, kAtomicOff + 8, 3);
        EXPECT_EQ(UINT64_MAX - 1, res[3]);
        r.send_value(1, uint32_t{1});
      },
      [](Role& r) {
        auto* w = reinterpret_cast<uint64_t*>(r.buf() + kAtomicOff);
        memset(r.buf(), kGuard, 4096);
        w[0] = 1000;
        w[1] = UINT64_MAX - 1;
        r.barrier();
        r.recv_value<uint32_t>(0);
        EXPECT_EQ(1004u, __atomic_load_n(&w[0], __ATOMIC_ACQUIRE));
        EXPECT_EQ(1u, __atomic_load_n(&w[1], __ATOMIC_ACQUIRE));
        EXPECT_TRUE(AllBytesAre(r.buf(), kAtomicOff, kGuard));
        EXPECT_TRUE(AllBytesAre(r.buf() + kAtomicOff + 16, 4096 - kAtomicOff - 16, kGuard));
      });
}

struct Piece {
  uint32_t off;
  uint32_t len;
};

std::vector<uint8_t> gather(const uint8_t* base, const std::vector<Piece>& ps) {
  std::vector<uint8_t> s;
  for (const auto& p : ps) s.insert(s.end(), base + p.off, base + p.off + p.len);
  return s;
}

// The image of a `size`-byte region filled with kGuard after scattering `stream` over `ps`.
std::vector<uint8_t> scatter_image(size_t size, const std::vector<Piece>& ps,
                                   const std::vector<uint8_t>& stream) {
  std::vector<uint8_t> img(size, kGuard);
  size_t at = 0;
  for (const auto& p : ps) {
    const size_t n = std::min<size_t>(p.len, stream.size() - at);
    std::copy(stream.begin() + at, stream.begin() + at + n, img.begin() + p.off);
    at += n;
  }
  return img;
}

// Gather on the send side and scatter on the receive side with SGE boundaries that fall
// inside packets (MTU 1024); WRITE gathers, READ scatters; then the maximum SGE count.
TEST(Opcodes, SgeLists) {
  static const std::vector<Piece> kSend = {
      {5, 1}, {1000, 100}, {9000, 3000}, {20001, 17}, {30000, 1500}};  // 4618 bytes
  static const std::vector<Piece> kRecv = {
      {100, 50}, {5000, 2000}, {12000, 1000}, {20000, 4000}};  // room for 7050
  static const std::vector<Piece> kMaxSend = {{0, 7},    {100, 300}, {1000, 1},  {2000, 1024},
                                              {4000, 2}, {5000, 99}, {6000, 13}, {7000, 600}};
  static const std::vector<Piece> kMaxRecv = {{50, 3},    {200, 500},  {1000, 1},   {3000, 700},
                                              {5000, 64}, {6000, 512}, {7000, 128}, {8000, 1000}};
  static constexpr size_t kRegion = 32768;
  static constexpr uint64_t kWriteOff = 40000;
  auto sge_list = [](uint8_t* base, const std::vector<Piece>& ps, uint32_t lkey) {
    std::vector<ibv_sge> v;
    for (const auto& p : ps)
      v.push_back(ibv_sge{reinterpret_cast<uintptr_t>(base + p.off), p.len, lkey});
    return v;
  };
  run_pair(
      ConnOptions{},
      [&](Role& r) {
        auto& l = r.link();
        ASSERT_GE(l.ep.cap.max_send_sge, 8u);
        fill_pattern(r.buf(), kRegion, kSeed);
        r.barrier();
        SendWr s(IBV_WR_SEND, 1);
        for (const auto& p : kSend) s.add_sge(r.buf() + p.off, p.len, r.lkey());
        ASSERT_EQ(0, s.post(l.ep.qp));
        EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.scq).status);

        SendWr w(IBV_WR_RDMA_WRITE, 2);
        for (const auto& p : kSend) w.add_sge(r.buf() + p.off, p.len, r.lkey());
        w.remote(l.remote.addr + kWriteOff, l.remote.rkey);
        ASSERT_EQ(0, w.post(l.ep.qp));
        EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.scq).status);

        // READ back what was written, scattered over kRecv in a fresh local region.
        uint8_t* dst = r.buf() + 65536;
        memset(dst, kGuard, kRegion);
        const uint32_t total = static_cast<uint32_t>(gather(r.buf(), kSend).size());
        SendWr rd(IBV_WR_RDMA_READ, 3);
        uint32_t left = total;
        for (const auto& p : kRecv) {
          const uint32_t n = std::min(p.len, left);
          if (n == 0) break;
          rd.add_sge(dst + p.off, n, r.lkey());
          left -= n;
        }
        rd.remote(l.remote.addr + kWriteOff, l.remote.rkey);
        ASSERT_EQ(0, rd.post(l.ep.qp));
        const ibv_wc wc = poll_one(l.ep.scq);
        ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
        EXPECT_EQ(total, wc.byte_len);
        const auto img = scatter_image(kRegion, kRecv, gather(r.buf(), kSend));
        EXPECT_TRUE(SameBytes(img.data(), dst, kRegion));

        SendWr m(IBV_WR_SEND, 4);
        for (const auto& p : kMaxSend) m.add_sge(r.buf() + p.off, p.len, r.lkey());
        ASSERT_EQ(0, m.post(l.ep.qp));
        EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.scq).status);
        r.send_value(1, uint32_t{1});
      },
      [&](Role& r) {
        auto& l = r.link();
        ASSERT_GE(l.ep.cap.max_recv_sge, 8u);
        memset(r.buf(), kGuard, 131072);
        uint8_t* second = r.buf() + 65536 + 32768;
        ASSERT_EQ(0, post_recv_sges(l.ep.qp, 10, sge_list(r.buf(), kRecv, r.lkey())));
        ASSERT_EQ(0, post_recv_sges(l.ep.qp, 11, sge_list(second, kMaxRecv, r.lkey())));
        r.barrier();
        // The sender's buffer holds pattern kSeed over kRegion bytes: rebuild its streams.
        std::vector<uint8_t> src(kRegion);
        fill_pattern(src.data(), kRegion, kSeed);

        ibv_wc wc = poll_success(l.ep.rcq, 10, IBV_WC_RECV);
        const auto stream = gather(src.data(), kSend);
        EXPECT_EQ(stream.size(), wc.byte_len);
        auto img = scatter_image(kRegion, kRecv, stream);
        EXPECT_TRUE(SameBytes(img.data(), r.buf(), kRegion));

        r.recv_value<uint32_t>(0);  // WRITE, READ and the max-SGE SEND are done
        EXPECT_TRUE(SameBytes(stream.data(), r.buf() + kWriteOff, stream.size()));
        EXPECT_TRUE(AllBytesAre(r.buf() + kWriteOff + stream.size(), 1000, kGuard));

        wc = poll_success(l.ep.rcq, 11, IBV_WC_RECV);
        const auto stream2 = gather(src.data(), kMaxSend);
        EXPECT_EQ(stream2.size(), wc.byte_len);
        img = scatter_image(kRegion, kMaxRecv, stream2);
        EXPECT_TRUE(SameBytes(img.data(), second, kRegion));
      },
      256 << 10);
}

// IBV_SEND_INLINE copies the data at post time: the source (unregistered stack memory,
// lkey ignored) is overwritten right after each post and the receiver still sees the
// original bytes.
TEST(Opcodes, InlineSends) {
  static constexpr int kCount = 50;
  static constexpr uint32_t kInline = 256;
  ConnOptions o;
  o.max_inline_data = kInline;
  auto len_of = [](int i) { return static_cast<uint32_t>(1 + i * 5); };  // 1 … 246
  run_pair(
      o,
      [&](Role& r) {
        auto& l = r.link();
        ASSERT_GE(l.ep.cap.max_inline_data, kInline);
        r.barrier();
        uint8_t src[kInline];
        for (int i = 0; i < kCount; ++i) {
          fill_pattern(src, len_of(i), 1000 + i);
          ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, i, src, len_of(i), /*lkey=*/0, 0, 0, 0,
                                 IBV_SEND_SIGNALED | IBV_SEND_INLINE));
          memset(src, 0, sizeof src);
        }
        // Two SGEs, inline.
        uint8_t a[60], b[70];
        fill_pattern(a, 60, 7, 0);
        fill_pattern(b, 70, 7, 60);
        SendWr two(IBV_WR_SEND_WITH_IMM, 100, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
        two.add_sge(a, 60, 0).add_sge(b, 70, 0).imm(htonl(100));
        ASSERT_EQ(0, two.post(l.ep.qp));
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        // An inline WRITE.
        fill_pattern(src, 200, 8);
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 101, src, 200, 0, l.remote.addr + 100000,
                               l.remote.rkey, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE));
        memset(src, 0, sizeof src);
        const auto wcs = poll_n(l.ep.scq, kCount + 2);
        for (int i = 0; i < kCount + 2; ++i) {
          EXPECT_EQ(IBV_WC_SUCCESS, wcs[i].status) << describe(wcs[i]);
          EXPECT_EQ(i < kCount ? uint64_t(i) : uint64_t(100 + i - kCount), wcs[i].wr_id);
        }
        r.send_value(1, uint32_t{1});
      },
      [&](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 200000);
        for (int i = 0; i <= kCount; ++i)
          ASSERT_EQ(0, post_recv(l.ep.qp, i, r.buf() + i * 512, 512, r.lkey()));
        r.barrier();
        for (int i = 0; i < kCount; ++i) {
          const ibv_wc wc = poll_success(l.ep.rcq, i, IBV_WC_RECV);
          EXPECT_EQ(len_of(i), wc.byte_len);
          EXPECT_TRUE(HasPattern(r.buf() + i * 512, len_of(i), 1000 + i)) << "message " << i;
        }
        const ibv_wc wc = poll_success(l.ep.rcq, kCount, IBV_WC_RECV);
        EXPECT_EQ(130u, wc.byte_len);
        EXPECT_TRUE(CarriesImm(wc, htonl(100)));
        EXPECT_TRUE(HasPattern(r.buf() + kCount * 512, 130, 7));
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(HasPattern(r.buf() + 100000, 200, 8));
        EXPECT_TRUE(AllBytesAre(r.buf() + 100200, 100, kGuard));
      });
}

// Unsignaled WRs produce no completion; the signaled one after them does; all messages
// arrive in order.
TEST(Opcodes, UnsignaledSends) {
  static constexpr int kCount = 11;
  run_pair(
      ConnOptions{},
      [&](Role& r) {
        auto& l = r.link();
        for (int i = 0; i < kCount; ++i) fill_pattern(r.buf() + i * 64, 64, 300 + i);
        r.barrier();
        for (int i = 0; i < kCount; ++i) {
          const unsigned flags = i == kCount - 1 ? IBV_SEND_SIGNALED : 0;
          ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 100 + i, r.buf() + i * 64, 64, r.lkey(), 0,
                                 0, 0, flags));
        }
        poll_success(l.ep.scq, 100 + kCount - 1, IBV_WC_SEND);
        EXPECT_TRUE(no_completion(l.ep.scq, 50ms));
      },
      [&](Role& r) {
        auto& l = r.link();
        for (int i = 0; i < kCount; ++i)
          ASSERT_EQ(0, post_recv(l.ep.qp, i, r.buf() + i * 128, 128, r.lkey()));
        r.barrier();
        for (int i = 0; i < kCount; ++i) {
          EXPECT_EQ(64u, poll_success(l.ep.rcq, i, IBV_WC_RECV).byte_len);
          EXPECT_TRUE(HasPattern(r.buf() + i * 128, 64, 300 + i));
        }
      });
}

// Both directions start 16 PSNs before the 24-bit wrap; multi-packet SENDs, WRITEs, READs
// and atomics cross it.
TEST(Opcodes, PsnWrapAround) {
  ConnOptions o;
  o.psn = 0xfffff0;
  o.path_mtu = IBV_MTU_256;
  static constexpr int kMsgs = 12;
  static constexpr uint32_t kLen = 1000;  // 4 packets at MTU 256
  run_pair(
      o,
      [&](Role& r) {
        auto& l = r.link();
        for (int i = 0; i < kMsgs; ++i) fill_pattern(r.buf() + i * 1024, kLen, 500 + i);
        r.barrier();
        for (int i = 0; i < kMsgs; ++i)
          ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, i, r.buf() + i * 1024, kLen, r.lkey()));
        for (int i = 0; i < kMsgs; ++i)
          ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 100 + i, r.buf() + i * 1024, kLen,
                                 r.lkey(), l.remote.addr + 65536 + i * 1024, l.remote.rkey));
        uint8_t* rd = r.buf() + 131072;
        for (int i = 0; i < kMsgs; ++i)
          ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, 200 + i, rd + i * 1024, kLen, r.lkey(),
                                 l.remote.addr + 262144 + i * 1024, l.remote.rkey));
        auto* res = reinterpret_cast<uint64_t*>(r.buf() + 200000);
        for (int i = 0; i < kMsgs; ++i) {
          SendWr w(IBV_WR_ATOMIC_FETCH_AND_ADD, 300 + i);
          w.add_sge(&res[i], 8, r.lkey()).atomic(l.remote.addr + 300000, l.remote.rkey, 1);
          ASSERT_EQ(0, w.post(l.ep.qp));
        }
        const auto wcs = poll_n(l.ep.scq, 4 * kMsgs);
        for (int i = 0; i < 4 * kMsgs; ++i) {
          EXPECT_EQ(IBV_WC_SUCCESS, wcs[i].status) << describe(wcs[i]);
          EXPECT_EQ(uint64_t(100 * (i / kMsgs) + i % kMsgs), wcs[i].wr_id);
        }
        for (int i = 0; i < kMsgs; ++i) {
          EXPECT_TRUE(HasPattern(rd + i * 1024, kLen, 700 + i)) << "READ " << i;
          EXPECT_EQ(uint64_t(i), res[i]) << "FETCH & ADD " << i;
        }
        r.send_value(1, uint32_t{1});
      },
      [&](Role& r) {
        auto& l = r.link();
        for (int i = 0; i < kMsgs; ++i) fill_pattern(r.buf() + 262144 + i * 1024, kLen, 700 + i);
        for (int i = 0; i < kMsgs; ++i)
          ASSERT_EQ(0, post_recv(l.ep.qp, i, r.buf() + i * 1024, 1024, r.lkey()));
        r.barrier();
        for (int i = 0; i < kMsgs; ++i) {
          EXPECT_EQ(kLen, poll_success(l.ep.rcq, i, IBV_WC_RECV).byte_len);
          EXPECT_TRUE(HasPattern(r.buf() + i * 1024, kLen, 500 + i)) << "SEND " << i;
        }
        r.recv_value<uint32_t>(0);
        for (int i = 0; i < kMsgs; ++i)
          EXPECT_TRUE(HasPattern(r.buf() + 65536 + i * 1024, kLen, 500 + i)) << "WRITE " << i;
        EXPECT_EQ(uint64_t(kMsgs), *reinterpret_cast<uint64_t*>(r.buf() + 300000));
      });
}

// A receive of exactly the message size works; one byte short is a local length error at
// the receiver and an invalid-request NAK (IBV_WC_REM_INV_REQ_ERR) at the sender (IBTA
// 9.7.5.2.2 / rxe).
TEST(Opcodes, ReceiveTooSmall) {
  run_pair_from_pattern(
      200,
      [](Role& r, Link& l) {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 1, r.buf(), 100, r.lkey()));
        poll_success(l.ep.scq, 1, IBV_WC_SEND);
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 2, r.buf(), 101, r.lkey()));
        const ibv_wc wc = poll_one(l.ep.scq);
        EXPECT_EQ(2u, wc.wr_id);
        EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, wc.status) << describe(wc);
      },
      [](Role& r) {
        auto& l = r.link();
        memset(r.buf(), kGuard, 4096);
        ASSERT_EQ(0, post_recv(l.ep.qp, 1, r.buf(), 100, r.lkey()));
        ASSERT_EQ(0, post_recv(l.ep.qp, 2, r.buf() + 1024, 100, r.lkey()));
        r.barrier();
        EXPECT_EQ(100u, poll_success(l.ep.rcq, 1, IBV_WC_RECV).byte_len);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), 1024, 0, 100, kSeed));
        const ibv_wc wc = poll_one(l.ep.rcq);
        EXPECT_EQ(2u, wc.wr_id);
        EXPECT_EQ(IBV_WC_LOC_LEN_ERR, wc.status) << describe(wc);
        EXPECT_TRUE(AllBytesAre(r.buf() + 1124, 4096 - 1124, kGuard)) << "nothing past the SGE";
      });
}

}  // namespace
}  // namespace softrdma::verbs_test
