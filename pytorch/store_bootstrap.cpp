// StoreBootstrap (store_bootstrap.h): ccl's bootstrap exchange through a c10d::Store.
#include "pytorch/store_bootstrap.h"

#include <c10/util/Exception.h>

#include <stdexcept>

namespace softrdma::pytorch {

StoreBootstrap::StoreBootstrap(c10::intrusive_ptr<c10d::Store> store, int rank, int size)
    : store_(std::move(store)), rank_(rank), size_(size) {
  if (!store_) throw std::invalid_argument("StoreBootstrap: null store");
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("StoreBootstrap: rank " + std::to_string(rank) + " of size " +
                                std::to_string(size));
}

std::string StoreBootstrap::key(uint64_t round, int rank) const {
  return "softrdma/" + std::to_string(round) + "/" + std::to_string(rank);
}

std::vector<std::string> StoreBootstrap::all_gather(const std::string& mine) {
  const uint64_t round = round_++;
  std::vector<std::string> all(static_cast<size_t>(size_));
  int waiting_for = rank_;
  try {
    store_->set(key(round, rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int r = 0; r < size_; ++r) {
      waiting_for = r;
      if (r == rank_) {
        all[static_cast<size_t>(r)] = mine;
        continue;
      }
      const std::vector<uint8_t> v = store_->get(key(round, r));
      all[static_cast<size_t>(r)].assign(v.begin(), v.end());
    }
    // Every rank has set its key of this round, so every rank is done reading the last one.
    if (round > 0) store_->deleteKey(key(round - 1, rank_));
  } catch (const std::exception& e) {
    // c10::Error's what() carries a C++ backtrace; its first line is the message.
    const auto* c10e = dynamic_cast<const c10::Error*>(&e);
    const std::string why = c10e ? c10e->what_without_backtrace() : e.what();
    throw ccl::BootstrapError("softrdma rendezvous through the torch.distributed store: rank " +
                              std::to_string(rank_) + " of " + std::to_string(size_) +
                              (waiting_for == rank_
                                   ? std::string(": publishing its connection details: ")
                                   : ": waiting for rank " + std::to_string(waiting_for) + ": ") +
                              why);
  }
  return all;
}

}  // namespace softrdma::pytorch
