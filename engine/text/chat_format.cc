#include "engine/text/chat_format.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace tandem::engine::text {
namespace {

constexpr absl::string_view kThinkOpen = "<think>";
constexpr absl::string_view kThinkClose = "</think>";

absl::string_view StripLeadingNewlines(absl::string_view text) {
  while (absl::ConsumePrefix(&text, "\n")) {
  }
  return text;
}

absl::string_view StripTrailingNewlines(absl::string_view text) {
  while (absl::ConsumeSuffix(&text, "\n")) {
  }
  return text;
}

bool IsToolResponse(absl::string_view content) {
  return absl::StartsWith(content, "<tool_response>") &&
         absl::EndsWith(content, "</tool_response>");
}

// The last user message that is not a tool response: reasoning of assistant turns after it
// is kept, earlier reasoning is dropped.
int LastQueryIndex(const std::vector<ChatMessage>& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    if (messages[i].role == "user" && !IsToolResponse(messages[i].content)) return i;
  }
  return static_cast<int>(messages.size()) - 1;
}

struct AssistantTurn {
  absl::string_view content;
  absl::string_view reasoning;
};

// The template's split of "<think>R</think>C" (when reasoning_content is unset).
AssistantTurn SplitReasoning(const ChatMessage& message) {
  if (message.reasoning_content) return {message.content, *message.reasoning_content};
  absl::string_view content = message.content;
  const size_t first_close = content.find(kThinkClose);
  if (first_close == absl::string_view::npos) return {content, ""};
  const size_t last_close = content.rfind(kThinkClose);
  absl::string_view reasoning = StripTrailingNewlines(content.substr(0, first_close));
  if (const size_t open = reasoning.rfind(kThinkOpen); open != absl::string_view::npos) {
    reasoning.remove_prefix(open + kThinkOpen.size());
  }
  return {StripLeadingNewlines(content.substr(last_close + kThinkClose.size())),
          StripLeadingNewlines(reasoning)};
}

void AppendAssistant(const ChatMessage& message, bool after_last_query, bool last,
                     std::string& out) {
  const AssistantTurn turn = SplitReasoning(message);
  if (after_last_query && (last || !turn.reasoning.empty())) {
    absl::StrAppend(&out, "<|im_start|>assistant\n<think>\n",
                    StripTrailingNewlines(StripLeadingNewlines(turn.reasoning)), "\n</think>\n\n",
                    StripLeadingNewlines(turn.content));
  } else {
    absl::StrAppend(&out, "<|im_start|>assistant\n", turn.content);
  }
  absl::StrAppend(&out, "<|im_end|>\n");
}

}  // namespace

absl::StatusOr<std::string> RenderQwen3Chat(const std::vector<ChatMessage>& messages,
                                            const ChatOptions& options) {
  if (messages.empty()) return absl::InvalidArgumentError("a conversation needs a message");
  const int last_query = LastQueryIndex(messages);
  const int count = static_cast<int>(messages.size());
  std::string out;
  for (int i = 0; i < count; ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "user" || message.role == "system") {
      absl::StrAppend(&out, "<|im_start|>", message.role, "\n", message.content, "<|im_end|>\n");
    } else if (message.role == "assistant") {
      AppendAssistant(message, i > last_query, i == count - 1, out);
    } else if (message.role == "tool") {  // Consecutive results share one user turn.
      if (i == 0 || messages[i - 1].role != "tool") absl::StrAppend(&out, "<|im_start|>user");
      absl::StrAppend(&out, "\n<tool_response>\n", message.content, "\n</tool_response>");
      if (i == count - 1 || messages[i + 1].role != "tool") absl::StrAppend(&out, "<|im_end|>\n");
    } else {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " has role '", message.role,
                                                     "'; known: system, user, assistant, tool"));
    }
  }
  if (options.add_generation_prompt) {
    absl::StrAppend(&out, "<|im_start|>assistant\n");
    if (options.enable_thinking == false) absl::StrAppend(&out, "<think>\n\n</think>\n\n");
  }
  return out;
}

}  // namespace tandem::engine::text
