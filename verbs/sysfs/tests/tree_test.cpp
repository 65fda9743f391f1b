// The virtual sysfs tree: the values of srdma0's files for a device address, the lookup
// ibv_read_sysfs_file uses, the virtual prefixes, and the tree written to a directory.
#include "verbs/sysfs/tree.h"

#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace softrdma::verbs::sysfs {
namespace {

constexpr uint32_t kIp = (127u << 24) | (0 << 16) | (62 << 8) | 1;  // 127.0.62.1

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

}  // namespace
}  // namespace softrdma::verbs::sysfs
