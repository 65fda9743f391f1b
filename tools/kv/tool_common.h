// Shared by kv-bench and kv-demo: sizes on the command line, percentiles, the metadata store
// a tool opens (and optionally serves).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/metadata_store.h"

namespace softrdma::kv::tool {

/// "65536", "64k", "4m", "1g" (×1024ⁿ) → bytes; throws std::invalid_argument.
uint64_t parse_size(const std::string& text);
/// "16k,64k,1m" → sizes.
std::vector<uint64_t> parse_sizes(const std::string& list);
/// "16 KiB", "4 MiB", "100 B".
std::string size_text(uint64_t bytes);
/// The q-quantile (0..1) of `v` (sorted in place; nearest rank); 0 for an empty vector.
double percentile(std::vector<double>& v, double q);

/// The metadata store of a tool: `uri` (empty: SOFTRDMA_KV_METADATA, else
/// tcp://127.0.0.1:<default_port>). With `serve`, first starts a TcpMetadataServer on the
/// URI's host:port (kept in `server`).
std::shared_ptr<MetadataStore> open_store(std::string uri, bool serve, uint16_t default_port,
                                          std::unique_ptr<TcpMetadataServer>& server);

}  // namespace softrdma::kv::tool
