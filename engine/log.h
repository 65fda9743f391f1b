// The engine's logger: spdlog, named "softrdma", to stderr. The level comes from
// SOFTRDMA_LOG (off, error, warn, info, debug, trace; default warn).
#pragma once

#include <spdlog/spdlog.h>

namespace softrdma::engine {

/// The process-wide softrdma logger (created on first use).
spdlog::logger& log();

}  // namespace softrdma::engine
