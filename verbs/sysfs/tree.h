// The kernel-side face of the softrdma devices that programs look for outside the verbs API
// (issue 11, part 4). For device i (srdma<i>, the i-th SOFTRDMA_ADDR entry; srdma0 alone in
// the common one-address case): /sys/class/infiniband/srdma<i>/… (node_guid, node_type,
// node_desc, ports/1/{state, phys_state, rate, lid, gids/N, gid_attrs/types/N,
// gid_attrs/ndevs/N, pkeys/N}, device/net/<ifname>), /sys/class/infiniband_verbs/{abi_version,
// uverbs<i>/{ibdev, abi_version, dev, device}} and /dev/infiniband/uverbs<i> — the files
// ib_core's sysfs.c and ib_uverbs create for each real device, with the values the verbs
// queries return for that device (verbs/device_identity.h). ib_uverbs numbers its character
// devices 231:192, 231:193, … in registration order; uverbs<i> gets minor 192 + i.
//
// The tree is data: build() lists its entries for a list of device views; the LD_PRELOAD
// interposer (verbs/sysfs/interpose.cpp, loaded by `softrdma run`) writes it once to a real
// directory (materialize()) and sends the paths under the virtual prefixes there, so every
// libc call — open, stat, opendir/readdir, readlink, realpath — sees ordinary files; `softrdma
// sysfs --create DIR` writes the same tree for an administrator to bind-mount (docs/verbs.md).
// ibv_read_sysfs_file reads it in memory (read()) when the interposer is not loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/link_rate.h"
#include "net/wan_topology.h"

namespace softrdma::verbs::sysfs {

/// What the tree describes of one device: its IPv4 address (host order), the network
/// interface that holds it (the GID's net device) and its port's speed (ports/1/rate).
struct DeviceView {
  uint32_t ip = 0;
  std::string ifname;
  link_rate::PortSpeed port = link_rate::kDefaultPortSpeed;
};

/// The interface whose address is `ip`, else the one whose subnet holds it (127.0.62.1 → the
/// loopback interface, which holds 127.0.0.1/8), else "lo".
std::string interface_for(uint32_t ip);

/// One view per address, in order (device i = srdma<i> describes ips[i]), each with its
/// interface_for() and the port speed the emulated links of `wan` give it (port_speed(); the
/// default 4X EDR without links). At most kMaxDevices (verbs/device_identity.h); later
/// addresses are left out, as the device list leaves them out.
std::vector<DeviceView> views_for(const std::vector<uint32_t>& ips,
                                  const net::WanTopology& wan = {});

/// The port speed of the device at `ip` (host order) under the emulated links `wan`: the
/// slowest standard port at least as fast as the fastest rate-limited link leaving it
/// (link_rate::port_speed_for_rate of WanTopology::egress_rate_bps) — 1X QDR for a
/// 10 Gbit/s link, 4X NDR for 400 Gbit/s — else 4X EDR. ibv_query_port and the sysfs tree
/// both report this.
link_rate::PortSpeed port_speed(uint32_t ip, const net::WanTopology& wan);

/// This process's SOFTRDMA_WAN, parsed as the devices parse it (net::read_wan_spec); no
/// links when it is unset or malformed (a device then refuses to open and says why).
net::WanTopology wan_from_environment();

/// The names of device `index`: "srdma<index>" (ibv_get_device_name) and "uverbs<index>"
/// (its ib_uverbs character device).
std::string ibdev_name(size_t index);
std::string uverbs_name(size_t index);

/// The uverbs minor of device `index`: kUverbsMinor + index (ib_uverbs' numbering).
unsigned uverbs_minor(size_t index);

/// N for "/dev/infiniband/uverbs<N>" (decimal digits to the end of the string), else -1.
int uverbs_index(const char* path);

/// One entry, its path relative to the tree's root ("sys/class/infiniband/srdma0/node_guid",
/// "dev/infiniband/uverbs0"). Files hold their text (with the trailing newline sysfs
/// prints); symlinks their target (relative inside the tree, or a real absolute path).
struct Entry {
  enum class Kind : uint8_t { kDir, kFile, kSymlink };
  std::string path;
  Kind kind;
  std::string content;
};

/// Every entry of the tree for `devices` (device i is srdma<i> / uverbs<i>), parents before
/// children. An empty list gives the class directories with no device in them.
std::vector<Entry> build(const std::vector<DeviceView>& devices);
/// The tree of the one device `v` (srdma0 / uverbs0).
std::vector<Entry> build(const DeviceView& v);

/// The virtual absolute paths the tree stands for, e.g. "/sys/class/infiniband"; a path is
/// in the tree when it is one of them or lies below one.
inline constexpr const char* kVirtualRoots[] = {"/sys/class/infiniband",
                                                "/sys/class/infiniband_verbs", "/dev/infiniband"};

/// Whether absolute `path` lies in the virtual tree (no normalisation: "//" or "/./" spellings
/// are not recognised).
bool in_tree(const char* path);

/// The text of the file at virtual absolute path `path` in the tree of `devices` (trailing
/// newline included), or nothing when the tree has no such file.
std::optional<std::string> read(const std::vector<DeviceView>& devices, const std::string& path);
/// The same for the one-device tree of `v`.
std::optional<std::string> read(const DeviceView& v, const std::string& path);

/// Writes the tree's entries under `root` (created if missing): root/sys/class/…,
/// root/dev/infiniband/…. Returns 0 or the errno of the first failure.
int materialize(const std::string& root, const std::vector<Entry>& entries);

}  // namespace softrdma::verbs::sysfs
