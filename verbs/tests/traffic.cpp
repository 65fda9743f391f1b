#include "verbs/tests/traffic.h"

#include <arpa/inet.h>

#include <cstring>

namespace softrdma::verbs_test {

void run_window(ibv_cq* scq, const char* what, int count, int window, milliseconds timeout,
                const std::function<void(int)>& post, const std::function<void(int)>& check,
                const std::function<std::string()>& context) {
  auto ctx = [&] { return context ? context() : std::string(); };
  int posted = 0, done = 0;
  while (done < count) {
    while (posted < count && posted - done < window) {
      post(posted);
      if (::testing::Test::HasFatalFailure()) return;
      ++posted;
    }
    ibv_wc wc{};
    ASSERT_TRUE(try_poll_one(scq, wc, timeout))
        << what << " " << done << ": no completion in " << timeout.count() << " ms" << ctx();
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << what << " " << done << ": " << describe(wc) << ctx();
    ASSERT_EQ(uint64_t(done), wc.wr_id) << what << " completions out of order" << ctx();
    if (check) {
      check(done);
      if (::testing::Test::HasFatalFailure()) return;
    }
    ++done;
  }
}

void fill_sequenced(uint8_t* p, uint32_t len, uint32_t seq, uint64_t seed) {
  fill_pattern(p, len, seed);
  memcpy(p, &seq, 4);
}

::testing::AssertionResult IsSequenced(const uint8_t* p, uint32_t len, uint32_t seq,
                                       uint64_t seed) {
  uint32_t got = 0;
  memcpy(&got, p, 4);
  if (got != seq) {
    return ::testing::AssertionFailure() << "sequence number " << got << " where " << seq
                                         << " was due: delivered out of order or twice";
  }
  return HasPattern(p + 4, len - 4, seed, 4);
}

uint32_t OrderedTraffic::send_len(int i) {
  return 8 + static_cast<uint32_t>(i * 7919u % 3100u);
}
uint32_t OrderedTraffic::write_len(int j) {
  return 1 + static_cast<uint32_t>(j * 4099u % 6000u);
}
uint32_t OrderedTraffic::read_len(int j) {
  return 1 + static_cast<uint32_t>(j * 5003u % 7000u);
}
uint64_t OrderedTraffic::read_off(int j) const {
  return static_cast<uint64_t>(j) * 3331u % (read_span - 8192);
}

void OrderedTraffic::request(Role& r, const std::function<std::string()>& context) const {
  auto& l = r.link();
  run_window(
      l.ep.scq, "SEND", sends, window, timeout,
      [&](int i) {
        uint8_t* p = r.buf() + (i % window) * slot;
        fill_sequenced(p, send_len(i), static_cast<uint32_t>(i), i);
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, i, p, send_len(i), r.lkey()));
      },
      {}, context);
  if (::testing::Test::HasFatalFailure()) return;
  run_window(
      l.ep.scq, "WRITE", writes, window, timeout,
      [&](int j) {
        uint8_t* p = r.buf() + (j % window) * slot;
        fill_pattern(p, write_len(j), write_seed0 + j);
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, j, p, write_len(j), r.lkey(),
                               l.remote.addr + write_base + j * write_stride, l.remote.rkey,
                               htonl(static_cast<uint32_t>(j))));
      },
      {}, context);
  if (::testing::Test::HasFatalFailure()) return;
  // Twice the initiator depth in flight by default: the requester must queue the rest.
  run_window(
      l.ep.scq, "READ", reads, read_window, timeout,
      [&](int j) {
        uint8_t* p = r.buf() + (j % read_window) * slot;
        memset(p, kGuard, slot);
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, j, p, read_len(j), r.lkey(),
                               l.remote.addr + read_base + read_off(j), l.remote.rkey));
      },
      [&](int j) {
        const uint8_t* p = r.buf() + (j % read_window) * slot;
        ASSERT_TRUE(HasPattern(p, read_len(j), read_seed, read_off(j))) << "READ " << j;
        ASSERT_TRUE(AllBytesAre(p + read_len(j), slot - read_len(j), kGuard)) << "READ " << j;
      },
      context);
}

void OrderedTraffic::prepare_target(Role& r) const {
  auto& l = r.link();
  fill_pattern(r.buf() + read_base, read_span, read_seed);
  for (int k = 0; k < recv_depth; ++k)
    ASSERT_EQ(0, post_recv(l.ep.qp, k, r.buf() + k * recv_size, recv_size, r.lkey()));
}

void OrderedTraffic::receive_all(Role& r, const std::function<std::string()>& context) const {
  auto& l = r.link();
  for (int m = 0; m < sends + writes; ++m) {
    ibv_wc wc{};
    ASSERT_TRUE(try_poll_one(l.ep.rcq, wc, timeout))
        << "message " << m << " never arrived" << (context ? context() : std::string());
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << "message " << m << ": " << describe(wc);
    ASSERT_LT(wc.wr_id, uint64_t(recv_depth));
    ASSERT_EQ(uint64_t(m % recv_depth), wc.wr_id) << "receives complete in posting order";
    uint8_t* p = r.buf() + wc.wr_id * recv_size;
    if (m < sends) {
      ASSERT_EQ(IBV_WC_RECV, wc.opcode) << "message " << m;
      ASSERT_EQ(send_len(m), wc.byte_len) << "message " << m;
      ASSERT_TRUE(IsSequenced(p, send_len(m), static_cast<uint32_t>(m), m)) << "SEND " << m;
    } else {
      const int j = m - sends;
      ASSERT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, wc.opcode) << "message " << m;
      ASSERT_EQ(htonl(uint32_t(j)), wc.imm_data) << "WRITE with immediate out of order or twice";
      EXPECT_EQ(write_len(j), wc.byte_len);
      ASSERT_TRUE(
          HasPattern(r.buf() + write_base + j * write_stride, write_len(j), write_seed0 + j))
          << "WRITE " << j;
    }
    ASSERT_EQ(0, post_recv(l.ep.qp, wc.wr_id, p, recv_size, r.lkey()));
  }
}

}  // namespace softrdma::verbs_test
