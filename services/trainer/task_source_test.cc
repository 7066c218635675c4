#include "services/trainer/task_source.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

using ::testing::HasSubstr;

std::string WriteDataset(const std::string& name, const std::string& contents) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

v1::JobSpec DatasetSpec(const std::string& path, const std::string& verifier) {
  v1::JobSpec spec;
  spec.mutable_dataset()->set_path(path);
  spec.mutable_dataset()->set_prompt_field("question");
  spec.mutable_dataset()->set_answer_field("answer");
  spec.mutable_dataset()->set_verifier(verifier);
  return spec;
}

// Two rows in GSM8K's layout: the answer field is a whole solution ending in "#### n".
constexpr char kGsm8kRows[] =
    R"({"question": "Natalia sold 48 clips in April and half as many in May. How many in all?", )"
    R"("answer": "In May she sold 48/2 = 24.\nIn all 48+24 = 72.\n#### 72"})"
    "\n"
    R"({"question": "What is 1000 + 80?", "answer": "#### 1,080"})"
    "\n";

TEST(TaskSourceTest, AMathDatasetScoresTheFinalAnswerByValue) {
  auto task = MakeJobTask(DatasetSpec(WriteDataset("gsm8k.jsonl", kGsm8kRows), "math"));
  ASSERT_TRUE(task.ok()) << task.status();
  const std::string natalia =
      "Natalia sold 48 clips in April and half as many in May. How many in all?";
  EXPECT_EQ((*task)->Reward(natalia, "48 + 24 = \\boxed{72}<eos>ignored"), 1.0);
  EXPECT_EQ((*task)->Reward(natalia, "#### 72.0<eos>"), 1.0);
  EXPECT_EQ((*task)->Reward(natalia, "\\boxed{71}<eos>"), 0.0);
  EXPECT_EQ((*task)->Reward("What is 1000 + 80?", "\\boxed{1080}"), 1.0);
  EXPECT_EQ((*task)->Reward("a prompt not in the dataset", "\\boxed{72}"), 0.0);
}

TEST(TaskSourceTest, AnExactMatchDatasetComparesTheWholeCompletion) {
  auto task =
      MakeJobTask(DatasetSpec(WriteDataset("exact.jsonl", R"({"question": "2+2=", "answer": "4"})"
                                                          "\n"),
                              "exact_match"));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ((*task)->Reward("2+2=", "4<eos>"), 1.0);
  EXPECT_EQ((*task)->Reward("2+2=", "\\boxed{4}<eos>"), 0.0);
}

TEST(TaskSourceTest, BadDatasetsAreRefusedWithTheReason) {
  auto unknown_verifier = MakeJobTask(DatasetSpec(WriteDataset("v.jsonl", kGsm8kRows), "fuzzy"));
  EXPECT_EQ(unknown_verifier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeJobTask(DatasetSpec("/nonexistent/data.jsonl", "math")).status().code(),
            absl::StatusCode::kNotFound);
  auto malformed = MakeJobTask(
      DatasetSpec(WriteDataset("bad.jsonl", std::string(kGsm8kRows) + R"({"question": 3})"
                                                                      "\n"),
                  "math"));
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("line 3"));
}

}  // namespace
}  // namespace tandem::trainer
