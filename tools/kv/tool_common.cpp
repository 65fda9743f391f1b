// Helpers of the kv tools (tool_common.h).
#include "tools/kv/tool_common.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "base/params.h"

namespace softrdma::kv::tool {

uint64_t parse_size(const std::string& text) {
  size_t used = 0;
  uint64_t n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("not a size: '" + text + "'");
  }
  std::string suffix = text.substr(used);
  for (char& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (suffix == "k" || suffix == "kib" || suffix == "kb") return n << 10;
  if (suffix == "m" || suffix == "mib" || suffix == "mb") return n << 20;
  if (suffix == "g" || suffix == "gib" || suffix == "gb") return n << 30;
  if (suffix.empty() || suffix == "b") return n;
  throw std::invalid_argument("not a size: '" + text + "'");
}

std::vector<uint64_t> parse_sizes(const std::string& list) {
  std::vector<uint64_t> out;
  std::stringstream s(list);
  std::string item;
  while (std::getline(s, item, ',')) out.push_back(parse_size(item));
  if (out.empty()) throw std::invalid_argument("empty size list");
  return out;
}

std::string size_text(uint64_t b) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

std::shared_ptr<MetadataStore> open_store(std::string uri, bool serve, uint16_t default_port,
                                          std::unique_ptr<TcpMetadataServer>& server) {
  if (uri.empty()) uri = params::text(params::kKvMetadata);
  if (uri.empty()) uri = "tcp://127.0.0.1:" + std::to_string(default_port);
  if (serve) {
    if (!uri.starts_with("tcp://"))
      throw std::invalid_argument("--serve-metadata needs a tcp://host:port store, got " + uri);
    const std::string rest = uri.substr(6);
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos)
      throw std::invalid_argument("--serve-metadata: expected tcp://host:port, got " + uri);
    server = std::make_unique<TcpMetadataServer>(
        rest.substr(0, colon), static_cast<uint16_t>(std::stoi(rest.substr(colon + 1))));
  }
  return open_metadata_store(uri);
}

}  // namespace softrdma::kv::tool
