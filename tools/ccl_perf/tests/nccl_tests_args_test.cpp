// parse_command_line: the one place that turns nccl-tests' parse outcome into an exit status.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tools/ccl_perf/nccl_tests_args.h"

namespace softrdma::nccl_tests {
namespace {

const UsageText kText{.program = "x_perf", .datatypes = "float", .ops = "sum"};

// argv for getopt: mutable strings, argv[0] first.
struct Argv {
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (std::string& s : args) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> args;
  std::vector<char*> ptrs;
};

TEST(ParseCommandLine, GoodFlagsGoOnWithTheOptionsFilled) {
  Argv a({"x_perf", "-b", "8", "-e", "1M", "-n", "3"});
  Options o;
  EXPECT_EQ(parse_command_line(a.argc(), a.argv(), o, kText), std::nullopt);
  EXPECT_EQ(o.min_bytes, 8u);
  EXPECT_EQ(o.max_bytes, 1u << 20);
  EXPECT_EQ(o.iters, 3);
}

TEST(ParseCommandLine, HelpPrintsTheUsageAndExitsZero) {
  Argv a({"x_perf", "-h"});
  Options o;
  testing::internal::CaptureStdout();
  EXPECT_EQ(parse_command_line(a.argc(), a.argv(), o, kText), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("USAGE: x_perf"), std::string::npos) << out;
}

TEST(ParseCommandLine, ABadValueIsNamedOnStderrAndExitsTwo) {
  Argv a({"x_perf", "-b", "12q"});
  Options o;
  testing::internal::CaptureStderr();
  EXPECT_EQ(parse_command_line(a.argc(), a.argv(), o, kText), 2);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("invalid size for minbytes: 12q (see -h)"), std::string::npos) << err;
}

TEST(ParseCommandLine, RanksThatDoNotPrintGetTheSameStatusAndPrintNothing) {
  Argv help({"x_perf", "-h"}), bad({"x_perf", "-b", "2M", "-e", "1M"});
  Options o;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(parse_command_line(help.argc(), help.argv(), o, kText, false), 0);
  EXPECT_EQ(parse_command_line(bad.argc(), bad.argv(), o, kText, false), 2);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(ParseCommandLine, AProgramsOwnLongOptionsReachIt) {
  std::string rank;
  const ExtraOption extra[] = {{"rank", &rank}};
  Argv a({"x_perf", "--rank", "3"});
  Options o;
  EXPECT_EQ(parse_command_line(a.argc(), a.argv(), o, kText, true, extra), std::nullopt);
  EXPECT_EQ(rank, "3");
}

}  // namespace
}  // namespace softrdma::nccl_tests
