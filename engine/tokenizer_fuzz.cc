// Prompts are user text: any bytes must encode to ids or to a clear error, encoded text must
// decode back to itself, and any ids (even out of range) must decode without a crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/testing/fuzz_check.h"
#include "engine/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::testing::FuzzCheck;
  namespace engine = tandem::engine;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<int>> ids = engine::Encode(text);
  if (ids.ok()) {
    for (int id : *ids) FuzzCheck(id >= engine::kNumSpecialTokens && id < engine::kVocabSize, "id");
    FuzzCheck(engine::Decode(*ids) == text, "decode(encode(text)) == text");
  }
  const std::vector<int> raw_ids(data, data + size);  // Includes ids past the vocabulary.
  (void)engine::Decode(raw_ids, engine::SpecialTokens::kRender);
  return 0;
}
