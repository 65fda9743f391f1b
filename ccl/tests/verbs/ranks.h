// Fork-based multi-process runner for the VerbsTransport / bootstrap tests: each rank is a
// child process (opening a verbs device starts a progress thread, so nothing verbs may run
// in the gtest process itself), with its own softrdma device (the first free 127.0.0.x).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ccl/bootstrap.h"

namespace softrdma::ccl::test {

/// make_unique_id() run in a helper process, where its bootstrap root thread lives, so that
/// the test process itself stays single-threaded when run_ranks() forks: a thread of the
/// parent holding a lock at fork time (GCC 12's ASan allocator is not fork-safe) would
/// deadlock the child. The helper is killed when this object goes.
class RootProcess {
 public:
  RootProcess();
  ~RootProcess();
  RootProcess(const RootProcess&) = delete;
  RootProcess& operator=(const RootProcess&) = delete;
  const UniqueId& id() const { return id_; }

 private:
  pid_t pid_ = -1;
  UniqueId id_;
};

/// How one rank ended.
struct RankResult {
  int exit_code = -1;  ///< exit status, or -1 when killed (signal or deadline)
  bool timed_out = false;
  std::string output;  ///< its stdout and stderr
};

/// Environment changes applied in every child before `fn` runs: {name, value}; an empty
/// value unsets the variable.
using EnvList = std::vector<std::pair<std::string, std::string>>;

/// Forks `n` children; child r applies `env`, then runs fn(r): exit code 0 when it returns,
/// 1 (with the message on stderr) when it throws. A child still running at `deadline` is
/// killed. Returns every child's result, indexed by rank.
std::vector<RankResult> run_ranks(int n, const std::function<void(int rank)>& fn,
                                  std::chrono::seconds deadline, const EnvList& env = {});

/// Throws std::runtime_error(msg) unless cond (assertions inside a child).
inline void require(bool cond, const std::string& msg) {
  if (!cond) throw std::runtime_error(msg);
}

/// A TCP port nothing listens on right now (bind port 0, read it back, close).
int free_tcp_port();

/// "rank r: exit 1\n<output>" for every rank, for failure messages.
std::string describe(const std::vector<RankResult>& results);

}  // namespace softrdma::ccl::test
