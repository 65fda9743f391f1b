#include "engine/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdio>
#include <string_view>

#include "base/params.h"

namespace softrdma::engine {

spdlog::logger& log() {
  // Never destroyed: code that runs in exit handlers and static destructors (the RDMA-CM's
  // teardown at unload, a device closing at exit) may still log.
  static spdlog::logger* const logger = [] {
    auto* l = new spdlog::logger("softrdma", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("softrdma %L %H:%M:%S.%f [%t] %v");
    // spdlog's level names (and its aliases "warning", "err"); anything else turns logging
    // off, as spdlog does, and says so once.
    const char* lvl = params::raw(params::kLog);
    const auto level = lvl ? spdlog::level::from_str(lvl) : spdlog::level::warn;
    if (level == spdlog::level::off && std::string_view(lvl) != "off")
      std::fprintf(stderr, "softrdma: %s; logging is off\n",
                   params::malformed(params::kLog, lvl).c_str());
    l->set_level(level);
    return l;
  }();
  return *logger;
}

}  // namespace softrdma::engine
