// The virtual sysfs tree: the values of srdma0's files for a device address, the lookup
// ibv_read_sysfs_file uses, the virtual prefixes, the tree written to a directory, and the
// tree of two devices (srdma0 and srdma1, one per SOFTRDMA_ADDR entry) beside the one-device
// tree it must leave as it was.
#include "verbs/sysfs/tree.h"

#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include "verbs/device_identity.h"

namespace softrdma::verbs::sysfs {
namespace {

constexpr uint32_t kIp = (127u << 24) | (0 << 16) | (62 << 8) | 1;   // 127.0.62.1
constexpr uint32_t kIpB = (127u << 24) | (0 << 16) | (85 << 8) | 7;  // 127.0.85.7

/// FNV-1a over every entry's path, kind and content, each field closed by 0xff.
uint64_t fingerprint(const std::vector<Entry>& entries) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  };
  for (const Entry& e : entries) {
    mix(e.path);
    mix(std::string(1, static_cast<char>('0' + static_cast<int>(e.kind))));
    mix(e.content);
  }
  return h;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(SysfsTree, FilesHoldTheValuesOfTheVerbsQueries) {
  const DeviceView v{kIp, "lo"};
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/node_guid"), "0200:7fff:fe00:3e01\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/node_type"), "1: CA\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/ports/1/gids/0"),
            "0000:0000:0000:0000:0000:ffff:7f00:3e01\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/ports/1/gid_attrs/types/0"), "RoCE v2\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/ports/1/gid_attrs/ndevs/0"), "lo\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/ports/1/state"), "4: ACTIVE\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/ports/1/phys_state"), "5: LinkUp\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/ports/1/lid"), "0x0\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband_verbs/uverbs0/ibdev"), "srdma0\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband_verbs/abi_version"), "6\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband_verbs/uverbs0/dev"), "231:192\n");
  // ibv_read_sysfs_file joins directory and file with a '/': a doubled one still matches.
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0//fw_ver"), "softrdma-0.1.0\n");
  // Empty GID table entries (1…15 of 16) print the zero GID, as ib_core's sysfs.c; their
  // gid_attrs are absent (the kernel's fail to read).
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/ports/1/gids/1"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/ports/1/gids/15"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n");
  EXPECT_FALSE(read(v, "/sys/class/infiniband/srdma0/ports/1/gids/16"));
  EXPECT_FALSE(read(v, "/sys/class/infiniband/srdma0/ports/1/gid_attrs/types/1"));
  EXPECT_FALSE(read(v, "/sys/class/infiniband/srdma0/ports"));  // a directory
  EXPECT_FALSE(read(v, "relative/path"));
}

TEST(SysfsTree, VirtualPrefixesAreWholePathComponents) {
  EXPECT_TRUE(in_tree("/sys/class/infiniband"));
  EXPECT_TRUE(in_tree("/sys/class/infiniband/srdma0/node_guid"));
  EXPECT_TRUE(in_tree("/sys/class/infiniband_verbs/uverbs0"));
  EXPECT_TRUE(in_tree("/dev/infiniband/uverbs0"));
  EXPECT_FALSE(in_tree("/sys/class/infiniband_mad"));
  EXPECT_FALSE(in_tree("/sys/class/net/lo"));
  EXPECT_FALSE(in_tree("/dev/infinibandx"));
  EXPECT_FALSE(in_tree("sys/class/infiniband"));
  EXPECT_FALSE(in_tree(nullptr));
}

TEST(SysfsTree, LoopbackAddressesBelongToTheLoopbackInterface) {
  EXPECT_EQ(interface_for(kIp), "lo");
  EXPECT_EQ(interface_for((127u << 24) | 1), "lo");
}

TEST(SysfsTree, MaterializedTreeIsOrdinaryFilesDirectoriesAndLinks) {
  char tmpl[] = "/tmp/softrdma-sysfs-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = std::string(tmpl) + "/t";
  const DeviceView v{kIp, "lo"};
  ASSERT_EQ(materialize(root, build(v)), 0);
  EXPECT_EQ(slurp(root + "/sys/class/infiniband/srdma0/node_guid"), "0200:7fff:fe00:3e01\n");
  struct stat st;
  ASSERT_EQ(::stat((root + "/dev/infiniband/uverbs0").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));  // /dev/null stands in
  ASSERT_EQ(::stat((root + "/sys/class/infiniband/srdma0/device/net/lo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));  // the real /sys/class/net/lo
  char real[PATH_MAX];
  ASSERT_NE(::realpath((root + "/sys/class/infiniband_verbs/uverbs0/device").c_str(), real),
            nullptr);
  EXPECT_EQ(std::string(real), root + "/sys/class/infiniband/srdma0/device");
  // Writing it again over itself is harmless.
  EXPECT_EQ(materialize(root, build(v)), 0);
  EXPECT_EQ(std::system(("rm -rf " + std::string(tmpl)).c_str()), 0);
}

TEST(SysfsTree, OneDeviceTreeIsTheTreeBeforeSeveralDevices) {
  const DeviceView v{kIp, "lo"};
  // The one-address tree, entry for entry, as it was when it could describe only srdma0
  // (60 entries; the fingerprint was taken from that build). A change here changes what every
  // one-device program sees: regenerate the numbers only for an intended change of the tree.
  const std::vector<Entry> one = build(v);
  EXPECT_EQ(one.size(), 60u);
  EXPECT_EQ(fingerprint(one), 0x878fde39139d5d09ull);
  EXPECT_EQ(fingerprint(build(std::vector<DeviceView>{v})), fingerprint(one));
  EXPECT_FALSE(read(v, "/sys/class/infiniband/srdma1/node_guid"));
  EXPECT_FALSE(read(v, "/sys/class/infiniband_verbs/uverbs1/dev"));
}

TEST(SysfsTree, TwoDevicesEachHaveTheirOwnFiles) {
  const std::vector<DeviceView> two{{kIp, "lo"}, {kIpB, "lo"}};
  const std::string ib = "/sys/class/infiniband/";
  const std::string uv = "/sys/class/infiniband_verbs/";
  // srdma0 describes the first address, srdma1 the second (verbs/device.cpp's list).
  EXPECT_EQ(read(two, ib + "srdma0/node_guid"), "0200:7fff:fe00:3e01\n");
  EXPECT_EQ(read(two, ib + "srdma1/node_guid"), "0200:7fff:fe00:5507\n");
  EXPECT_EQ(read(two, ib + "srdma1/sys_image_guid"), "0200:7fff:fe00:5507\n");
  EXPECT_EQ(read(two, ib + "srdma0/ports/1/gids/0"), "0000:0000:0000:0000:0000:ffff:7f00:3e01\n");
  EXPECT_EQ(read(two, ib + "srdma1/ports/1/gids/0"), "0000:0000:0000:0000:0000:ffff:7f00:5507\n");
  EXPECT_EQ(read(two, ib + "srdma1/ports/1/gids/15"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
  EXPECT_EQ(read(two, ib + "srdma1/ports/1/gid_attrs/types/0"), "RoCE v2\n");
  EXPECT_EQ(read(two, ib + "srdma1/ports/1/gid_attrs/ndevs/0"), "lo\n");
  EXPECT_EQ(read(two, ib + "srdma1/ports/1/state"), "4: ACTIVE\n");
  EXPECT_EQ(read(two, ib + "srdma0/node_desc"), "softrdma srdma0\n");
  EXPECT_EQ(read(two, ib + "srdma1/node_desc"), "softrdma srdma1\n");
  // One uverbs device each, numbered as ib_uverbs numbers them: 231:192, 231:193.
  EXPECT_EQ(read(two, uv + "abi_version"), "6\n");
  EXPECT_EQ(read(two, uv + "uverbs0/ibdev"), "srdma0\n");
  EXPECT_EQ(read(two, uv + "uverbs1/ibdev"), "srdma1\n");
  EXPECT_EQ(read(two, uv + "uverbs0/dev"), "231:192\n");
  EXPECT_EQ(read(two, uv + "uverbs1/dev"), "231:193\n");
  EXPECT_EQ(read(two, uv + "uverbs1/abi_version"), "1\n");
  EXPECT_FALSE(read(two, ib + "srdma2/node_guid"));
  EXPECT_FALSE(read(two, uv + "uverbs2/ibdev"));
  // Each path once; the links point at the device's own directory.
  const std::vector<Entry> e = build(two);
  std::set<std::string> paths;
  for (const Entry& x : e) EXPECT_TRUE(paths.insert(x.path).second) << x.path;
  auto target = [&](const std::string& p) {
    for (const Entry& x : e)
      if (x.path == p && x.kind == Entry::Kind::kSymlink) return x.content;
    return std::string("(none)");
  };
  EXPECT_EQ(target("sys/class/infiniband_verbs/uverbs1/device"), "../../infiniband/srdma1/device");
  EXPECT_EQ(target("dev/infiniband/uverbs1"), "/dev/null");
  EXPECT_EQ(target("sys/class/infiniband/srdma1/device/net/lo"), "/sys/class/net/lo");
  // srdma0 of a two-device tree is the one-device tree of the first address: the same
  // entries, in the same order, once srdma1's and uverbs1's are left out.
  std::vector<Entry> first;
  for (const Entry& x : e)
    if (x.path.find("srdma1") == std::string::npos && x.path.find("uverbs1") == std::string::npos)
      first.push_back(x);
  EXPECT_EQ(fingerprint(first), fingerprint(build(two[0])));
}

TEST(SysfsTree, DeviceNamesMinorsAndUverbsPaths) {
  EXPECT_EQ(ibdev_name(0), "srdma0");
  EXPECT_EQ(ibdev_name(12), "srdma12");
  EXPECT_EQ(uverbs_name(1), "uverbs1");
  EXPECT_EQ(uverbs_minor(0), 192u);
  EXPECT_EQ(uverbs_minor(3), 195u);
  EXPECT_EQ(uverbs_index("/dev/infiniband/uverbs0"), 0);
  EXPECT_EQ(uverbs_index("/dev/infiniband/uverbs17"), 17);
  EXPECT_EQ(uverbs_index("/dev/infiniband/uverbs"), -1);
  EXPECT_EQ(uverbs_index("/dev/infiniband/uverbs1x"), -1);
  EXPECT_EQ(uverbs_index("/dev/infiniband/rdma_cm"), -1);
  EXPECT_EQ(uverbs_index(nullptr), -1);
  // One view per address, in order, at most kMaxDevices.
  const std::vector<DeviceView> v = views_for({kIp, kIpB});
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].ip, kIp);
  EXPECT_EQ(v[1].ip, kIpB);
  EXPECT_EQ(v[1].ifname, "lo");
  EXPECT_EQ(views_for(std::vector<uint32_t>(kMaxDevices + 3, kIp)).size(), kMaxDevices);
}

TEST(SysfsTree, EachPortsRateFollowsTheEmulatedLinksLeavingItsAddress) {
  EXPECT_EQ(read(DeviceView{kIp, "lo"}, "/sys/class/infiniband/srdma0/ports/1/rate"),
            "100 Gb/sec (4X EDR)\n");
  net::WanTopology wan;
  std::string err;
  ASSERT_TRUE(
      net::parse_wan_topology("site a 127.0.62.1\nsite b 127.0.85.7\n"
                              "link a b delay=10ms rate=10gbit\n"
                              "link b a delay=10ms rate=400gbit\n",
                              wan, err))
      << err;
  const std::vector<DeviceView> v = views_for({kIp, kIpB}, wan);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].port, (link_rate::PortSpeed{4, 1}));    // 1X QDR
  EXPECT_EQ(v[1].port, (link_rate::PortSpeed{128, 2}));  // 4X NDR
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma0/ports/1/rate"), "10 Gb/sec (1X QDR)\n");
  EXPECT_EQ(read(v, "/sys/class/infiniband/srdma1/ports/1/rate"), "400 Gb/sec (4X NDR)\n");
  // No links, or links without a rate: the default port.
  EXPECT_EQ(views_for({kIp})[0].port, link_rate::kDefaultPortSpeed);
  ASSERT_TRUE(net::parse_wan_topology("delay=10ms", wan, err)) << err;
  EXPECT_EQ(views_for({kIp}, wan)[0].port, link_rate::kDefaultPortSpeed);
}

TEST(SysfsTree, MaterializedTwoDeviceTree) {
  char tmpl[] = "/tmp/softrdma-sysfs-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = std::string(tmpl) + "/t";
  ASSERT_EQ(materialize(root, build(std::vector<DeviceView>{{kIp, "lo"}, {kIpB, "lo"}})), 0);
  EXPECT_EQ(slurp(root + "/sys/class/infiniband/srdma1/node_guid"), "0200:7fff:fe00:5507\n");
  EXPECT_EQ(slurp(root + "/sys/class/infiniband_verbs/uverbs1/dev"), "231:193\n");
  char real[PATH_MAX];
  ASSERT_NE(::realpath((root + "/sys/class/infiniband_verbs/uverbs1/device").c_str(), real),
            nullptr);
  EXPECT_EQ(std::string(real), root + "/sys/class/infiniband/srdma1/device");
  struct stat st;
  ASSERT_EQ(::stat((root + "/dev/infiniband/uverbs1").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(std::system(("rm -rf " + std::string(tmpl)).c_str()), 0);
}

}  // namespace
}  // namespace softrdma::verbs::sysfs
