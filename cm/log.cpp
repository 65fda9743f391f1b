#include "cm/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include "base/params.h"

namespace softrdma::cm {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>("softrdma-cm",
                                              std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("softrdma-cm %L %H:%M:%S.%f [%t] %v");
    // An unknown level is reported once by the engine's logger; here it just means off.
    const char* lvl = params::raw(params::kLog);
    l->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace softrdma::cm
