// The parameter registry: reading each kind, the messages of malformed values, and the
// table's own consistency.
#include "base/params.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

namespace softrdma::params {
namespace {

/// Sets one variable (or unsets it, value == nullptr) for a scope and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const Param& p, const char* value) : name_(p.name) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old, had_ = true;
    if (value)
      setenv(name_.c_str(), value, 1);
    else
      unsetenv(name_.c_str());
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

TEST(Registry, NamesAreUniqueAndEveryRowIsComplete) {
  std::set<std::string_view> names;
  for (const Param& p : all()) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name << " registered twice";
    EXPECT_EQ(0u, p.name.rfind("SOFTRDMA_", 0)) << p.name;
    EXPECT_FALSE(p.doc.empty()) << p.name;
    EXPECT_FALSE(p.default_text.empty()) << p.name;
    EXPECT_FALSE(accepted(p).empty()) << p.name;
    if (p.kind == Kind::kInteger || p.kind == Kind::kSize) {
      EXPECT_LE(p.min, p.max) << p.name;
      EXPECT_LE(p.min, p.default_value) << p.name;
      EXPECT_GE(p.max, p.default_value) << p.name;
    }
  }
}

TEST(Registry, UnsetOrEmptyLeavesTheCallersValue) {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    ScopedEnv e(kSpinUs, value);
    int64_t us = 77;
    std::string error;
    EXPECT_TRUE(read_integer(kSpinUs, us, error));
    EXPECT_EQ(77, us);
    EXPECT_EQ(20, integer(kSpinUs)) << "the registered default";
  }
}

TEST(Registry, IntegerInRangeIsRead) {
  ScopedEnv e(kSpinUs, "1000000");
  int64_t us = 0;
  std::string error;
  ASSERT_TRUE(read_integer(kSpinUs, us, error)) << error;
  EXPECT_EQ(1'000'000, us);
}

TEST(Registry, MalformedIntegerNamesVariableValueAndRange) {
  for (const char* bad : {"-5", "1000001", "20us", " 5", "+5", "x", "99999999999999999999"}) {
    ScopedEnv e(kSpinUs, bad);
    int64_t us = 7;
    std::string error;
    EXPECT_FALSE(read_integer(kSpinUs, us, error)) << bad;
    EXPECT_EQ(7, us) << "left unchanged";
    EXPECT_EQ(
        "SOFTRDMA_SPIN_US: expected an integer in 0..1000000 µs, got '" + std::string(bad) + "'",
        error);
    EXPECT_THROW(integer(kSpinUs), std::invalid_argument);
  }
}

TEST(Registry, FlagTakesOneOnZeroOff) {
  for (auto [value, want] : {std::pair{"1", true}, {"on", true}, {"0", false}, {"off", false}}) {
    ScopedEnv e(kGso, value);
    bool on = !want;
    std::string error;
    ASSERT_TRUE(read_flag(kGso, on, error)) << value;
    EXPECT_EQ(want, on) << value;
  }
  ScopedEnv e(kGso, "maybe");
  bool on = true;
  std::string error;
  EXPECT_FALSE(read_flag(kGso, on, error));
  EXPECT_EQ("SOFTRDMA_GSO: expected 1/on or 0/off, got 'maybe'", error);
}

// flag(): read_flag over the caller's default, throwing the same message.
TEST(Registry, FlagThrowsOnAMalformedValueAndKeepsTheDefaultWhenUnset) {
  {
    ScopedEnv e(kCclDepthFromPath, nullptr);
    EXPECT_TRUE(flag(kCclDepthFromPath, true));
    EXPECT_FALSE(flag(kCclDepthFromPath, false));
  }
  {
    ScopedEnv e(kCclDepthFromPath, "0");
    EXPECT_FALSE(flag(kCclDepthFromPath, true));
  }
  ScopedEnv e(kKvMaxWrFromPath, "maybe");
  try {
    flag(kKvMaxWrFromPath, true);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& x) {
    EXPECT_EQ(std::string("SOFTRDMA_KV_MAX_WR_FROM_PATH: expected 1/on or 0/off, got 'maybe'"),
              x.what());
  }
}

TEST(Registry, ChoiceIsOneOfTheListedValues) {
  {
    ScopedEnv e(kTransport, "shm");
    EXPECT_EQ("shm", text(kTransport));
  }
  {
    ScopedEnv e(kTransport, nullptr);
    EXPECT_EQ("auto", text(kTransport)) << "the registered default";
  }
  for (const char* bad : {"tcp", "UDP", "udp "}) {
    ScopedEnv e(kTransport, bad);
    std::string path = "auto", error;
    EXPECT_FALSE(read_text(kTransport, path, error)) << bad;
    EXPECT_EQ("SOFTRDMA_TRANSPORT: expected one of auto, udp, shm, got '" + std::string(bad) + "'",
              error);
  }
}

TEST(Registry, ChoiceMayIgnoreCase) {
  ScopedEnv e(kCclAlgo, "RD");
  EXPECT_EQ("rd", text(kCclAlgo));
}

TEST(Registry, Ipv4RefusesZeroAndNonAddresses) {
  {
    ScopedEnv e(kAddr, "127.0.0.9");
    uint32_t ip = 0;
    std::string error;
    ASSERT_TRUE(read_ipv4(kAddr, ip, error)) << error;
    EXPECT_EQ((127u << 24) | 9, ip);
  }
  for (const char* bad : {"0.0.0.0", "300.1.2.3", "not-an-ip"}) {
    ScopedEnv e(kAddr, bad);
    uint32_t ip = 5;
    std::string error;
    EXPECT_FALSE(read_ipv4(kAddr, ip, error)) << bad;
    EXPECT_EQ(5u, ip);
    EXPECT_NE(std::string::npos, error.find("SOFTRDMA_ADDR: expected an IPv4 address")) << error;
    EXPECT_NE(std::string::npos, error.find(bad)) << error;
  }
}

TEST(Registry, Ipv4ListGivesEveryAddressInOrderAndRefusesABadEntry) {
  {
    ScopedEnv e(kAddr, "127.0.40.1,127.0.40.2");
    std::vector<uint32_t> ips;
    uint32_t first = 0;
    std::string error;
    ASSERT_TRUE(read_ipv4_list(kAddr, ips, error)) << error;
    EXPECT_EQ((std::vector<uint32_t>{(127u << 24) | (40u << 8) | 1, (127u << 24) | (40u << 8) | 2}),
              ips);
    ASSERT_TRUE(read_ipv4(kAddr, first, error)) << error;
    EXPECT_EQ(ips[0], first);
  }
  for (const char* bad : {"127.0.40.1,", ",127.0.40.1", "127.0.40.1,,127.0.40.2",
                          "127.0.40.1,0.0.0.0", "127.0.40.1, 127.0.40.2"}) {
    ScopedEnv e(kAddr, bad);
    std::vector<uint32_t> ips{7};
    uint32_t ip = 5;
    std::string error;
    EXPECT_FALSE(read_ipv4_list(kAddr, ips, error)) << bad;
    EXPECT_FALSE(read_ipv4(kAddr, ip, error)) << bad;
    EXPECT_EQ(std::vector<uint32_t>{7}, ips);
    EXPECT_EQ(5u, ip);
    EXPECT_NE(std::string::npos, error.find(bad)) << error;
  }
}

// ccl's Config::from_environment cases (ccl/tests/reduce_test.cpp), so that ccl can read its
// tunables through the registry with the same outcomes.
TEST(Registry, CclTunablesAcceptWhatCclAccepts) {
  for (auto [value, want] : {std::pair{"1m", int64_t{1} << 20}, {"4096", 4096}, {"64K", 65536}}) {
    ScopedEnv e(kCclChunkBytes, value);
    EXPECT_EQ(want, integer(kCclChunkBytes)) << value;
  }
  {
    ScopedEnv e(kCclDepth, "8");
    EXPECT_EQ(8, integer(kCclDepth));
  }
  const std::pair<const Param*, const char*> bad[] = {{&kCclAlgo, "tree"},
                                                      {&kCclChunkBytes, "0"},
                                                      {&kCclChunkBytes, "-5"},
                                                      {&kCclChunkBytes, "12q"},
                                                      {&kCclChunkBytes, "2g"},
                                                      {&kCclChunkBytes, ""},
                                                      {&kCclChunkBytes, "99999999999999999999999"},
                                                      {&kCclDepth, "0"},
                                                      {&kCclDepth, "1k"},
                                                      {&kCclDepth, "257"},
                                                      {&kCclDepth, "four"},
                                                      {&kCclDepth, ""}};
  for (auto [p, value] : bad) {
    ScopedEnv e(*p, value);
    try {
      p->kind == Kind::kChoice ? (void)text(*p) : (void)integer(*p);
      ADD_FAILURE() << p->name << "=" << value << " accepted";
    } catch (const std::invalid_argument& err) {
      EXPECT_NE(std::string::npos, std::string(err.what()).find(p->name)) << err.what();
    }
  }
}

TEST(Registry, SizeRangeIsShownInBinaryUnits) {
  EXPECT_EQ("a size in 1..1073741824 bytes (≤ 1 GiB; suffix k, m or g allowed)",
            accepted(kCclChunkBytes));
}

TEST(Listing, EveryParameterOfAGroupIsListed) {
  for (Group g : {Group::kDevice, Group::kCcl, Group::kKv, Group::kCm}) {
    const std::string table = markdown_table(g), help = help_text(g);
    for (const Param& p : all()) {
      const bool listed = table.find("`" + std::string(p.name) + "`") != std::string::npos;
      EXPECT_EQ(p.group == g, listed) << p.name << " in the " << group_name(g) << " table";
      EXPECT_EQ(p.group == g, help.find("  " + std::string(p.name) + "  ") != std::string::npos)
          << p.name;
    }
  }
}

}  // namespace
}  // namespace softrdma::params
