// StoreBootstrap: ccl's out-of-band exchange (ccl::Bootstrap, ccl/bootstrap.h) over the
// c10d::Store that torch.distributed hands to a backend — with env:// the TCPStore that
// torchrun's agent (or rank 0) serves on MASTER_ADDR:MASTER_PORT, wrapped by torch in a
// PrefixStore per process group — so softrdma needs no rendezvous port of its own.
//
// all_gather round k: rank r sets "softrdma/<k>/<r>" to its bytes, then gets the key of
// every rank (Store::get blocks until the key exists, up to the store's timeout). Once round
// k + 1 has completed every rank has read round k, so each rank then deletes its own key of
// round k (the store does not grow with the number of rounds).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ccl/bootstrap.h"

namespace softrdma::pytorch {

/// ccl::Bootstrap over a c10d::Store (see the file comment).
class StoreBootstrap : public ccl::Bootstrap {
 public:
  /// Rank `rank` of `size` exchanging through `store`. Throws std::invalid_argument for a
  /// null store or a rank outside [0, size).
  StoreBootstrap(c10::intrusive_ptr<c10d::Store> store, int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  /// Every rank's contribution, by rank. Throws ccl::BootstrapError naming the rank this
  /// rank was waiting for and the store's own message (timeout, store gone).
  std::vector<std::string> all_gather(const std::string& mine) override;

 private:
  std::string key(uint64_t round, int rank) const;

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  uint64_t round_ = 0;
};

}  // namespace softrdma::pytorch
