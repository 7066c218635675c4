// hf_tokenize: encodes each JSON-string line of a corpus with a tokenizer.json; prints one JSON
// array of ids per line, and on stderr the encoding speed over --repeat passes. The
// tokenizer's reference test compares its output with tokenizers.js.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/text/hf_tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, tokenizer, "", "Path of a tokenizer.json.");
ABSL_FLAG(std::string, corpus, "", "JSON lines, each a string to encode.");
ABSL_FLAG(int, repeat, 1, "Timed passes over the corpus.");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "hf_tokenize: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto tokenizer = tandem::engine::text::HfTokenizer::FromFile(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) return Fail(tokenizer.status().ToString());
  std::ifstream corpus(absl::GetFlag(FLAGS_corpus));
  if (!corpus) return Fail("cannot open the corpus " + absl::GetFlag(FLAGS_corpus));
  std::vector<std::string> texts;
  for (std::string line; std::getline(corpus, line);) {
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  for (const std::string& text : texts) {
    auto ids = tokenizer->Encode(text);
    if (!ids.ok()) return Fail(ids.status().ToString());
    std::printf("%s\n", nlohmann::json(*ids).dump().c_str());
  }
  int64_t tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < absl::GetFlag(FLAGS_repeat); ++pass) {
    for (const std::string& text : texts)
      tokens += static_cast<int64_t>(tokenizer->Encode(text)->size());
  }
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  std::fprintf(stderr, "hf_tokenize: %lld tokens in %.3f s: %.0f tokens/s\n",
               static_cast<long long>(tokens), seconds.count(), tokens / seconds.count());
  return 0;
}
