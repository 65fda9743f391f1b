// A file several processes share under flock(2): cm's rdma_cm port table (cm/shared_ports.h)
// and net's per-address share registry (net/address_share.h) both open theirs this way.
#pragma once

#include <string>

namespace softrdma::base {

/// Opens (creating, mode 0600, O_CLOEXEC) the file `path` and takes its flock (LOCK_EX,
/// blocking). A file that another process unlinked while this one waited for the lock (the
/// last user of a per-address file removes it, under the lock) is let go and the path opened
/// again, at most 16 times. Returns the descriptor, locked (the caller unlocks or closes it),
/// or -errno from open(2) or flock(2).
int open_locked_file(const std::string& path);

}  // namespace softrdma::base
