// Group calls: nesting, and the concurrent engine of a group's Send/Recv (group.h has the
// schedule and why it cannot deadlock).
#include "ccl/group.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace softrdma::ccl::detail {

bool Group::end(int rank, std::vector<CollectiveCall>& calls) {
  if (depth_ == 0)
    throw std::invalid_argument("GroupEnd: rank " + std::to_string(rank) +
                                ": group_end without group_start");
  if (--depth_ > 0) return false;
  calls = std::move(calls_);
  calls_.clear();
  return true;
}

namespace {

// The transfers of one (peer, direction), in call order, and how far they got.
struct Stream {
  std::vector<GroupedTransfer*> transfers;
  size_t transfer = 0;  // next transfer to post a chunk of
  size_t chunk = 0;     // next chunk of it
  Region region;        // the registered user buffer of `transfer`
  size_t chunk_elems = 0;
  size_t type_bytes = 0;

  bool done() const { return transfer == transfers.size(); }
};

// A posted chunk, in posting order.
struct Posted {
  Stream* stream;
  GroupedTransfer* transfer;
  RequestId id;
};

size_t chunk_count(size_t elems, size_t chunk_elems) {
  return (elems + chunk_elems - 1) / chunk_elems;
}

// Posts the next chunk of `s` (not done) and appends it to `fifo`.
void post_next(Stream& s, std::deque<Posted>& fifo) {
  GroupedTransfer& g = *s.transfers[s.transfer];
  const CollectiveCall& c = g.call;
  if (s.chunk == 0) {
    const void* user = c.op == Collective::kSend ? c.send : c.recv;
    s.chunk_elems = g.ctx.chunk_elems(c.type);
    s.type_bytes = type_size(c.type);
    s.region = g.ctx.user(user, c.block_bytes);
  }
  const size_t first = s.chunk * s.chunk_elems;
  const size_t bytes = std::min(s.chunk_elems, c.count - first) * s.type_bytes;
  const Region at = s.region.at(first * s.type_bytes);
  const uint64_t tag = g.ctx.tag(0, s.chunk);  // as run_pipeline's transfer index
  const RequestId id = c.op == Collective::kSend ? g.ctx.send(c.root, at, bytes, tag)
                                                 : g.ctx.recv(c.root, at, bytes, tag);
  fifo.push_back({&s, &g, id});
  if (++s.chunk == chunk_count(c.count, s.chunk_elems)) {
    s.chunk = 0;
    ++s.transfer;
  }
}

}  // namespace

void run_grouped_transfers(std::deque<GroupedTransfer>& transfers, const Config& config) {
  // Recv streams before send streams, each keyed by peer: the first window posts every recv
  // (its advert leaves at once) before any send.
  std::map<std::pair<bool, int>, Stream> streams;
  for (GroupedTransfer& g : transfers)
    streams[{g.call.op == Collective::kSend, g.call.root}].transfers.push_back(&g);

  const auto depth = static_cast<size_t>(config.depth);
  std::deque<Posted> fifo;
  for (auto& [key, s] : streams)
    for (size_t i = 0; i < depth && !s.done(); ++i) post_next(s, fifo);
  while (!fifo.empty()) {
    const Posted p = fifo.front();
    fifo.pop_front();
    p.transfer->ctx.wait(p.id);
    if (!p.stream->done()) post_next(*p.stream, fifo);
  }
}

}  // namespace softrdma::ccl::detail
