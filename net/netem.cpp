#include "net/netem.h"

#include <cstdlib>
#include <sstream>

namespace softrdma::net {

bool parse_netem(const std::string& spec, NetemConfig& out, std::string& error) {
  NetemConfig c;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) {
      error = "expected key=value, got '" + item + "'";
      return false;
    }
    std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    char* end = nullptr;
    if (key == "loss") {
      bool percent = !val.empty() && val.back() == '%';
      if (percent) val.pop_back();
      double v = std::strtod(val.c_str(), &end);
      if (val.empty() || *end != '\0' || v < 0) {
        error = "bad loss value '" + item + "'";
        return false;
      }
      if (percent) v /= 100.0;
      if (v > 1.0) {
        error = "loss above 100% in '" + item + "'";
        return false;
      }
      c.loss = v;
    } else if (key == "every" || key == "seed") {
      unsigned long long v = std::strtoull(val.c_str(), &end, 10);
      if (val.empty() || *end != '\0') {
        error = "bad integer in '" + item + "'";
        return false;
      }
      (key == "every" ? c.every : c.seed) = v;
    } else {
      error = "unknown key '" + key + "' (known: loss, every, seed)";
      return false;
    }
  }
  out = c;
  return true;
}

}  // namespace softrdma::net
