// Launch environments: launch_info() of bootstrap.h reads how torchrun, Open MPI's mpirun or
// Slurm's srun started this process (rank, size, where rank 0's bootstrap root listens,
// the job token). Nothing here opens a socket or a device.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "base/params.h"
#include "ccl/bootstrap.h"

namespace softrdma::ccl {
namespace {

// A launcher's variable `name`; null when unset or empty.
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// SOFTRDMA_CCL_MASTER (host:port of the bootstrap root, overriding the launcher's); null
// when unset or empty.
const char* master_setting() {
  return params::raw(params::kCclMaster);
}

long parse_long(const char* name, const char* v, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    throw BootstrapError(std::string(name) + ": expected an integer in [" + std::to_string(lo) +
                         ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

// "host:port" → host, port (the last ':' splits).
void parse_host_port(const char* name, const std::string& s, std::string& host, uint16_t& port) {
  auto c = s.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == s.size())
    throw BootstrapError(std::string(name) + ": expected host:port, got '" + s + "'");
  host = s.substr(0, c);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  port = static_cast<uint16_t>(parse_long(name, s.c_str() + c + 1, 1, 65535));
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The size, rank and local rank (-1 when `local_var` is unset) a launcher exports, parsed in
// that order.
void read_ranks(LaunchInfo& info, const char* size_var, const char* rank_var,
                const char* local_var) {
  info.size = static_cast<int>(parse_long(size_var, env(size_var), 1, 1 << 20));
  info.rank = static_cast<int>(parse_long(rank_var, env(rank_var), 0, info.size - 1));
  info.local_rank =
      env(local_var) ? static_cast<int>(parse_long(local_var, env(local_var), 0, 1 << 20)) : -1;
}

}  // namespace

LaunchInfo launch_info() {
  LaunchInfo info;
  std::string job;  // job identity: token and (mpirun/Slurm) derived port
  bool one_host = true;
  if (env("RANK") && env("WORLD_SIZE")) {
    info.launcher = "torchrun";
    read_ranks(info, "WORLD_SIZE", "RANK", "LOCAL_RANK");
    if (!master_setting()) {
      if (!env("MASTER_ADDR") || !env("MASTER_PORT"))
        throw BootstrapError(
            "torchrun environment: RANK and WORLD_SIZE are set but MASTER_ADDR / MASTER_PORT "
            "are not (or set SOFTRDMA_CCL_MASTER=host:port)");
      info.master_host = env("MASTER_ADDR");
      const long port = parse_long("MASTER_PORT", env("MASTER_PORT"), 1, 65534);
      info.master_port = static_cast<uint16_t>(port + 1);
    }
    job = std::string("torchrun:") +
          (env("TORCHELASTIC_RUN_ID") ? env("TORCHELASTIC_RUN_ID") : "") + ":" +
          (env("MASTER_ADDR") ? env("MASTER_ADDR") : "") + ":" +
          (env("MASTER_PORT") ? env("MASTER_PORT") : "");
  } else if (env("OMPI_COMM_WORLD_SIZE") && (env("OMPI_COMM_WORLD_RANK") || env("PMIX_RANK"))) {
    info.launcher = "mpirun";
    read_ranks(info, "OMPI_COMM_WORLD_SIZE",
               env("OMPI_COMM_WORLD_RANK") ? "OMPI_COMM_WORLD_RANK" : "PMIX_RANK",
               "OMPI_COMM_WORLD_LOCAL_RANK");
    if (const char* ls = env("OMPI_COMM_WORLD_LOCAL_SIZE"))
      one_host = parse_long("OMPI_COMM_WORLD_LOCAL_SIZE", ls, 1, 1 << 20) == info.size;
    for (const char* k : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"})
      if (env(k)) {
        job = std::string("mpirun:") + env(k);
        break;
      }
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    info.launcher = "slurm";
    read_ranks(info, "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID");
    const char* nn = env("SLURM_NNODES") ? env("SLURM_NNODES") : env("SLURM_JOB_NUM_NODES");
    if (nn) one_host = parse_long("SLURM_NNODES", nn, 1, 1 << 20) == 1;
    if (env("SLURM_JOB_ID"))
      job = std::string("slurm:") + env("SLURM_JOB_ID") + "." +
            (env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "");
  } else {
    info.launcher = "none";
    info.rank = 0;
    info.size = 1;
    info.local_rank = 0;
    return info;
  }

  if (const char* m = master_setting()) {
    parse_host_port("SOFTRDMA_CCL_MASTER", m, info.master_host, info.master_port);
  } else if (info.launcher != "torchrun") {
    if (!one_host)
      throw BootstrapError(info.launcher +
                           ": ranks on several hosts: set SOFTRDMA_CCL_MASTER=host:port (rank "
                           "0's host and a free TCP port) for the bootstrap rendezvous");
    if (job.empty())
      throw BootstrapError(info.launcher +
                           ": no job id in the environment (PMIX_NAMESPACE, "
                           "OMPI_MCA_ess_base_jobid, SLURM_JOB_ID): set "
                           "SOFTRDMA_CCL_MASTER=host:port");
    info.master_host = "127.0.0.1";
    info.master_port = static_cast<uint16_t>(10000 + fnv1a(job) % 20000);
  }
  info.magic = fnv1a(job + ":" + std::to_string(info.size));
  return info;
}

}  // namespace softrdma::ccl
