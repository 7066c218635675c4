#ifndef TANDEM_ENGINE_TEXT_CHAT_FORMAT_H_
#define TANDEM_ENGINE_TEXT_CHAT_FORMAT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::engine::text {

// One message of a conversation, as in a chat dataset's "messages" list.
struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool".
  std::string content;
  // An assistant's reasoning; when unset, a "<think>...</think>" prefix of content is.
  std::optional<std::string> reasoning_content;
};

struct ChatOptions {
  // End with the assistant's header, so that the model writes the reply.
  bool add_generation_prompt = true;
  // false: the header is followed by an empty think block (Qwen3's non-thinking mode).
  std::optional<bool> enable_thinking;
};

// The conversation as Qwen3's chat template (tokenizer_config.json) renders it: ChatML turns
// "<|im_start|>ROLE\n...<|im_end|>\n", a leading system message first, consecutive tool
// results in one user turn, and reasoning kept only for assistant turns after the last user
// query. Tool definitions and tool calls are not supported. INVALID_ARGUMENT for an empty
// conversation or a role outside the four, naming the message.
absl::StatusOr<std::string> RenderQwen3Chat(const std::vector<ChatMessage>& messages,
                                            const ChatOptions& options);

}  // namespace tandem::engine::text

#endif  // TANDEM_ENGINE_TEXT_CHAT_FORMAT_H_
