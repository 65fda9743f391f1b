// The slice-length calculator: how kv::Engine cuts a transfer into work requests (Mooncake's
// slicing: fixed slices, a short tail merged into the slice before it).
#pragma once

#include <cstdint>

namespace softrdma::kv {

/// The length in bytes of the next work request of a transfer with `remaining` (> 0) bytes
/// left: slices of min(`slice_bytes`, `max_msg`) bytes, where a tail of at most a quarter
/// slice is joined to the slice before it when the two fit in `max_msg` (the port's largest
/// message, IBTA vol 1 9.4: one RDMA READ/WRITE carries at most 2^31 bytes). Never more than
/// `remaining`.
uint64_t next_slice_length(uint64_t remaining, uint64_t slice_bytes, uint64_t max_msg);

}  // namespace softrdma::kv
