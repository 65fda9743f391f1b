// The kernel-side face of srdma0 that programs look for outside the verbs API (issue 11, part
// 4): /sys/class/infiniband/srdma0/… (node_guid, node_type, ports/1/{state, phys_state, rate,
// lid, gids/N, gid_attrs/types/N, gid_attrs/ndevs/N, pkeys/N}, device/net/<ifname>),
// /sys/class/infiniband_verbs/{abi_version, uverbs0/{ibdev, abi_version, dev}} and
// /dev/infiniband/uverbs0 — the files ib_core's sysfs.c and ib_uverbs create for a real
// device, with the values the verbs queries return (verbs/device_identity.h).
//
// The tree is data: build() lists its entries for one device view; the LD_PRELOAD
// interposer (verbs/sysfs/interpose.cpp, loaded by `softrdma run`) writes it once to a real
// directory (materialize()) and sends the paths under the virtual prefixes there, so every
// libc call — open, stat, opendir/readdir, readlink, realpath — sees ordinary files; `softrdma
// sysfs --create DIR` writes the same tree for an administrator to bind-mount (docs/verbs.md).
// ibv_read_sysfs_file reads it in memory (read()) when the interposer is not loaded.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace softrdma::verbs::sysfs {

/// What the tree describes: the device's IPv4 address (host order) and the network
/// interface that holds it (the GID's net device).
struct DeviceView {
  uint32_t ip = 0;
  std::string ifname;
};

/// The interface whose address is `ip`, else the one whose subnet holds it (127.0.62.1 → the
/// loopback interface, which holds 127.0.0.1/8), else "lo".
std::string interface_for(uint32_t ip);

/// One entry, its path relative to the tree's root ("sys/class/infiniband/srdma0/node_guid",
/// "dev/infiniband/uverbs0"). Files hold their text (with the trailing newline sysfs
/// prints); symlinks their target (relative inside the tree, or a real absolute path).
struct Entry {
  enum class Kind : uint8_t { kDir, kFile, kSymlink };
  std::string path;
  Kind kind;
  std::string content;
};

/// Every entry of the tree for `v`, parents before children.
std::vector<Entry> build(const DeviceView& v);

/// The virtual absolute paths the tree stands for, e.g. "/sys/class/infiniband"; a path is
/// in the tree when it is one of them or lies below one.
inline constexpr const char* kVirtualRoots[] = {"/sys/class/infiniband",
                                                "/sys/class/infiniband_verbs", "/dev/infiniband"};

/// Whether absolute `path` lies in the virtual tree (no normalisation: "//" or "/./" spellings
/// are not recognised).
bool in_tree(const char* path);

/// The text of the file at virtual absolute path `path` for `v` (trailing newline included),
/// or nothing when the tree has no such file.
std::optional<std::string> read(const DeviceView& v, const std::string& path);

/// Writes the tree's entries under `root` (created if missing): root/sys/class/…,
/// root/dev/infiniband/…. Returns 0 or the errno of the first failure.
int materialize(const std::string& root, const std::vector<Entry>& entries);

}  // namespace softrdma::verbs::sysfs
