#include "engine/text/chat_format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine::text {
namespace {

TEST(ChatFormatTest, AUserTurnThenTheAssistantsHeader) {
  auto text = RenderQwen3Chat({{"user", "2+2?"}}, {.add_generation_prompt = true});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatFormatTest, NonThinkingModeAddsAnEmptyThinkBlock) {
  auto text = RenderQwen3Chat({{"user", "hi"}}, {.enable_thinking = false});
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, testing::EndsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

TEST(ChatFormatTest, EmptyConversationsAndUnknownRolesAreRefused) {
  EXPECT_EQ(RenderQwen3Chat({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  auto unknown = RenderQwen3Chat({{"user", "a"}, {"narrator", "b"}}, {});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), testing::HasSubstr("message 1 has role 'narrator'"));
}

}  // namespace
}  // namespace tandem::engine::text
