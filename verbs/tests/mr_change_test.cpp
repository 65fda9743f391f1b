// Memory that changes under a registration, between two processes: ibv_rereg_mr (rights,
// translation, PD) as a remote peer sees it, and memory unmapped or protected after it was
// registered — a remote WRITE, READ or atomic into it ends in IBV_WC_REM_ACCESS_ERR at the
// requester while the target process survives and counts it (resp_access_faults) — and
// on-demand MRs (IBV_ACCESS_ON_DEMAND) over memory mapped only after registration, and the
// implicit one over the whole address space.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr uint64_t kSeed = 0x4242;

/// What the target tells the initiator about a region of its own.
struct Region {
  uint64_t addr;
  uint32_t rkey;
};

/// A WRITE of `len` bytes from the initiator's buffer; its completion status.
ibv_wc_status write_to(Role& r, const Region& g, uint64_t off, uint32_t len, uint64_t id) {
  auto& l = r.link();
  if (post_send(l.ep.qp, IBV_WR_RDMA_WRITE, id, r.buf(), len, r.lkey(), g.addr + off, g.rkey))
    fail_fatal("ibv_post_send refused the WRITE");
  const ibv_wc wc = poll_one(l.ep.scq);
  return wc.status;
}

size_t page() {
  return static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

constexpr int kRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;

// ---- ibv_rereg_mr ----------------------------------------------------------------------

// IBV_REREG_MR_CHANGE_ACCESS without REMOTE_WRITE: the next WRITE through the unchanged
// rkey is refused.
TEST(MrChange, ReregAccessRevokesRemoteWrite) {
  run_pair(
      ConnOptions{},
      [](Role& r) {
        const auto g = r.recv_value<Region>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_to(r, g, 0, 64, 1));
        r.send_value(1, uint32_t{1});
        r.recv_value<uint32_t>(1);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_to(r, g, 0, 64, 2));
        r.barrier();
      },
      [](Role& r) {
        ibv_mr* mr = ibv_reg_mr(r.dev().pd, r.buf() + 65536, 4096, kRemote);
        ASSERT_NE(nullptr, mr);
        r.send_value(0, Region{reinterpret_cast<uintptr_t>(mr->addr), mr->rkey});
        r.recv_value<uint32_t>(0);
        const uint32_t key = mr->rkey;
        ASSERT_EQ(0, ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                                  IBV_ACCESS_LOCAL_WRITE));
        EXPECT_EQ(key, mr->rkey) << "the keys stay";
        r.send_value(0, uint32_t{1});
        r.barrier();  // the initiator is done
        EXPECT_EQ(0, ibv_dereg_mr(mr));
      });
}

// IBV_REREG_MR_CHANGE_TRANSLATION: the same rkey now reaches the new range only.
TEST(MrChange, ReregTranslationMovesTheRegion) {
  run_pair(
      ConnOptions{},
      [](Role& r) {
        fill_pattern(r.buf(), 4096, kSeed);
        const auto before = r.recv_value<Region>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_to(r, before, 0, 100, 1));
        r.send_value(1, uint32_t{1});
        const auto after = r.recv_value<Region>(1);
        EXPECT_EQ(before.rkey, after.rkey);
        EXPECT_EQ(IBV_WC_SUCCESS, write_to(r, after, 200, 300, 2));
        r.send_value(1, uint32_t{1});
        r.recv_value<uint32_t>(1);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_to(r, before, 0, 8, 3)) << "the old range is gone";
        r.barrier();
      },
      [](Role& r) {
        uint8_t* a = r.buf() + 65536;
        uint8_t* b = r.buf() + 2 * 65536;
        memset(a, kGuard, 4096);
        memset(b, kGuard, 4096);
        ibv_mr* mr = ibv_reg_mr(r.dev().pd, a, 4096, kRemote);
        ASSERT_NE(nullptr, mr);
        r.send_value(0, Region{reinterpret_cast<uintptr_t>(a), mr->rkey});
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(PatternBetweenGuards(a, 4096, 0, 100, kSeed));
        ASSERT_EQ(0, ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, b, 4096, 0));
        EXPECT_EQ(b, mr->addr);
        r.send_value(0, Region{reinterpret_cast<uintptr_t>(b), mr->rkey});
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(PatternBetweenGuards(b, 4096, 200, 300, kSeed));
        r.send_value(0, uint32_t{1});
        r.barrier();  // the initiator is done
        EXPECT_EQ(0, ibv_dereg_mr(mr));
      });
}

// IBV_REREG_MR_CHANGE_PD: an MR moved to another PD is out of reach of the QP's PD.
TEST(MrChange, ReregPdPutsTheRegionOutOfReach) {
  run_pair(
      ConnOptions{},
      [](Role& r) {
        const auto g = r.recv_value<Region>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_to(r, g, 0, 8, 1));
        r.send_value(1, uint32_t{1});
        r.recv_value<uint32_t>(1);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_to(r, g, 0, 8, 2));
        r.barrier();
      },
      [](Role& r) {
        ibv_mr* mr = ibv_reg_mr(r.dev().pd, r.buf() + 65536, 4096, kRemote);
        ASSERT_NE(nullptr, mr);
        ibv_pd* other = ibv_alloc_pd(r.dev().ctx);
        ASSERT_NE(nullptr, other);
        r.send_value(0, Region{reinterpret_cast<uintptr_t>(mr->addr), mr->rkey});
        r.recv_value<uint32_t>(0);
        ASSERT_EQ(0, ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0));
        EXPECT_EQ(other, mr->pd);
        EXPECT_EQ(EBUSY, ibv_dealloc_pd(other)) << "the MR is in it now";
        r.send_value(0, uint32_t{1});
        r.barrier();  // the initiator is done
        EXPECT_EQ(0, ibv_dereg_mr(mr));
        EXPECT_EQ(0, ibv_dealloc_pd(other));
      });
}

// ---- memory unmapped or protected after registration -----------------------------------

/// The target's part of the unmapped-memory tests: maps three pages, registers them, gives
/// the initiator the region, then applies `change` to the middle page and lets the initiator
/// go on; afterwards it checks that it counted the fault and is still alive and working.
void unmapped_target(Role& r, const std::function<void(uint8_t*)>& change) {
  const size_t pg = page();
  void* m = ::mmap(nullptr, 3 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, m);
  auto* p = static_cast<uint8_t*>(m);
  memset(p, kGuard, 3 * pg);
  ibv_mr* mr = ibv_reg_mr(r.dev().pd, p, 3 * pg, kRemote);
  ASSERT_NE(nullptr, mr);
  const Counters before = r.counters();
  r.send_value(0, Region{reinterpret_cast<uintptr_t>(p), mr->rkey});
  change(p + pg);
  r.send_value(0, uint32_t{1});
  r.barrier();  // the initiator is done
  EXPECT_GE(wait_counter_growth(r.dev().addr, getpid(), {"resp_access_faults"}, before, 1), 1u);
  // Still alive, and its memory still works: the first page got the initiator's WRITE.
  EXPECT_TRUE(HasPattern(p, 64, kSeed));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  ::munmap(p, pg);
  ::munmap(p + 2 * pg, pg);
}

/// One unmapped/protected-memory test: the target applies `change` to the middle of three
/// registered pages (unmapped_target); the initiator then checks that a WRITE into the first
/// page still works and runs `probe`, its access into the changed page.
void run_changed_memory(std::function<void(uint8_t*)> change,
                        std::function<void(Role&, const Region&)> probe) {
  run_pair(
      ConnOptions{},
      [probe](Role& r) {
        fill_pattern(r.buf(), 8192, kSeed);
        const auto g = r.recv_value<Region>(1);
        r.recv_value<uint32_t>(1);  // the middle page has changed
        EXPECT_EQ(IBV_WC_SUCCESS, write_to(r, g, 0, 64, 1));
        probe(r, g);
        r.barrier();
      },
      [change](Role& r) { unmapped_target(r, change); });
}

void unmap_page(uint8_t* p) {
  ::munmap(p, page());
}

TEST(MrChange, RemoteWriteIntoMemoryUnmappedAfterRegistration) {
  run_changed_memory(unmap_page, [](Role& r, const Region& g) {
    // A two-packet WRITE (MTU 1024) that starts in the first page and runs into the hole.
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_to(r, g, page() - 1024, 2048, 2));
  });
}

TEST(MrChange, RemoteReadOfMemoryUnmappedAfterRegistration) {
  run_changed_memory(unmap_page, [](Role& r, const Region& g) {
    auto& l = r.link();
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, 2, r.buf() + 65536, 100, r.lkey(),
                           g.addr + page() + 8, g.rkey));
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, poll_one(l.ep.scq).status);
  });
}

TEST(MrChange, RemoteAtomicOnMemoryUnmappedAfterRegistration) {
  run_changed_memory(unmap_page, [](Role& r, const Region& g) {
    SendWr w(IBV_WR_ATOMIC_FETCH_AND_ADD, 2);
    w.add_sge(r.buf() + 65536, 8, r.lkey()).atomic(g.addr + page(), g.rkey, 1);
    ASSERT_EQ(0, w.post(r.link().ep.qp));
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, poll_one(r.link().ep.scq).status);
  });
}

// Made read-only after registration: a WRITE fails (SIGSEGV on a present page), a READ of
// the same page still works.
TEST(MrChange, RemoteWriteIntoMemoryProtectedAfterRegistration) {
  run_changed_memory([](uint8_t* mid) { ::mprotect(mid, page(), PROT_READ); },
                     [](Role& r, const Region& g) {
                       auto& l = r.link();
                       ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, 2, r.buf() + 65536, 16,
                                              r.lkey(), g.addr + page(), g.rkey));
                       poll_success(l.ep.scq, 2, IBV_WC_RDMA_READ);
                       EXPECT_TRUE(AllBytesAre(r.buf() + 65536, 16, kGuard));
                       EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, write_to(r, g, page(), 8, 3));
                     });
}

// ---- deregistration under a stream of WRITEs -------------------------------------------

// What makes same-host placement safe (net/shm_placement.h): the initiator writes 64 KiB WRITEs
// back to back into the target's MR — on the same-host path its device copies them straight
// into the target's memory — while the target deregisters the MR and at once overwrites the
// memory (as a program reusing it would). Nothing may write it after ibv_dereg_mr returned:
// the memory keeps what the target put there, and the initiator's stream ends in
// IBV_WC_REM_ACCESS_ERR. On the same-host path the target must have taken placed packets.
TEST(MrChange, NothingIsWrittenAfterDeregWhileAPeerStreamsWrites) {
  constexpr uint32_t kLen = 256 << 10;
  constexpr size_t kRegion = 4 << 20;
  constexpr int kDepth = 8;
  run_pair(
      ConnOptions{},
      [](Role& r) {
        memset(r.buf(), 0x5a, kLen);
        const auto g = r.recv_value<Region>(1);
        auto& l = r.link();
        // kDepth WRITEs in flight at all times, so that the copies run back to back.
        ibv_wc_status st = IBV_WC_SUCCESS;
        int posted = 0, done = 0;
        const auto until = std::chrono::steady_clock::now() + 20s;
        while (st == IBV_WC_SUCCESS && std::chrono::steady_clock::now() < until && done < 1000000) {
          while (posted - done < kDepth) {
            ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, posted + 1, r.buf(), kLen, r.lkey(),
                                   g.addr + uint64_t(posted % 16) * kLen, g.rkey));
            ++posted;
          }
          st = poll_one(l.ep.scq).status;
          if (++done == 20) r.send_value(1, uint32_t{1});  // streaming: the target may go on
        }
        EXPECT_GE(done, 20);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st) << "the stream did not end at the deregistration";
        r.barrier();
      },
      [](Role& r) {
        void* m =
            ::mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(MAP_FAILED, m);
        auto* p = static_cast<uint8_t*>(m);
        ibv_mr* mr = ibv_reg_mr(r.dev().pd, p, kRegion, kRemote);
        ASSERT_NE(nullptr, mr);
        const Counters before = r.counters();
        const Counters pbefore = r.peer_counters(0);
        r.send_value(0, Region{reinterpret_cast<uintptr_t>(p), mr->rkey});
        r.recv_value<uint32_t>(0);
        std::this_thread::sleep_for(20ms);  // WRITEs in full flow
        ASSERT_EQ(0, ibv_dereg_mr(mr));
        memset(p, kGuard, kRegion);  // reused at once
        std::this_thread::sleep_for(100ms);
        EXPECT_TRUE(AllBytesAre(p, kRegion, kGuard)) << "written after ibv_dereg_mr returned";
        const char* path = getenv("SOFTRDMA_TRANSPORT");
        if (!path || std::string(path) != "udp") {
          const Growth g{before, r.counters()};
          EXPECT_GT(g["rcvd_placed_pkts"], 0u)
              << "the same-host path placed nothing; the target's counters:" << g.str()
              << "; the initiator's:" << Growth{pbefore, r.peer_counters(0)}.str();
        }
        r.barrier();
        ::munmap(p, kRegion);
      });
}

// ---- on-demand paging ------------------------------------------------------------------

// An ODP MR may cover memory not mapped yet; once mapped, remote WRITEs reach it.
TEST(MrChange, OnDemandMrOverMemoryMappedAfterRegistration) {
  run_pair(
      ConnOptions{},
      [](Role& r) {
        fill_pattern(r.buf(), 4096, kSeed);
        const auto g = r.recv_value<Region>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_to(r, g, 0, 4096, 1));
        r.send_value(1, uint32_t{1});
      },
      [](Role& r) {
        const size_t len = 4 * page();
        void* hole = ::mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(MAP_FAILED, hole);
        ASSERT_EQ(0, ::munmap(hole, len));  // an address range with nothing mapped
        EXPECT_EQ(nullptr, ibv_reg_mr(r.dev().pd, hole, len, kRemote));
        EXPECT_EQ(EFAULT, errno) << "without ON_DEMAND the range must be mapped";
        ibv_mr* mr = ibv_reg_mr(r.dev().pd, hole, len, kRemote | IBV_ACCESS_ON_DEMAND);
        ASSERT_NE(nullptr, mr) << strerror(errno);
        void* m = ::mmap(hole, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                         -1, 0);
        ASSERT_EQ(hole, m);
        r.send_value(0, Region{reinterpret_cast<uintptr_t>(hole), mr->rkey});
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(HasPattern(hole, 4096, kSeed));
        EXPECT_EQ(0, ibv_dereg_mr(mr));
        ::munmap(hole, len);
      });
}

// The implicit ODP MR (NULL, SIZE_MAX): any address of the target's through one rkey.
TEST(MrChange, ImplicitOnDemandMrCoversTheAddressSpace) {
  run_pair(
      ConnOptions{},
      [](Role& r) {
        fill_pattern(r.buf(), 256, kSeed);
        const auto g = r.recv_value<Region>(1);
        EXPECT_EQ(IBV_WC_SUCCESS, write_to(r, g, 0, 256, 1));
        r.send_value(1, uint32_t{1});
      },
      [](Role& r) {
        ibv_mr* mr = ibv_reg_mr(r.dev().pd, nullptr, SIZE_MAX, kRemote | IBV_ACCESS_ON_DEMAND);
        ASSERT_NE(nullptr, mr) << strerror(errno);
        memset(r.buf() + 8192, kGuard, 4096);
        r.send_value(0, Region{reinterpret_cast<uintptr_t>(r.buf() + 8192 + 100), mr->rkey});
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(PatternBetweenGuards(r.buf() + 8192, 4096, 100, 256, kSeed));
        EXPECT_EQ(0, ibv_dereg_mr(mr));
      });
}

}  // namespace
}  // namespace softrdma::verbs_test
