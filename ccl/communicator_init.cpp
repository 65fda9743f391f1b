// Starting a communicator: the unique id (make_unique_id, which starts a bootstrap root in
// this process), and init_rank / init_from_environment, which connect a VerbsTransport
// through the bootstrap (bootstrap_client.cpp, bootstrap_root.cpp) for the rank a unique id
// or the launch environment (launch_environment.cpp) names.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "base/params.h"
#include "ccl/bootstrap.h"
#include "ccl/verbs_transport.h"

namespace softrdma::ccl {
namespace {

using std::chrono::milliseconds;

// SOFTRDMA_CCL_HOST: the address make_unique_id() advertises; null when unset or empty.
const char* host_setting() {
  return params::raw(params::kCclHost);
}

// SOFTRDMA_CCL_SOCKET_IFNAME: the interface whose address make_unique_id() advertises;
// null when unset or empty.
const char* socket_ifname_setting() {
  return params::raw(params::kCclSocketIfname);
}

// The address make_unique_id() advertises.
std::string pick_host() {
  if (const char* h = host_setting()) return h;
  const char* want = socket_ifname_setting();
  std::string found;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i && found.empty(); i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      if (want ? std::strcmp(i->ifa_name, want) != 0 : (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
      if (!want && std::strncmp(i->ifa_name, "docker", 6) == 0) continue;
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
      found = buf;
    }
    freeifaddrs(ifs);
  }
  if (found.empty() && want)
    throw BootstrapError(std::string("SOFTRDMA_CCL_SOCKET_IFNAME: no up IPv4 interface '") + want +
                         "'");
  return found.empty() ? "127.0.0.1" : found;
}

}  // namespace

std::chrono::milliseconds bootstrap_timeout() {
  return milliseconds(params::integer(params::kCclBootstrapTimeoutMs));
}

// ---- unique id ----------------------------------------------------------------------------

std::string UniqueId::to_string() const {
  return std::string(bytes.data(), strnlen(bytes.data(), bytes.size()));
}

UniqueId UniqueId::from_string(const std::string& s) {
  auto c2 = s.rfind(':');
  auto c1 = c2 == std::string::npos || c2 == 0 ? std::string::npos : s.rfind(':', c2 - 1);
  if (c1 == std::string::npos || c1 == 0 || s.size() >= 128 || s.size() - c2 - 1 != 16)
    throw std::invalid_argument("UniqueId: expected host:port:token (16 hex digits), got '" + s +
                                "'");
  const std::string port = s.substr(c1 + 1, c2 - c1 - 1);
  const std::string token = s.substr(c2 + 1);
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end || p < 1 || p > 65535 ||
      token.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    throw std::invalid_argument("UniqueId: malformed port or token in '" + s + "'");
  UniqueId id;
  std::memcpy(id.bytes.data(), s.data(), s.size());
  return id;
}

std::string UniqueId::host() const {
  const std::string s = to_string();
  auto c2 = s.rfind(':');
  auto c1 = s.rfind(':', c2 - 1);
  return s.substr(0, c1);
}

uint16_t UniqueId::port() const {
  const std::string s = to_string();
  auto c2 = s.rfind(':');
  auto c1 = s.rfind(':', c2 - 1);
  return static_cast<uint16_t>(std::stoul(s.substr(c1 + 1, c2 - c1 - 1)));
}

uint64_t UniqueId::token() const {
  const std::string s = to_string();
  return std::stoull(s.substr(s.rfind(':') + 1), nullptr, 16);
}

UniqueId make_unique_id() {
  const std::string host = pick_host();
  std::random_device rd;
  const uint64_t token = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  auto root = BootstrapRoot::start(0, token, host, bootstrap_timeout());
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s:%u:%016llx", host.c_str(), root->port(),
                static_cast<unsigned long long>(token));
  root->detach();
  return UniqueId::from_string(buf);
}

std::unique_ptr<Transport> connect_transport(const UniqueId& id, int nranks, int rank) {
  const auto timeout = bootstrap_timeout();
  const VerbsOptions opt = VerbsOptions::from_environment();
  auto boot = TcpBootstrap::connect(id.host(), id.port(), id.token(), rank, nranks, timeout);
  std::unique_ptr<Transport> t = VerbsTransport::connect(*boot, opt);
  boot.reset();  // goodbye to the root
  return t;
}

std::unique_ptr<Communicator> init_rank(const UniqueId& id, int nranks, int rank, Config config) {
  return std::make_unique<Communicator>(connect_transport(id, nranks, rank), config);
}

std::unique_ptr<Transport> connect_transport_from_environment(const LaunchInfo& info) {
  const VerbsOptions opt = VerbsOptions::from_environment();
  if (info.size == 1) {
    SingleRankBootstrap single;
    return VerbsTransport::connect(single, opt);
  }
  const auto timeout = bootstrap_timeout();
  std::unique_ptr<BootstrapRoot> root;
  if (info.rank == 0)
    root = BootstrapRoot::start(info.master_port, info.magic, info.master_host, timeout);
  auto boot = TcpBootstrap::connect(info.master_host, info.master_port, info.magic, info.rank,
                                    info.size, timeout);
  std::unique_ptr<Transport> t = VerbsTransport::connect(*boot, opt);
  boot.reset();
  root.reset();  // rank 0: waits for the root to see every goodbye
  return t;
}

std::unique_ptr<Communicator> init_from_environment(Config config) {
  return std::make_unique<Communicator>(connect_transport_from_environment(launch_info()), config);
}

}  // namespace softrdma::ccl
