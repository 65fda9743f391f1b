// What srdma0 says about itself wherever it is asked: the verbs queries (verbs/device.cpp),
// ibv_read_sysfs_file (verbs/helpers.cpp) and the virtual sysfs tree (verbs/sysfs/) all take
// these values from here, so a program sees one device whichever way it looks.
// Header-only and free of <infiniband/verbs.h> (the sysfs interposer does not link libibverbs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "verbs/device_name.h"

namespace softrdma::verbs {

/// Most devices a process lists: one per SOFTRDMA_ADDR entry, srdma0 … srdma63 (entries past
/// this are not listed, by the verbs library or the sysfs tree).
inline constexpr size_t kMaxDevices = 64;

/// Firmware version string (ibv_device_attr::fw_ver, sysfs fw_ver).
inline constexpr char kFirmware[] = "softrdma-0.1.0";
/// As rxe: no IEEE OUI.
inline constexpr uint32_t kVendorId = 0xffffff;
/// uverbs character device numbers (Linux: major 231, minors from 192; device i of the list
/// has minor kUverbsMinor + i, verbs/sysfs/tree.h) and ABI versions of
/// the kernel interfaces a real device would have (/sys/class/infiniband_verbs/abi_version,
/// …/uverbsN/abi_version).
inline constexpr unsigned kUverbsMajor = 231;
inline constexpr unsigned kUverbsMinor = 192;
inline constexpr int kUverbsClassAbi = 6;
inline constexpr int kUverbsDeviceAbi = 1;

/// Port 1 (ibv_port_attr): physical state 5 (LinkUp), capabilities IBV_PORT_IP_BASED_GIDS
/// (1 << 26). Its speed and width (active_speed, active_width; sysfs ports/1/rate) follow the
/// emulated links (verbs/sysfs/tree.h, port_speed()): 4X EDR, 100 Gb/s, without them.
inline constexpr uint8_t kPhysStateLinkUp = 5;
inline constexpr uint32_t kPortCapFlags = 1u << 26;
/// The sysfs spelling of the same port facts (ib_core's sysfs.c formats).
inline constexpr char kPortState[] = "4: ACTIVE";
inline constexpr char kPortPhysState[] = "5: LinkUp";
/// GID type of GID index 0 (sysfs gid_attrs/types/0; ibv_query_gid_type 1 = RoCE v2).
inline constexpr char kGidType[] = "RoCE v2";
/// Entries in port 1's GID table (ibv_port_attr::gid_tbl_len). Only index 0 is populated
/// (::ffff:<addr>, RoCE v2); indices 1…15 are empty, as a real RoCE port's table has more
/// entries than addresses (rxe: 1024; 16 keeps the sysfs tree and `ibv_devinfo -v`'s scan
/// small). An empty index reads as the kernel and rdma-core 44 give it: ibv_query_gid_ex
/// ENODATA, ibv_query_gid the zero GID, sysfs gids/N the zero GID; ibv_query_gid_table
/// returns the populated entry only.
inline constexpr uint32_t kGidTableLen = 16;
/// sysfs gids/N of an empty GID table entry (ib_core's sysfs.c prints the zero GID).
inline constexpr char kZeroGid[] = "0000:0000:0000:0000:0000:0000:0000:0000";

/// EUI-64-style GUID of the device bound to host-order IPv4 `ip` (02:00:a:ff:fe:b:c:d), as
/// 8 bytes in network order.
inline void guid_bytes(uint32_t ip, uint8_t out[8]) {
  const uint8_t b[8] = {
      0x02, 0x00, uint8_t(ip >> 24), 0xff, 0xfe, uint8_t(ip >> 16), uint8_t(ip >> 8), uint8_t(ip)};
  for (int i = 0; i < 8; ++i) out[i] = b[i];
}

/// The GUID as sysfs prints it: four groups of 4 hex digits, "0200:7fff:fe00:3e01".
inline std::string guid_string(uint32_t ip) {
  uint8_t g[8];
  guid_bytes(ip, g);
  char s[24];
  std::snprintf(s, sizeof s, "%02x%02x:%02x%02x:%02x%02x:%02x%02x", g[0], g[1], g[2], g[3], g[4],
                g[5], g[6], g[7]);
  return s;
}

/// GID index 0 as sysfs prints it: the IPv4-mapped address, eight groups of 4 hex digits.
inline std::string gid_string(uint32_t ip) {
  char s[48];
  std::snprintf(s, sizeof s, "0000:0000:0000:0000:0000:ffff:%04x:%04x", ip >> 16, ip & 0xffff);
  return s;
}

}  // namespace softrdma::verbs
