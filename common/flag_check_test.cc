#include "common/flag_check.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, check_port, 0, "A port, for the test.");
ABSL_FLAG(bool, check_switch, false, "A switch, for the test.");

namespace tandem {
namespace {

using ::testing::HasSubstr;

absl::Status Check(std::vector<std::string> args) {
  args.insert(args.begin(), "binary");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  return CheckCommandLineFlags(static_cast<int>(argv.size()), argv.data());
}

TEST(CheckCommandLineFlagsTest, AcceptsWhatAbslAccepts) {
  EXPECT_TRUE(Check({}).ok());
  EXPECT_TRUE(Check({"--check_port=80"}).ok());
  EXPECT_TRUE(Check({"-check_port=80"}).ok());
  EXPECT_TRUE(Check({"--check_port", "80"}).ok());
  EXPECT_TRUE(Check({"--check_switch"}).ok());
  EXPECT_TRUE(Check({"--nocheck_switch"}).ok());
  EXPECT_TRUE(Check({"--check_switch=false"}).ok());
  EXPECT_TRUE(Check({"positional", "--", "--anything=goes"}).ok());
  EXPECT_TRUE(Check({"--help"}).ok());
  EXPECT_TRUE(Check({"--undefok=gone", "--gone=1"}).ok());
}

TEST(CheckCommandLineFlagsTest, NamesTheFlagAndValueThatDoNotParse) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--check_port=abc"}, {"--check_port", "abc"}}) {
    const absl::Status status = Check(args);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("--check_port=abc"));
  }
  EXPECT_THAT(Check({"--check_switch=maybe"}).message(), HasSubstr("--check_switch=maybe"));
  EXPECT_THAT(Check({"--nocheck_switch=true"}).message(), HasSubstr("takes no value"));
  EXPECT_THAT(Check({"--check_port"}).message(), HasSubstr("--check_port is missing its value"));
}

TEST(CheckCommandLineFlagsTest, RefusesAnUnknownFlag) {
  const absl::Status status = Check({"--check_port=1", "--no_such_flag=1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("unknown command line flag 'no_such_flag'"));
  EXPECT_THAT(Check({"--nocheck_port"}).message(), HasSubstr("'nocheck_port'"));
}

}  // namespace
}  // namespace tandem
