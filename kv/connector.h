// Layer-wise KV-cache hand-off in the shape of vLLM's KV connector (v1, worker side:
// save_kv_layer / wait_for_save on the producer, start_load_kv / wait_for_layer_load on the
// consumer; vllm/distributed/kv_transfer/kv_connector/v1/base.py). The prefill engine saves
// each layer as soon as that layer's compute finishes; the decode engine waits per layer, so
// decode can start before the whole cache has arrived.
//
// A saved layer is one batch of RDMA WRITEs (K and V of the request's blocks; runs of
// consecutive blocks merged into one transfer) followed by the notification
// "kv-layer <request> <layer>", which the engine sends only after every WRITE completed.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kv/engine.h"
#include "kv/layout.h"

namespace softrdma::kv {

/// The blocks of one request: local_blocks[i] of the producer's cache goes to
/// remote_blocks[i] of the consumer's (same layout on both sides).
struct KvRequest {
  uint64_t id = 0;
  std::string peer;          ///< the consumer engine
  SegmentHandle remote = 0;  ///< the consumer's cache segment (open_segment)
  std::vector<uint32_t> local_blocks;
  std::vector<uint32_t> remote_blocks;
};

/// The prefill side.
class KvProducer {
 public:
  /// `cache` holds `layout.total_bytes()` bytes registered with `engine`.
  KvProducer(Engine& engine, const PagedKvLayout& layout, void* cache);
  /// Posts `layer` of `request` (non-blocking), plus `extra` transfers in the same batch
  /// (e.g. a table of block checksums), all before the layer's notification. Throws
  /// std::invalid_argument on a block outside the layout or lists of different lengths,
  /// KvError when the peer is unreachable.
  void save_layer(const KvRequest& request, uint32_t layer,
                  std::span<const TransferRequest> extra = {});
  /// Waits until every saved layer has landed; throws KvError naming the peer on the first
  /// failure, or after `timeout`.
  void wait_for_save(std::chrono::milliseconds timeout);

 private:
  Engine& engine_;
  PagedKvLayout layout_;
  char* cache_;
  std::vector<BatchId> batches_;
};

/// The decode side.
class KvConsumer {
 public:
  explicit KvConsumer(Engine& engine);
  /// Blocks until `layer` of `request` from `peer` has landed. While waiting it watches the
  /// peer every `probe_interval` (Engine::watch_peer): a dead producer gives KvError naming
  /// it within about the RC retry bound, also when the connection failed before this wait
  /// began. Throws KvError on `timeout` too.
  void wait_for_layer(uint64_t request, uint32_t layer, const std::string& peer,
                      std::chrono::milliseconds timeout,
                      std::chrono::milliseconds probe_interval = std::chrono::milliseconds(200));
  /// Whether the layer's notification has arrived (non-blocking).
  bool layer_ready(uint64_t request, uint32_t layer);
  /// Notifications that were not layer notifications, taken out of the engine's queue.
  std::vector<Notification> take_other_notifications();
  /// The oldest notification that is not a layer notification, waiting up to `timeout`
  /// (layer notifications that arrive meanwhile are kept for wait_for_layer).
  std::optional<Notification> wait_other(std::chrono::milliseconds timeout);

 private:
  void take(const Notification& n);
  Engine& engine_;
  std::set<std::pair<uint64_t, uint32_t>> ready_;
  std::vector<Notification> other_;
};

/// "kv-layer <request> <layer>": the notification a saved layer carries.
std::string layer_message(uint64_t request, uint32_t layer);

}  // namespace softrdma::kv
