#include "tools/cli/spec_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

using ::testing::HasSubstr;

TEST(ParseJobSpecTest, ReadsYamlWithTypedScalars) {
  absl::StatusOr<trainer::v1::JobSpec> spec = ParseJobSpec(
      "display_name: x\nnum_steps: 3\nsampling: {temperature: 0.5}\n"
      "algorithm: ALGORITHM_GRPO\nlora: {rank: 4}\n",
      /*yaml=*/true);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_steps(), 3);
  EXPECT_FLOAT_EQ(spec->sampling().temperature(), 0.5f);
  EXPECT_EQ(spec->algorithm(), trainer::v1::ALGORITHM_GRPO);
}

TEST(ParseJobSpecTest, ReadsJson) {
  absl::StatusOr<trainer::v1::JobSpec> spec = ParseJobSpec(R"({"numSteps": 7})", /*yaml=*/false);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_steps(), 7);
}

// The job files `./tandem demo [JOB]` runs (jobs/*.yaml, in the test's runfiles): a field
// renamed in trainer.proto fails here rather than in a demo.
TEST(ParseJobSpecTest, EveryJobFileParses) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator("jobs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    std::stringstream text;
    text << std::ifstream(entry.path()).rdbuf();
    absl::StatusOr<trainer::v1::JobSpec> spec = ParseJobSpec(text.str(), /*yaml=*/true);
    ASSERT_TRUE(spec.ok()) << entry.path() << ": " << spec.status();
    EXPECT_GT(spec->num_steps(), 0) << entry.path();
    EXPECT_FALSE(spec->base_model_path().empty()) << entry.path();
  }
  EXPECT_GE(files, 2) << "jobs/demo.yaml and jobs/addition2.yaml";
}

// Found by spec_file_fuzz: YAML passed the bytes through and the JSON writer threw, ending the
// CLI with std::terminate.
TEST(ParseJobSpecTest, InvalidUtf8IsInvalidArgument) {
  for (bool yaml : {true, false}) {
    absl::StatusOr<trainer::v1::JobSpec> spec = ParseJobSpec("display_name: \"a\xff\"\n", yaml);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr("UTF-8"));
  }
  // Valid UTF-8 that yaml-cpp reads as UTF-32 (leading NULs) and decodes into invalid bytes.
  constexpr char kUtf32Lookalike[] = "\0\0\0\0\0\0\0efault j\x0f\0\0\0\0\0\0\0tion\nd@";
  absl::StatusOr<trainer::v1::JobSpec> decoded =
      ParseJobSpec(std::string(kUtf32Lookalike, sizeof(kUtf32Lookalike) - 1), /*yaml=*/true);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decoded.status().message(), HasSubstr("UTF-8"));
}

TEST(ParseJobSpecTest, BadSyntaxAndUnknownFieldsAreInvalidArgument) {
  EXPECT_EQ(ParseJobSpec("a: [1, 2", true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseJobSpec("{\"num_steps\": ", false).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<trainer::v1::JobSpec> unknown = ParseJobSpec("num_stepz: 3\n", true);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("num_stepz"));
}

}  // namespace
}  // namespace tandem::cli
