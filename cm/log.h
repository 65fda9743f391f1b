// The RDMA-CM's logger: spdlog, named "softrdma-cm", to stderr, at the level SOFTRDMA_LOG
// gives the rest of softrdma (default warn). librdmacm.so.1 does not link the engine, so it
// keeps its own logger with the same settings.
#pragma once

#include <spdlog/spdlog.h>

namespace softrdma::cm {

/// The process-wide RDMA-CM logger (created on first use).
spdlog::logger& log();

}  // namespace softrdma::cm
