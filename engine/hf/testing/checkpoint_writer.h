#ifndef TANDEM_ENGINE_HF_TESTING_CHECKPOINT_WRITER_H_
#define TANDEM_ENGINE_HF_TESTING_CHECKPOINT_WRITER_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "nlohmann/json.hpp"

namespace tandem::engine::hf::testing {

// Writes a Hugging Face model directory as save_pretrained does: config.json, and the tensors
// in model.safetensors (shards = 1) or split by name order into model-0000N-of-0000M.safetensors
// files listed by model.safetensors.index.json.
absl::Status WriteCheckpoint(const std::string& directory, const nlohmann::json& config,
                             std::map<std::string, Tensor> tensors, int shards);

}  // namespace tandem::engine::hf::testing

#endif  // TANDEM_ENGINE_HF_TESTING_CHECKPOINT_WRITER_H_
