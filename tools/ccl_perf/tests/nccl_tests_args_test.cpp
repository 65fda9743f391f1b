// parse_command_line: the one place that turns nccl-tests' parse outcome into an exit status.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "tools/ccl_perf/nccl_tests_args.h"

namespace softrdma::nccl_tests {
namespace {

const UsageText kText{.program = "x_perf", .datatypes = "float", .ops = "sum"};

/// parse_command_line's status, options and what it printed on stdout and stderr.
struct Outcome {
  std::optional<int> status;
  Options options;
  std::string out, err;
};

Outcome parse(std::vector<std::string> args, bool print = true,
              std::span<const ExtraOption> extra = {}) {
  args.insert(args.begin(), "x_perf");
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  Outcome o;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  o.status = parse_command_line(static_cast<int>(argv.size()), argv.data(), o.options, kText, print,
                                extra);
  o.out = testing::internal::GetCapturedStdout();
  o.err = testing::internal::GetCapturedStderr();
  return o;
}

TEST(ParseCommandLine, GoodFlagsGoOnWithTheOptionsFilled) {
  const Outcome o = parse({"-b", "8", "-e", "1M", "-n", "3"});
  EXPECT_EQ(o.status, std::nullopt);
  EXPECT_EQ(o.options.min_bytes, 8u);
  EXPECT_EQ(o.options.max_bytes, 1u << 20);
  EXPECT_EQ(o.options.iters, 3);
  EXPECT_EQ(o.out + o.err, "");
}

TEST(ParseCommandLine, HelpPrintsTheUsageAndExitsZero) {
  const Outcome o = parse({"-h"});
  EXPECT_EQ(o.status, 0);
  EXPECT_NE(o.out.find("USAGE: x_perf"), std::string::npos) << o.out;
}

TEST(ParseCommandLine, ABadValueIsNamedOnStderrAndExitsTwo) {
  const Outcome o = parse({"-b", "12q"});
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(o.err.find("invalid size for minbytes: 12q (see -h)"), std::string::npos) << o.err;
}

TEST(ParseCommandLine, RanksThatDoNotPrintGetTheSameStatusAndPrintNothing) {
  const Outcome help = parse({"-h"}, false), bad = parse({"-b", "2M", "-e", "1M"}, false);
  EXPECT_EQ(help.status, 0);
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(help.out + help.err + bad.out + bad.err, "");
}

TEST(ParseCommandLine, AProgramsOwnLongOptionsReachIt) {
  std::string rank;
  const ExtraOption extra[] = {{"rank", &rank}};
  EXPECT_EQ(parse({"--rank", "3"}, true, extra).status, std::nullopt);
  EXPECT_EQ(rank, "3");
}

}  // namespace
}  // namespace softrdma::nccl_tests
