// chat_render: renders each conversation of a JSON file ([{messages, add_generation_prompt,
// enable_thinking}]) with RenderQwen3Chat; prints one JSON string per line. The chat format's
// reference test compares its output with Qwen3's real template rendered by @huggingface/jinja.

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/text/chat_format.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: chat_render CONVERSATIONS.json\n");
    return 2;
  }
  std::ifstream file(argv[1]);
  std::stringstream contents;
  contents << file.rdbuf();
  for (const nlohmann::json& conversation : nlohmann::json::parse(contents.str())) {
    std::vector<tandem::engine::text::ChatMessage> messages;
    for (const nlohmann::json& message : conversation["messages"]) {
      messages.push_back({message["role"], message["content"], std::nullopt});
      if (message.contains("reasoning_content")) {
        messages.back().reasoning_content = message["reasoning_content"].get<std::string>();
      }
    }
    tandem::engine::text::ChatOptions options;
    options.add_generation_prompt = conversation.value("add_generation_prompt", false);
    if (conversation.contains("enable_thinking")) {
      options.enable_thinking = conversation["enable_thinking"].get<bool>();
    }
    auto rendered = tandem::engine::text::RenderQwen3Chat(messages, options);
    if (!rendered.ok()) {
      std::fprintf(stderr, "chat_render: %s\n", rendered.status().ToString().c_str());
      return 1;
    }
    std::printf("%s\n", nlohmann::json(*rendered).dump().c_str());
  }
  return 0;
}
