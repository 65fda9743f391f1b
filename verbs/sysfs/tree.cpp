#include "verbs/sysfs/tree.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "base/params.h"
#include "verbs/device_identity.h"

namespace softrdma::verbs::sysfs {

std::string interface_for(uint32_t ip) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "lo";
  std::string exact, subnet;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !a->ifa_name) continue;
    const uint32_t addr = ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
    const uint32_t mask =
        a->ifa_netmask ? ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_netmask)->sin_addr.s_addr)
                       : 0xffffffffu;
    if (addr == ip && exact.empty()) exact = a->ifa_name;
    if ((addr & mask) == (ip & mask) && subnet.empty()) subnet = a->ifa_name;
  }
  ::freeifaddrs(list);
  if (!exact.empty()) return exact;
  if (!subnet.empty()) return subnet;
  return "lo";
}

std::vector<DeviceView> views_for(const std::vector<uint32_t>& ips, const net::WanTopology& wan) {
  std::vector<DeviceView> views;
  for (size_t i = 0; i < ips.size() && i < kMaxDevices; ++i)
    views.push_back({ips[i], interface_for(ips[i]), port_speed(ips[i], wan)});
  return views;
}

link_rate::PortSpeed port_speed(uint32_t ip, const net::WanTopology& wan) {
  return link_rate::port_speed_for_rate(wan.egress_rate_bps(ip));
}

net::WanTopology wan_from_environment() {
  net::WanTopology wan;
  if (const char* w = params::raw(params::kWan)) {
    std::string text, error;
    if (!net::read_wan_spec(w, wan, text, error)) wan = {};
  }
  return wan;
}

std::string ibdev_name(size_t index) {
  return "srdma" + std::to_string(index);
}

std::string uverbs_name(size_t index) {
  return "uverbs" + std::to_string(index);
}

unsigned uverbs_minor(size_t index) {
  return kUverbsMinor + static_cast<unsigned>(index);
}

int uverbs_index(const char* path) {
  constexpr char kPrefix[] = "/dev/infiniband/uverbs";
  constexpr size_t kLen = sizeof kPrefix - 1;
  if (!path || std::strncmp(path, kPrefix, kLen) != 0) return -1;
  const char* d = path + kLen;
  if (*d == '\0' || std::strlen(d) > 6) return -1;
  int n = 0;
  for (; *d; ++d) {
    if (*d < '0' || *d > '9') return -1;
    n = n * 10 + (*d - '0');
  }
  return n;
}

std::vector<Entry> build(const std::vector<DeviceView>& devices) {
  using K = Entry::Kind;
  std::vector<Entry> e;
  auto dir = [&](const std::string& p) { e.push_back({p, K::kDir, {}}); };
  auto file = [&](const std::string& p, const std::string& text) {
    e.push_back({p, K::kFile, text + "\n"});
  };
  auto link = [&](const std::string& p, const std::string& target) {
    e.push_back({p, K::kSymlink, target});
  };
  const std::string ib = "sys/class/infiniband";
  dir("sys");
  dir("sys/class");
  dir(ib);
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceView& v = devices[i];
    const std::string name = ibdev_name(i);
    const std::string dev = ib + "/" + name;
    const std::string port = dev + "/ports/1";
    dir(dev);
    // ib_core's device attributes (drivers/infiniband/core/sysfs.c, ib_device_attr group).
    file(dev + "/node_type", "1: CA");
    file(dev + "/node_guid", guid_string(v.ip));
    file(dev + "/sys_image_guid", guid_string(v.ip));
    file(dev + "/node_desc", "softrdma " + name);
    file(dev + "/fw_ver", kFirmware);
    file(dev + "/hca_type", "softrdma");
    file(dev + "/hw_rev", "0");
    file(dev + "/board_id", "softrdma user-space RoCEv2");
    // The parent device: for a RoCE device, its net device is listed under device/net.
    dir(dev + "/device");
    dir(dev + "/device/net");
    link(dev + "/device/net/" + v.ifname, "/sys/class/net/" + v.ifname);
    // Port 1 (ib_port attributes), GID index 0, P_Key index 0.
    dir(dev + "/ports");
    dir(port);
    file(port + "/state", kPortState);
    file(port + "/phys_state", kPortPhysState);
    file(port + "/rate", link_rate::port_rate_text(v.port));
    file(port + "/lid", "0x0");
    file(port + "/sm_lid", "0x0");
    file(port + "/lid_mask_count", "0");
    file(port + "/sm_sl", "0");
    char cap[16];
    std::snprintf(cap, sizeof cap, "0x%08x", kPortCapFlags);
    file(port + "/cap_mask", cap);
    file(port + "/link_layer", "Ethernet");
    // Every GID table entry has a gids/N file (the empty ones print the zero GID, as ib_core's
    // sysfs.c); gid_attrs/{types,ndevs}/N only for the populated index 0 — the kernel lists
    // them for every N but fails a read of an empty one (EINVAL), which files cannot do.
    dir(port + "/gids");
    file(port + "/gids/0", gid_string(v.ip));
    for (uint32_t g = 1; g < kGidTableLen; ++g) file(port + "/gids/" + std::to_string(g), kZeroGid);
    dir(port + "/gid_attrs");
    dir(port + "/gid_attrs/types");
    file(port + "/gid_attrs/types/0", kGidType);
    dir(port + "/gid_attrs/ndevs");
    file(port + "/gid_attrs/ndevs/0", v.ifname);
    dir(port + "/pkeys");
    file(port + "/pkeys/0", "0xffff");
  }
  // ib_uverbs' class and one character device per device, numbered as ib_uverbs numbers
  // them (231:192, 231:193, …).
  const std::string uv = "sys/class/infiniband_verbs";
  dir(uv);
  file(uv + "/abi_version", std::to_string(kUverbsClassAbi));
  for (size_t i = 0; i < devices.size(); ++i) {
    const std::string u = uv + "/" + uverbs_name(i);
    dir(u);
    file(u + "/ibdev", ibdev_name(i));
    file(u + "/abi_version", std::to_string(kUverbsDeviceAbi));
    file(u + "/dev", std::to_string(kUverbsMajor) + ":" + std::to_string(uverbs_minor(i)));
    link(u + "/device", "../../infiniband/" + ibdev_name(i) + "/device");
  }
  dir("dev");
  dir("dev/infiniband");
  // No character device can be made without CAP_MKNOD: /dev/null stands in (stat sees a
  // character device; the interposer reports uverbs<i>'s own numbers for this path).
  for (size_t i = 0; i < devices.size(); ++i) link("dev/infiniband/" + uverbs_name(i), "/dev/null");
  return e;
}

std::vector<Entry> build(const DeviceView& v) {
  return build(std::vector<DeviceView>{v});
}

bool in_tree(const char* path) {
  if (!path || path[0] != '/') return false;
  for (const char* root : kVirtualRoots) {
    const size_t n = std::strlen(root);
    if (std::strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/')) return true;
  }
  return false;
}

std::optional<std::string> read(const std::vector<DeviceView>& devices, const std::string& path) {
  if (path.empty() || path[0] != '/') return std::nullopt;
  // Collapse "//" (ibv_read_sysfs_file joins "dir" + "/" + "file").
  std::string p;
  for (char c : path)
    if (!(c == '/' && !p.empty() && p.back() == '/')) p.push_back(c);
  for (const Entry& e : build(devices))
    if (e.kind == Entry::Kind::kFile && "/" + e.path == p) return e.content;
  return std::nullopt;
}

std::optional<std::string> read(const DeviceView& v, const std::string& path) {
  return read(std::vector<DeviceView>{v}, path);
}

int materialize(const std::string& root, const std::vector<Entry>& entries) {
  if (::mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  for (const Entry& e : entries) {
    const std::string p = root + "/" + e.path;
    switch (e.kind) {
      case Entry::Kind::kDir:
        if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) return errno;
        break;
      case Entry::Kind::kSymlink:
        if (::symlink(e.content.c_str(), p.c_str()) != 0 && errno != EEXIST) return errno;
        break;
      case Entry::Kind::kFile: {
        const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
        if (fd < 0) return errno;
        const ssize_t n = ::write(fd, e.content.data(), e.content.size());
        const int werr = errno;
        ::close(fd);
        if (n != static_cast<ssize_t>(e.content.size())) return n < 0 ? werr : EIO;
        break;
      }
    }
  }
  return 0;
}

}  // namespace softrdma::verbs::sysfs
