// GenerateRequest is what any client sends rollout: whatever its bytes, PrepareWork must answer
// with a status, and work it accepts must fit the model (ids in the vocabulary, prompt plus new
// tokens within the context, positive token budgets) so the scheduler never sees a bad request.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/testing/fuzz_check.h"
#include "engine/config.h"
#include "services/rollout/generate_request.h"
#include "tandem/rollout/v1/rollout.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::testing::FuzzCheck;
  tandem::rollout::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  static const tandem::engine::ModelConfig model = tandem::engine::DefaultModelConfig();
  static const auto codec = *tandem::engine::text::TextCodecFor("embedded.safetensors");
  absl::StatusOr<std::unique_ptr<tandem::rollout::GenerationWork>> work =
      tandem::rollout::PrepareWork(request, model, *codec);
  if (!work.ok()) return 0;
  FuzzCheck((*work)->num_samples() > 0, "accepted work has samples");
  for (int s = 0; s < (*work)->num_samples(); ++s) {
    const tandem::engine::GenerationRequest sample = (*work)->Sample(s);
    FuzzCheck(!sample.prompt.empty(), "a sample has a prompt");
    FuzzCheck(sample.max_new_tokens >= 1, "a sample may generate");
    FuzzCheck(
        static_cast<int64_t>(sample.prompt.size()) + sample.max_new_tokens <= model.max_seq_len,
        "prompt plus new tokens fit the context");
    for (int id : sample.prompt) FuzzCheck(id >= 0 && id < model.vocab_size, "ids in vocabulary");
  }
  return 0;
}
