// Layer-wise hand-off (connector.h).
#include "kv/connector.h"

#include <cstdio>
#include <stdexcept>

#include "base/clock.h"

namespace softrdma::kv {

std::string layer_message(uint64_t request, uint32_t layer) {
  return "kv-layer " + std::to_string(request) + " " + std::to_string(layer);
}

KvProducer::KvProducer(Engine& engine, const PagedKvLayout& layout, void* cache)
    : engine_(engine), layout_(layout), cache_(static_cast<char*>(cache)) {
  if (!cache) throw std::invalid_argument("kv::KvProducer: null cache");
}

void KvProducer::save_layer(const KvRequest& r, uint32_t layer,
                            std::span<const TransferRequest> extra) {
  if (r.local_blocks.size() != r.remote_blocks.size() || r.local_blocks.empty())
    throw std::invalid_argument(
        "kv::KvProducer::save_layer: request " + std::to_string(r.id) +
        ": local and remote block lists must be non-empty and equally long");
  std::vector<TransferRequest> reqs;
  const uint64_t bb = layout_.block_bytes();
  for (uint32_t part = 0; part < layout_.model().parts(); ++part) {
    size_t i = 0;
    while (i < r.local_blocks.size()) {
      // A run of blocks consecutive on both sides is one transfer.
      size_t j = i + 1;
      while (j < r.local_blocks.size() && r.local_blocks[j] == r.local_blocks[j - 1] + 1 &&
             r.remote_blocks[j] == r.remote_blocks[j - 1] + 1)
        ++j;
      uint64_t local = 0, remote = 0;
      try {
        local = layout_.offset(layer, part, r.local_blocks[i]);
        remote = layout_.offset(layer, part, r.remote_blocks[i]);
        layout_.offset(layer, part, r.local_blocks[j - 1]);
        layout_.offset(layer, part, r.remote_blocks[j - 1]);
      } catch (const std::out_of_range& e) {
        throw std::invalid_argument(std::string("kv::KvProducer::save_layer: ") + e.what());
      }
      reqs.push_back(
          TransferRequest{Opcode::kWrite, cache_ + local, r.remote, remote, (j - i) * bb});
      i = j;
    }
  }
  reqs.insert(reqs.end(), extra.begin(), extra.end());
  const BatchId b = engine_.allocate_batch(reqs.size());
  try {
    engine_.submit_transfer(b, reqs, layer_message(r.id, layer));
  } catch (...) {
    engine_.free_batch(b);
    throw;
  }
  batches_.push_back(b);
}

void KvProducer::wait_for_save(std::chrono::milliseconds timeout) {
  const auto until = clock::Steady::now() + timeout;
  while (!batches_.empty()) {
    const BatchId b = batches_.front();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::Steady::now());
    BatchStatus s = engine_.wait(b, std::max(left, std::chrono::milliseconds(0)));
    if (s.state == BatchState::kPending)
      throw KvError("kv::KvProducer::wait_for_save: not done after " +
                        std::to_string(timeout.count()) + " ms",
                    "");
    if (s.state == BatchState::kFailed) {
      // The other batches finish (or fail) by themselves; drop the ones that are done.
      throw KvError("kv::KvProducer::wait_for_save: " + s.error, s.peer);
    }
    engine_.free_batch(b);
    batches_.erase(batches_.begin());
  }
}

KvConsumer::KvConsumer(Engine& engine) : engine_(engine) {}

void KvConsumer::take(const Notification& n) {
  unsigned long long req = 0;
  unsigned layer = 0;
  int used = 0;
  if (std::sscanf(n.message.c_str(), "kv-layer %llu %u%n", &req, &layer, &used) == 2 &&
      static_cast<size_t>(used) == n.message.size())
    ready_.emplace(req, layer);
  else
    other_.push_back(n);
}

bool KvConsumer::layer_ready(uint64_t request, uint32_t layer) {
  for (const Notification& n : engine_.get_notifications()) take(n);
  return ready_.count({request, layer}) > 0;
}

void KvConsumer::wait_for_layer(uint64_t request, uint32_t layer, const std::string& peer,
                                std::chrono::milliseconds timeout,
                                std::chrono::milliseconds probe_interval) {
  using Clock = clock::Steady;
  const auto until = Clock::now() + timeout;
  auto next_probe = Clock::now() + probe_interval;
  while (!layer_ready(request, layer)) {
    const auto now = Clock::now();
    if (now >= until)
      throw KvError("kv::KvConsumer::wait_for_layer: layer " + std::to_string(layer) +
                        " of request " + std::to_string(request) + " from peer '" + peer +
                        "' did not arrive within " + std::to_string(timeout.count()) + " ms",
                    peer);
    if (now >= next_probe) {
      engine_.watch_peer(peer);  // throws KvError naming a dead peer
      next_probe = Clock::now() + probe_interval;
    }
    const auto wait = std::min(next_probe, until) - Clock::now();
    if (auto n = engine_.wait_notification(
            std::max(std::chrono::duration_cast<std::chrono::milliseconds>(wait),
                     std::chrono::milliseconds(1))))
      take(*n);
  }
}

std::optional<Notification> KvConsumer::wait_other(std::chrono::milliseconds timeout) {
  using Clock = clock::Steady;
  const auto until = Clock::now() + timeout;
  for (;;) {
    if (!other_.empty()) {
      Notification n = std::move(other_.front());
      other_.erase(other_.begin());
      return n;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    if (auto n = engine_.wait_notification(left)) take(*n);
  }
}

std::vector<Notification> KvConsumer::take_other_notifications() {
  for (const Notification& n : engine_.get_notifications()) take(n);
  return std::exchange(other_, {});
}

}  // namespace softrdma::kv
