// The name of the one device the softrdma libibverbs lists (ibv_get_device_name), kept in
// one place for the verbs layer, the tools and the verbs tests. Header-only and free of
// <infiniband/verbs.h>, so a tool can name the device without linking the verbs library.
#pragma once

namespace softrdma::verbs {

/// ibv_device::name of the softrdma device (as rxe's "rxe0"): the first, default one; a
/// SOFTRDMA_ADDR list adds srdma1, srdma2, … (verbs/device.cpp).
inline constexpr char kDeviceName[] = "srdma0";

}  // namespace softrdma::verbs
