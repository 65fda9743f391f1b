// The helper functions of the libibverbs API that need no device: strings (ibv_*_str),
// static-rate conversions, sysfs readers (the devices' files from the virtual tree) and
// fork protection. Verbs softrdma does not implement are in unsupported.cpp.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "verbs/device_identity.h"
#include "verbs/ops.h"
#include "verbs/sysfs/tree.h"

namespace {

struct RateRow {
  ibv_rate rate;
  int mult;  // multiple of 2.5 Gb/s
  int mbps;
};

// IBTA vol 1, 9.11 static rate encoding; Mb/s as rdma-core reports them.
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},       {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},       {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},      {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},    {IBV_RATE_14_GBPS, -1, 14062},
    {IBV_RATE_56_GBPS, -1, 56250},      {IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},    {IBV_RATE_25_GBPS, 10, 25781},
    {IBV_RATE_100_GBPS, 40, 103125},    {IBV_RATE_200_GBPS, 80, 206250},
    {IBV_RATE_300_GBPS, 120, 309375},   {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},      {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},   {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};

int read_file(const char* dir, const char* file, char* buf, size_t size) {
  std::string path = std::string(dir) + "/" + file;
  // The devices' own files (srdma0, srdma1, … as listed) come from the virtual tree
  // (verbs/sysfs/tree.h): the same text the interposer of `softrdma run` serves, without a
  // trailing newline as libibverbs returns it.
  namespace sysfs = softrdma::verbs::sysfs;
  if (sysfs::in_tree(path.c_str())) {
    const std::vector<sysfs::DeviceView> views =
        sysfs::views_for(softrdma::verbs::device_ips(), sysfs::wan_from_environment());
    if (std::optional<std::string> text = sysfs::read(views, path)) {
      if (!text->empty() && text->back() == '\n') text->pop_back();
      int n = std::snprintf(buf, size, "%s", text->c_str());
      return n < 0 ? -1 : std::min<int>(n, static_cast<int>(size) - 1);
    }
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = ::read(fd, buf, size);
  ::close(fd);
  if (n > 0 && buf[n - 1] == '\n') buf[--n] = '\0';
  if (n >= 0 && static_cast<size_t>(n) < size) buf[n] = '\0';
  return static_cast<int>(n);
}

}  // namespace

extern "C" {

// ---- strings (texts as rdma-core prints them) -----------------------------------------

const char* ibv_node_type_str(ibv_node_type t) {
  static const char* const s[] = {"InfiniBand channel adapter",
                                  "InfiniBand switch",
                                  "InfiniBand router",
                                  "iWARP NIC",
                                  "usNIC",
                                  "usNIC UDP",
                                  "unspecified"};
  if (t < IBV_NODE_CA || t > IBV_NODE_UNSPECIFIED) return "unknown";
  return s[t - 1];
}

const char* ibv_port_state_str(ibv_port_state s) {
  static const char* const n[] = {"PORT_NOP",   "PORT_DOWN",   "PORT_INIT",
                                  "PORT_ARMED", "PORT_ACTIVE", "PORT_ACTIVE_DEFER"};
  return (s >= 0 && s <= IBV_PORT_ACTIVE_DEFER) ? n[s] : "(invalid port state)";
}

const char* ibv_event_type_str(ibv_event_type e) {
  static const char* const n[] = {"CQ error",
                                  "local work queue catastrophic error",
                                  "invalid request local work queue error",
                                  "local access violation work queue error",
                                  "communication established",
                                  "send queue drained",
                                  "path migrated",
                                  "path migration request error",
                                  "local catastrophic error",
                                  "port active",
                                  "port error",
                                  "LID change",
                                  "P_Key change",
                                  "SM change",
                                  "SRQ catastrophic error",
                                  "SRQ limit reached",
                                  "last WQE reached",
                                  "client reregistration",
                                  "GID table change",
                                  "WQ fatal"};
  return (e >= 0 && e <= IBV_EVENT_WQ_FATAL) ? n[e] : "unknown";
}

const char* ibv_wc_status_str(ibv_wc_status s) {
  static const char* const n[] = {"success",
                                  "local length error",
                                  "local QP operation error",
                                  "local EE context operation error",
                                  "local protection error",
                                  "Work Request Flushed Error",
                                  "memory management operation error",
                                  "bad response error",
                                  "local access error",
                                  "remote invalid request error",
                                  "remote access error",
                                  "remote operation error",
                                  "transport retry counter exceeded",
                                  "RNR retry counter exceeded",
                                  "local RDD violation error",
                                  "remote invalid RD request",
                                  "aborted error",
                                  "invalid EE context number",
                                  "invalid EE context state",
                                  "fatal error",
                                  "response timeout error",
                                  "general error",
                                  "TM error",
                                  "TM Rendezvous Request Tag Error"};
  return (s >= 0 && s <= IBV_WC_TM_RNDV_INCOMPLETE) ? n[s] : "unknown";
}

int ibv_rate_to_mult(ibv_rate rate) {
  for (const auto& r : kRates)
    if (r.rate == rate) return r.mult;
  return -1;
}

ibv_rate mult_to_ibv_rate(int mult) {
  for (const auto& r : kRates)
    if (r.mult == mult) return r.rate;
  return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(ibv_rate rate) {
  for (const auto& r : kRates)
    if (r.rate == rate) return r.mbps;
  return -1;
}

ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const auto& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}

// ---- sysfs and fork helpers -------------------------------------------------------------

const char* ibv_get_sysfs_path(void) {
  return "/sys";
}

int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  return read_file(dir, file, buf, size);
}

int ibv_read_ibdev_sysfs_file(char* buf, size_t size, ibv_device* dev, const char* fnfmt, ...) {
  char file[256];
  va_list ap;
  va_start(ap, fnfmt);
  std::vsnprintf(file, sizeof file, fnfmt, ap);
  va_end(ap);
  return read_file(dev->ibdev_path, file, buf, size);
}

/// Private rdma-core verb ibv_devinfo uses to label GIDs: 1 = RoCE v2
/// (enum ibv_gid_type_sysfs in rdma-core's driver.h) for index 0; an empty entry of the
/// table gives 0 (IB / RoCE v1) and success, as rdma-core 44 answers ENODATA; -1 with errno
/// EINVAL past the table or for another port.
int ibv_query_gid_type(ibv_context*, uint8_t port_num, unsigned int index, int* type) {
  if (port_num != 1 || index >= softrdma::verbs::kGidTableLen) {
    errno = EINVAL;
    return -1;
  }
  *type = index == 0 ? 1 : 0;
  return 0;
}

// softrdma never maps registered memory into a device, so fork needs no protection.
int ibv_fork_init(void) {
  return 0;
}
ibv_fork_status ibv_is_fork_initialized(void) {
  return IBV_FORK_UNNEEDED;
}
int ibv_dontfork_range(void*, size_t) {
  return 0;
}
int ibv_dofork_range(void*, size_t) {
  return 0;
}

}  // extern "C"
