// softrdma's private entry points of the drop-in libibverbs.so.1, for the layers built on it
// (cm/, the drop-in librdmacm.so.1). They carry the symbol version SOFTRDMA_PRIVATE_1.0 and are
// not part of any verbs API: a caller finds them with dlsym(RTLD_DEFAULT, name), so that
// running over another libibverbs fails with a clear message instead of a link error.
#pragma once

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Opens (or shares) this process's softrdma device bound to the IPv4 address `ipv4` (host
/// order) and returns a new context on it; ibv_close_device releases it. A process may own
/// several addresses this way (ibv_open_device returns the default one: SOFTRDMA_ADDR's, else
/// the first opened). Returns NULL with errno: EINVAL (ipv4 0 or a malformed SOFTRDMA_*
/// variable), EADDRINUSE (another process's device owns the address), EADDRNOTAVAIL (the
/// address is not configured on this host), or the socket error.
struct ibv_context* softrdma_open_device_at(uint32_t ipv4);

#ifdef __cplusplus
}
#endif
