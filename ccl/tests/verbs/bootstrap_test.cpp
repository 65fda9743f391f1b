// The TCP bootstrap (in-process, threads as ranks, no verbs) and the launch paths
// (unique id, torchrun, mpirun and Slurm environments; forked ranks over softrdma).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ccl/bootstrap.h"
#include "ccl/tests/verbs/ranks.h"
#include "ccl/verbs_transport.h"

namespace softrdma::ccl {
namespace {

using test::EnvList;
using test::require;
using test::run_ranks;
using namespace std::chrono_literals;

// Every variable launch_info() reads, cleared for the duration of a test.
const char* const kLaunchVars[] = {"RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_RANK",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "TORCHELASTIC_RUN_ID",
                                   "OMPI_COMM_WORLD_RANK",
                                   "OMPI_COMM_WORLD_SIZE",
                                   "OMPI_COMM_WORLD_LOCAL_RANK",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE",
                                   "PMIX_RANK",
                                   "PMIX_NAMESPACE",
                                   "OMPI_MCA_ess_base_jobid",
                                   "OMPI_MCA_orte_ess_jobid",
                                   "SLURM_PROCID",
                                   "SLURM_NTASKS",
                                   "SLURM_LOCALID",
                                   "SLURM_NNODES",
                                   "SLURM_JOB_NUM_NODES",
                                   "SLURM_JOB_ID",
                                   "SLURM_STEP_ID",
                                   "SOFTRDMA_CCL_MASTER"};

class ScopedLaunchEnv {
 public:
  explicit ScopedLaunchEnv(const EnvList& set) {
    for (const char* k : kLaunchVars) {
      if (const char* v = std::getenv(k)) saved_.emplace_back(k, v);
      unsetenv(k);
    }
    for (const auto& [k, v] : set) setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedLaunchEnv() {
    for (const char* k : kLaunchVars) unsetenv(k);
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  EnvList saved_;
};

TEST(Bootstrap, UniqueIdRoundTrip) {
  UniqueId id = UniqueId::from_string("10.1.2.3:29500:00000000deadbeef");
  EXPECT_EQ("10.1.2.3", id.host());
  EXPECT_EQ(29500, id.port());
  EXPECT_EQ(0xdeadbeefu, id.token());
  EXPECT_EQ("10.1.2.3:29500:00000000deadbeef", id.to_string());
  UniqueId copy;
  std::memcpy(copy.bytes.data(), id.bytes.data(), copy.bytes.size());  // as raw bytes
  EXPECT_EQ(id.to_string(), copy.to_string());
  for (const char* bad : {"", "host", "host:1", "host:0:00000000deadbeef",
                          "host:70000:00000000deadbeef", "host:1:xyz", ":1:00000000deadbeef"})
    EXPECT_THROW(UniqueId::from_string(bad), std::invalid_argument) << bad;
}

// Threads as ranks: several all_gather rounds of different sizes, then goodbye.
TEST(Bootstrap, AllGatherRounds) {
  const int n = 5;
  auto root = BootstrapRoot::start(0, 42, "127.0.0.1", 10s);
  std::vector<std::thread> th;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        auto b = TcpBootstrap::connect("127.0.0.1", root->port(), 42, r, n, 10s);
        for (int round = 0; round < 3; ++round) {
          std::string mine(static_cast<size_t>(r * 1000 * round), static_cast<char>('a' + r));
          auto all = b->all_gather(mine);
          require(static_cast<int>(all.size()) == n, "size");
          for (int q = 0; q < n; ++q)
            require(all[q] == std::string(static_cast<size_t>(q * 1000 * round),
                                          static_cast<char>('a' + q)),
                    "contribution of rank " + std::to_string(q));
        }
        b->barrier();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ("", errors[r]) << "rank " << r;
}

TEST(Bootstrap, MissingRankIsNamed) {
  auto root = BootstrapRoot::start(0, 7, "127.0.0.1", 700ms);
  std::vector<std::thread> th;
  std::vector<std::string> errors(2);
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      try {
        auto b = TcpBootstrap::connect("127.0.0.1", root->port(), 7, r, 3, 700ms);
        b->all_gather("x");
      } catch (const BootstrapError& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(std::string::npos, errors[r].find("did not hear from rank 2 within 700 ms"))
        << errors[r];
    EXPECT_NE(std::string::npos, errors[r].find("2 of 3 ranks connected")) << errors[r];
  }
}

TEST(Bootstrap, OtherJobIsRefused) {
  auto root = BootstrapRoot::start(0, 1111, "127.0.0.1", 2s);
  auto b = TcpBootstrap::connect("127.0.0.1", root->port(), 2222, 0, 1, 2s);
  try {
    b->all_gather("x");
    FAIL() << "no error";
  } catch (const BootstrapError& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("job token mismatch")) << e.what();
  }
  // The root still serves its own job.
  auto ok = TcpBootstrap::connect("127.0.0.1", root->port(), 1111, 0, 1, 2s);
  EXPECT_EQ(std::vector<std::string>{"y"}, ok->all_gather("y"));
}

TEST(Bootstrap, UnreachableRoot) {
  const int port = test::free_tcp_port();
  try {
    TcpBootstrap::connect("127.0.0.1", static_cast<uint16_t>(port), 1, 1, 2, 300ms);
    FAIL() << "no error";
  } catch (const BootstrapError& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("cannot reach the bootstrap root"))
        << e.what();
  }
}

TEST(Bootstrap, LaunchInfoFromEnvironment) {
  {
    ScopedLaunchEnv e({});
    LaunchInfo i = launch_info();
    EXPECT_EQ("none", i.launcher);
    EXPECT_EQ(1, i.size);
  }
  {
    ScopedLaunchEnv e({{"RANK", "3"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "1"},
                       {"MASTER_ADDR", "node7"},
                       {"MASTER_PORT", "29500"}});
    LaunchInfo i = launch_info();
    EXPECT_EQ("torchrun", i.launcher);
    EXPECT_EQ(3, i.rank);
    EXPECT_EQ(8, i.size);
    EXPECT_EQ(1, i.local_rank);
    EXPECT_EQ("node7", i.master_host);
    EXPECT_EQ(29501, i.master_port);  // MASTER_PORT belongs to torch's TCPStore
  }
  {
    ScopedLaunchEnv e(
        {{"RANK", "3"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
    EXPECT_THROW(launch_info(), BootstrapError);  // rank out of range
  }
  uint16_t mpi_port = 0;
  {
    ScopedLaunchEnv e({{"OMPI_COMM_WORLD_RANK", "2"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                       {"PMIX_NAMESPACE", "519241729"}});
    LaunchInfo i = launch_info();
    EXPECT_EQ("mpirun", i.launcher);
    EXPECT_EQ(2, i.rank);
    EXPECT_EQ(4, i.size);
    EXPECT_EQ("127.0.0.1", i.master_host);
    EXPECT_GE(i.master_port, 10000);
    EXPECT_LT(i.master_port, 30000);
    mpi_port = i.master_port;
  }
  {
    // Same job id, another rank: same rendezvous.
    ScopedLaunchEnv e(
        {{"PMIX_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"PMIX_NAMESPACE", "519241729"}});
    EXPECT_EQ(mpi_port, launch_info().master_port);
    EXPECT_EQ(0, launch_info().rank);
  }
  {
    ScopedLaunchEnv e({{"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"PMIX_NAMESPACE", "1"}});
    EXPECT_THROW(launch_info(), BootstrapError);  // two hosts, no SOFTRDMA_CCL_MASTER
  }
  {
    ScopedLaunchEnv e({{"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"SOFTRDMA_CCL_MASTER", "10.0.0.1:4000"}});
    LaunchInfo i = launch_info();
    EXPECT_EQ("10.0.0.1", i.master_host);
    EXPECT_EQ(4000, i.master_port);
  }
  {
    ScopedLaunchEnv e({{"SLURM_PROCID", "1"},
                       {"SLURM_NTASKS", "2"},
                       {"SLURM_LOCALID", "1"},
                       {"SLURM_NNODES", "1"},
                       {"SLURM_JOB_ID", "4242"},
                       {"SLURM_STEP_ID", "0"}});
    LaunchInfo i = launch_info();
    EXPECT_EQ("slurm", i.launcher);
    EXPECT_EQ(1, i.rank);
    EXPECT_EQ(2, i.size);
    EXPECT_EQ("127.0.0.1", i.master_host);
  }
  {
    ScopedLaunchEnv e({{"SLURM_PROCID", "1"},
                       {"SLURM_NTASKS", "2"},
                       {"SLURM_NNODES", "3"},
                       {"SLURM_JOB_ID", "1"}});
    EXPECT_THROW(launch_info(), BootstrapError);
  }
  {
    ScopedLaunchEnv e(
        {{"SOFTRDMA_CCL_MASTER", "nonsense"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
    EXPECT_THROW(launch_info(), BootstrapError);
  }
}

// Launch paths end to end: forked ranks find each other from the environment alone, connect
// VerbsTransports and exchange data with every peer.
void exchange_all(Transport& t) {
  const int n = t.size(), me = t.rank();
  std::vector<uint32_t> out(n, 0), in(n, 0);
  for (int q = 0; q < n; ++q) out[q] = static_cast<uint32_t>(me * 1000 + q);
  auto O = t.register_buffer(out.data(), out.size() * 4);
  auto I = t.register_buffer(in.data(), in.size() * 4);
  std::vector<RequestId> ids;
  for (int q = 0; q < n; ++q) {
    ids.push_back(t.recv(q, *I, q * 4, 4, 1));
    ids.push_back(t.send(q, *O, q * 4, 4, 1));
  }
  for (RequestId id : ids) t.wait(id, "exchange");
  for (int q = 0; q < n; ++q)
    require(in[q] == static_cast<uint32_t>(q * 1000 + me), "value from rank " + std::to_string(q));
  t.barrier("exchange");
}

void run_env_job(int n, const std::function<EnvList(int)>& env_of, const std::string& launcher) {
  auto res = run_ranks(
      n,
      [&](int r) {
        for (const char* k : kLaunchVars) unsetenv(k);
        for (const auto& [k, v] : env_of(r)) setenv(k.c_str(), v.c_str(), 1);
        LaunchInfo info = launch_info();
        require(info.launcher == launcher, "launcher " + info.launcher);
        require(info.rank == r && info.size == n, "rank/size");
        auto t = connect_transport_from_environment(info);
        exchange_all(*t);
      },
      120s);
  for (const auto& r : res) ASSERT_EQ(0, r.exit_code) << test::describe(res);
}

TEST(Bootstrap, TorchrunEnvironment) {
  const std::string port = std::to_string(test::free_tcp_port() - 1);
  run_env_job(
      4,
      [&](int r) -> EnvList {
        return {{"RANK", std::to_string(r)},
                {"LOCAL_RANK", std::to_string(r)},
                {"WORLD_SIZE", "4"},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", port}};
      },
      "torchrun");
}

TEST(Bootstrap, MpirunEnvironment) {
  const std::string job = "test-" + std::to_string(getpid());
  run_env_job(
      3,
      [&](int r) -> EnvList {
        return {{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                {"OMPI_COMM_WORLD_SIZE", "3"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                {"PMIX_RANK", std::to_string(r)},
                {"PMIX_NAMESPACE", job}};
      },
      "mpirun");
}

TEST(Bootstrap, SlurmEnvironment) {
  const std::string master = "127.0.0.1:" + std::to_string(test::free_tcp_port());
  run_env_job(
      2,
      [&](int r) -> EnvList {
        return {{"SLURM_PROCID", std::to_string(r)},
                {"SLURM_NTASKS", "2"},
                {"SLURM_LOCALID", std::to_string(r)},
                {"SLURM_NNODES", "1"},
                {"SLURM_JOB_ID", "77"},
                {"SOFTRDMA_CCL_MASTER", master}};
      },
      "slurm");
}

// A rank whose device setup fails tells the others through the bootstrap: they fail at once
// with its reason instead of waiting for a timeout.
TEST(Bootstrap, SetupFailureIsReported) {
  test::RootProcess root;
  const UniqueId id = root.id();
  auto res = run_ranks(
      2,
      [&](int r) {
        if (r == 1) setenv("SOFTRDMA_CCL_IB_DEVICE", "no_such_device", 1);
        try {
          auto t = connect_transport(id, 2, r);
        } catch (const std::exception& e) {
          std::printf("%s\n", e.what());
          require(std::string(e.what()).find("no_such_device") != std::string::npos,
                  "reason not propagated");
          return;
        }
        throw std::runtime_error("connected anyway");
      },
      60s);
  for (const auto& r : res) ASSERT_EQ(0, r.exit_code) << test::describe(res);
}

}  // namespace
}  // namespace softrdma::ccl
