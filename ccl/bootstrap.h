// Rank discovery and out-of-band exchange for softrdma's collectives: a small TCP
// rendezvous ("bootstrap root") that every rank connects to once, at communicator creation,
// to all-gather its connection details (GID, one QPN and PSN per peer); then every rank
// connects its RC QPs and the root is no longer needed.
//
// Three ways to start a communicator, as in NCCL / PyTorch:
//  - unique id (ncclGetUniqueId / ncclCommInitRank): one process calls make_unique_id(),
//    which starts the root in a thread of that process, and hands the id (a string) to
//    every rank, which calls init_rank(id, nranks, rank);
//  - torchrun-style environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (LOCAL_RANK);
//  - Open MPI mpirun (OMPI_COMM_WORLD_RANK / _SIZE, PMIX_RANK) or Slurm srun
//    (SLURM_PROCID / SLURM_NTASKS).
// init_from_environment() picks the launcher from the environment (launch_info()).
//
// Implementation: bootstrap_wire (frames), bootstrap_root (the rendezvous server),
// bootstrap_client (TcpBootstrap), launch_environment (launch_info: torchrun / mpirun /
// Slurm variables), communicator_init (unique id, init_rank, init_from_environment).
//
// Errors are std::runtime_error subclasses (BootstrapError) whose message says which rank
// did not show up or which root could not be reached, e.g.
//   "bootstrap root 127.0.0.1:29501: did not hear from rank 3 within 30000 ms (3 of 4 ranks
//    connected)".
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ccl/ccl.h"

namespace softrdma::ccl {

/// A bootstrap failure: rendezvous unreachable, a rank missing, mismatched job, malformed
/// environment.
class BootstrapError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Out-of-band, collective exchange among the ranks of one communicator, used while
/// connecting a transport. Every call is collective: each rank calls the same sequence.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Every rank contributes `mine` (any bytes, any length); returns all contributions
  /// indexed by rank (the caller's own included). Throws BootstrapError on timeout or when
  /// a rank disconnected.
  virtual std::vector<std::string> all_gather(const std::string& mine) = 0;
  /// Returns once every rank called barrier(). Throws BootstrapError as all_gather().
  virtual void barrier() { all_gather(std::string()); }
};

/// How long the bootstrap waits for ranks to arrive (SOFTRDMA_CCL_BOOTSTRAP_TIMEOUT_MS,
/// default 30000 ms). Throws std::invalid_argument on a malformed value.
std::chrono::milliseconds bootstrap_timeout();

/// The rendezvous root: listens on a TCP port, serves exactly one communicator (the first
/// valid HELLO fixes its size), then exits. Runs in its own thread.
class BootstrapRoot {
 public:
  /// Binds 0.0.0.0:`port` (0: any free port) and starts serving. `magic` identifies the
  /// job: connections with another magic are refused (a stale rank of another job).
  /// `advertised_host` only names the root in error messages. Throws BootstrapError when
  /// the port cannot be bound.
  static std::unique_ptr<BootstrapRoot> start(uint16_t port, uint64_t magic,
                                              const std::string& advertised_host,
                                              std::chrono::milliseconds timeout);
  /// Waits (up to the timeout it was started with) for the serving thread to finish, then
  /// releases it.
  ~BootstrapRoot();
  BootstrapRoot(const BootstrapRoot&) = delete;
  BootstrapRoot& operator=(const BootstrapRoot&) = delete;
  /// The bound TCP port.
  uint16_t port() const;
  /// Lets the serving thread run on after this object is gone (make_unique_id()).
  void detach();

  /// The serving thread's state (bootstrap_root.cpp), shared by this object and the thread.
  struct State;

 private:
  explicit BootstrapRoot(std::shared_ptr<State> s);
  std::shared_ptr<State> state_;
};

/// The client side of the TCP bootstrap: one connection to the root, one round trip per
/// all_gather().
class TcpBootstrap : public Bootstrap {
 public:
  /// Connects rank `rank` of `nranks` to the root at host:port, retrying refused
  /// connections until `timeout` (the root may start after this rank). Throws
  /// BootstrapError (unreachable root, rejected HELLO) or std::invalid_argument (rank out
  /// of range).
  static std::unique_ptr<TcpBootstrap> connect(const std::string& host, uint16_t port,
                                               uint64_t magic, int rank, int nranks,
                                               std::chrono::milliseconds timeout);
  /// Says goodbye to the root (it exits once every rank did) and closes the connection.
  ~TcpBootstrap() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  /// One round trip to the root. Throws BootstrapError with the root's message when it
  /// gave up (a rank missing or gone), or when the root does not answer within the
  /// timeout plus 5 s.
  std::vector<std::string> all_gather(const std::string& mine) override;

 private:
  TcpBootstrap(int fd, std::string root, int rank, int size, std::chrono::milliseconds t)
      : fd_(fd), root_(std::move(root)), rank_(rank), size_(size), timeout_(t) {}
  int fd_;
  std::string root_;  // "host:port", for messages
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
};

/// A one-rank Bootstrap (no network): all_gather returns {mine}.
class SingleRankBootstrap : public Bootstrap {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<std::string> all_gather(const std::string& mine) override { return {mine}; }
};

/// The analogue of ncclUniqueId: where the bootstrap root listens plus a random job token,
/// 128 bytes, printable ("host:port:token", NUL-padded). Copy it to every rank (as bytes or
/// as to_string()).
struct UniqueId {
  std::array<char, 128> bytes{};
  /// "host:port:token" (16 hex digits).
  std::string to_string() const;
  /// Parses to_string()'s form. Throws std::invalid_argument when malformed.
  static UniqueId from_string(const std::string& s);
  /// Where the root listens: host (name or address) and TCP port.
  std::string host() const;
  uint16_t port() const;
  /// The job token the root expects in every HELLO.
  uint64_t token() const;
};

/// Starts a bootstrap root in a background thread of this process (it serves one
/// communicator, then exits) and returns its id. The host in the id is
/// SOFTRDMA_CCL_HOST if set, else the first up, non-loopback IPv4 interface (the one named by
/// SOFTRDMA_CCL_SOCKET_IFNAME if set), else 127.0.0.1. The process must stay alive until
/// every rank has connected. Call it before fork(): ranks may be this process's children.
/// Throws BootstrapError when no port can be bound.
UniqueId make_unique_id();

/// How this process was launched, as read from the environment by launch_info().
struct LaunchInfo {
  std::string launcher;  ///< "torchrun", "mpirun", "slurm" or "none" (a single rank)
  int rank = 0;
  int size = 1;
  int local_rank = 0;        ///< rank among the ranks on this host (-1 if unknown)
  std::string master_host;   ///< where the bootstrap root listens (rank 0's host)
  uint16_t master_port = 0;  ///< its TCP port
  uint64_t magic = 0;        ///< job token: ranks of other jobs are refused
};

/// Reads the launcher's environment, first match wins:
///  1. torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK); the root listens on
///     MASTER_PORT + 1, because MASTER_PORT itself belongs to torch's TCPStore (torchrun's
///     agent or rank 0's torch.distributed);
///  2. Open MPI: OMPI_COMM_WORLD_RANK (or PMIX_RANK) and OMPI_COMM_WORLD_SIZE;
///  3. Slurm: SLURM_PROCID, SLURM_NTASKS (SLURM_LOCALID);
///  4. none of them: a single rank.
/// For mpirun and Slurm the root is SOFTRDMA_CCL_MASTER=host:port if set; otherwise, only
/// when every rank is on this host (OMPI_COMM_WORLD_LOCAL_SIZE == size, SLURM_NNODES == 1),
/// 127.0.0.1 and a port derived from the job id (PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid,
/// OMPI_MCA_orte_ess_jobid or SLURM_JOB_ID + SLURM_STEP_ID): 10000 + FNV-1a(job id) % 20000.
/// SOFTRDMA_CCL_MASTER overrides the torchrun address too. Throws BootstrapError when the
/// variables are inconsistent or a multi-host job gives no rendezvous address.
LaunchInfo launch_info();

/// Connects a VerbsTransport (ccl/verbs_transport.h) for rank `rank` of `nranks` through the
/// root of `id`. Throws BootstrapError, PeerError or std::runtime_error (verbs failures).
std::unique_ptr<Transport> connect_transport(const UniqueId& id, int nranks, int rank);

/// ncclCommInitRank: a communicator over VerbsTransport, connected through the root of `id`.
std::unique_ptr<Communicator> init_rank(const UniqueId& id, int nranks, int rank,
                                        Config config = Config::from_environment());

/// A communicator for the job this process belongs to, as launch_info() describes it
/// (rank 0 runs the bootstrap root). A single rank when no launcher is detected.
std::unique_ptr<Communicator> init_from_environment(Config config = Config::from_environment());

/// The transport half of init_from_environment(), for callers that want the Transport.
std::unique_ptr<Transport> connect_transport_from_environment(const LaunchInfo& info);

}  // namespace softrdma::ccl
