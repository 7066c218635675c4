#ifndef TANDEM_ENGINE_HF_HF_CHECKPOINT_H_
#define TANDEM_ENGINE_HF_HF_CHECKPOINT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "nlohmann/json.hpp"

namespace tandem::engine::hf {

// A Hugging Face model directory as transformers saves it: config.json, and the weights in
// model.safetensors or in shards model-0000N-of-0000M.safetensors listed by
// model.safetensors.index.json ({"weight_map": {tensor name: shard file}}).
struct HfCheckpoint {
  nlohmann::json config;                  // config.json as written.
  std::map<std::string, Tensor> tensors;  // By HF name, converted once to F32.
};

// Reads every tensor of the checkpoint. F32, BF16 and F16 tensors become F32; other dtypes
// are INVALID_ARGUMENT naming the tensor. Errors name the file and, where one is involved,
// the tensor: NOT_FOUND for a missing config, index or shard (with the tensors the index puts
// there); DATA_LOSS for a truncated shard (naming the first tensors it should hold) or a
// tensor the index lists that its shard lacks; INVALID_ARGUMENT for malformed JSON or a shard
// holding a tensor the index assigns elsewhere.
absl::StatusOr<HfCheckpoint> ReadHfCheckpoint(const std::string& directory);

// Tensor name -> shape, as an architecture expects them.
using TensorShapes = std::map<std::string, std::vector<int64_t>>;

// OK when the checkpoint holds exactly the expected tensors with the expected shapes; else
// INVALID_ARGUMENT naming the first missing tensor, wrong shape (both shapes) or tensor the
// architecture has no place for.
absl::Status CheckTensorShapes(const HfCheckpoint& checkpoint, const TensorShapes& expected);

}  // namespace tandem::engine::hf

#endif  // TANDEM_ENGINE_HF_HF_CHECKPOINT_H_
