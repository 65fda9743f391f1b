// See slicing.h.
#include "kv/slicing.h"

#include <algorithm>

namespace softrdma::kv {

uint64_t next_slice_length(uint64_t remaining, uint64_t slice_bytes, uint64_t max_msg) {
  const uint64_t slice = std::min(slice_bytes, max_msg);
  uint64_t len = std::min(slice, remaining);
  const uint64_t rest = remaining - len;
  if (rest > 0 && rest <= slice / 4 && len + rest <= max_msg) len += rest;
  return len;
}

}  // namespace softrdma::kv
