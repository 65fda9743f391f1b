// The network namespace of same-host names: see netns.h.
#include "net/netns.h"

#include <sys/stat.h>

namespace softrdma::net {

uint64_t current_netns() {
  struct stat st {};
  // Namespaces are per thread (setns(2), unshare(2)): thread-self, where the kernel has it.
  if (::stat("/proc/thread-self/ns/net", &st) == 0 || ::stat("/proc/self/ns/net", &st) == 0)
    return static_cast<uint64_t>(st.st_ino);
  return 0;
}

std::string netns_scope(uint64_t netns) {
  return netns == 0 ? std::string() : "ns" + std::to_string(netns) + "-";
}

}  // namespace softrdma::net
