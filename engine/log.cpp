#include "engine/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

namespace softrdma::engine {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>("softrdma",
                                              std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("softrdma %L %H:%M:%S.%f [%t] %v");
    const char* lvl = std::getenv("SOFTRDMA_LOG");
    l->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace softrdma::engine
