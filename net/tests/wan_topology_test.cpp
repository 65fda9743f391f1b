// WanTopology: the file format of net/wan_topology.h, lookups and errors naming the line.
#include "net/wan_topology.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace softrdma::net {
namespace {

uint32_t ip(const char* s) {
  unsigned a, b, c, d;
  EXPECT_EQ(std::sscanf(s, "%u.%u.%u.%u", &a, &b, &c, &d), 4);
  return a << 24 | b << 16 | c << 8 | d;
}

TEST(WanTopology, SitesLinksAndLookups) {
  WanTopology t;
  std::string err;
  ASSERT_TRUE(parse_wan_topology(R"(# two data centres
site guizhou  127.0.0.1-127.0.0.2
site shanghai 127.0.0.3 127.0.1.0/24   # a CIDR block too
site shanghai 127.0.0.9                # more addresses for a site
site lonely   127.0.5.5
link guizhou <-> shanghai delay=7.5ms rate=10gbit
link guizhou lonely delay=1ms loss=1%
)",
                                 t, err))
      << err;
  ASSERT_EQ(t.sites.size(), 3u);
  EXPECT_EQ(t.site_of(ip("127.0.0.2")), 0);
  EXPECT_EQ(t.site_of(ip("127.0.1.77")), 1);
  EXPECT_EQ(t.site_of(ip("127.0.0.9")), 1);
  EXPECT_EQ(t.site_of(ip("127.0.0.4")), -1);
  ASSERT_EQ(t.links.size(), 3u);
  const auto* gs = t.link_for(ip("127.0.0.1"), ip("127.0.0.3"));
  const auto* sg = t.link_for(ip("127.0.1.1"), ip("127.0.0.2"));
  ASSERT_NE(gs, nullptr);
  ASSERT_NE(sg, nullptr);
  EXPECT_NE(gs, sg) << "each direction is a link of its own";
  EXPECT_EQ(gs->params.delay_ns, 7'500'000u);
  EXPECT_EQ(sg->params.rate_bps, 10'000'000'000u);
  EXPECT_EQ(t.link_for(ip("127.0.0.1"), ip("127.0.0.2")), nullptr) << "inside a site";
  EXPECT_EQ(t.link_for(ip("127.0.0.1"), ip("127.0.0.4")), nullptr) << "no site";
  const auto* gl = t.link_for(ip("127.0.0.1"), ip("127.0.5.5"));
  ASSERT_NE(gl, nullptr);
  EXPECT_DOUBLE_EQ(gl->params.loss, 0.01);
  EXPECT_EQ(t.link_for(ip("127.0.5.5"), ip("127.0.0.1")), nullptr) << "one direction only";
  EXPECT_EQ(t.index_of(gl), 2u);
}

TEST(WanTopology, OneLineFormShapesEveryPairOfAddresses) {
  WanTopology t;
  std::string err;
  ASSERT_TRUE(parse_wan_topology("delay=10ms,loss=0.1%", t, err)) << err;
  const auto* l = t.link_for(ip("127.0.0.1"), ip("127.0.0.2"));
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->params.delay_ns, 10'000'000u);
  EXPECT_EQ(t.link_for(ip("127.0.0.2"), ip("127.0.0.1")), l);
  EXPECT_EQ(t.link_for(ip("127.0.0.2"), ip("127.0.0.2")), nullptr);
}

TEST(WanTopology, ErrorsNameTheLine) {
  struct Bad {
    const char* text;
    const char* expect;
  };
  for (const Bad& b : {
           Bad{"site a 127.0.0.1\nlink a b delay=1ms", "line 2: unknown site 'b'"},
           Bad{"site a 127.0.0.1\nsite b 127.0.0.1", "line 2: address '127.0.0.1' already in"},
           Bad{"site a 127.0.0.300", "line 1: bad address"},
           Bad{"site a 127.0.0.1/33", "line 1: bad address"},
           Bad{"site a 127.0.0.5-127.0.0.1", "line 1: bad address"},
           Bad{"site a", "line 1: site a lists no address"},
           Bad{"site a 127.0.0.1\nsite b 127.0.0.2\nlink a b delay=x", "line 3: bad value"},
           Bad{"site a 127.0.0.1\nsite b 127.0.0.2\nlink a b\nlink a <-> b", "line 4: link a"},
           Bad{"site a 127.0.0.1\nlink a a delay=1ms", "line 2: a link joins two different"},
           Bad{"site a 127.0.0.1\nroute a", "line 2: unknown statement 'route'"},
           Bad{"delay=1ms\nsite a 127.0.0.1", "parameters outside a link"},
       }) {
    WanTopology t;
    t.sites.push_back({"keep", {}});
    std::string err;
    EXPECT_FALSE(parse_wan_topology(b.text, t, err)) << b.text;
    EXPECT_NE(err.find(b.expect), std::string::npos) << b.text << " -> " << err;
    EXPECT_EQ(t.sites.size(), 1u) << "a failed parse leaves the output alone";
  }
}

TEST(WanTopology, LoadsAFile) {
  const std::string path = ::testing::TempDir() + "wan_topology_test.txt";
  {
    std::ofstream f(path);
    f << "site a 127.0.0.1\nsite b 127.0.0.2\nlink a <-> b delay=20ms\n";
  }
  WanTopology t;
  std::string err;
  ASSERT_TRUE(load_wan_topology(path, t, err)) << err;
  EXPECT_EQ(t.links.size(), 2u);
  std::remove(path.c_str());
  EXPECT_FALSE(load_wan_topology(path, t, err));
  EXPECT_NE(err.find("cannot read"), std::string::npos) << err;
}

TEST(WanTopology, ASpecIsAFileWhenOneHasThatNameElseOneLineOfParameters) {
  const std::string path = ::testing::TempDir() + "wan_spec_test.txt";
  {
    std::ofstream f(path);
    f << "site a 127.0.0.1\nsite b 127.0.0.2\nlink a b delay=20ms\n";
  }
  WanTopology t;
  std::string text, err;
  ASSERT_TRUE(read_wan_spec(path, t, text, err)) << err;
  EXPECT_EQ(t.links.size(), 1u);
  EXPECT_EQ(t.sites.size(), 2u);
  EXPECT_EQ(text.rfind("site a", 0), 0u) << "the file's contents: " << text;
  std::remove(path.c_str());
  ASSERT_TRUE(read_wan_spec("delay=5ms,rate=10gbit", t, text, err)) << err;
  EXPECT_EQ(text, "delay=5ms,rate=10gbit");
  ASSERT_EQ(t.links.size(), 1u);
  EXPECT_EQ(t.links[0].from, -1);
  // A directory is not a topology file: its name is read as parameters (and refused).
  EXPECT_FALSE(read_wan_spec(::testing::TempDir(), t, text, err));
  EXPECT_NE(err.find("expected key=value"), std::string::npos) << err;
}

TEST(WanTopology, EgressRateIsTheFastestRateLimitedLinkLeavingTheAddress) {
  WanTopology t;
  std::string err;
  ASSERT_TRUE(parse_wan_topology("delay=5ms,rate=10gbit", t, err)) << err;
  EXPECT_EQ(t.egress_rate_bps(ip("127.0.0.9")), 10'000'000'000u) << "the one-line form";
  ASSERT_TRUE(parse_wan_topology("delay=5ms", t, err)) << err;
  EXPECT_EQ(t.egress_rate_bps(ip("127.0.0.9")), 0u) << "no rate: unlimited";
  ASSERT_TRUE(
      parse_wan_topology("site a 127.0.0.1-127.0.0.2\n"
                         "site b 127.0.0.3\n"
                         "site c 127.0.0.4\n"
                         "site d 127.0.0.5\n"
                         "link a b rate=10gbit\n"
                         "link a c rate=400gbit\n"
                         "link b a rate=1gbit\n"
                         "link c <-> d delay=1ms\n",
                         t, err))
      << err;
  EXPECT_EQ(t.egress_rate_bps(ip("127.0.0.2")), 400'000'000'000u) << "a's fastest link out";
  EXPECT_EQ(t.egress_rate_bps(ip("127.0.0.3")), 1'000'000'000u) << "b → a only";
  EXPECT_EQ(t.egress_rate_bps(ip("127.0.0.4")), 0u) << "c → d has no rate";
  EXPECT_EQ(t.egress_rate_bps(ip("127.0.0.9")), 0u) << "in no site";
}

}  // namespace
}  // namespace softrdma::net
