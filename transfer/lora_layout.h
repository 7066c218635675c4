#ifndef TANDEM_TRANSFER_LORA_LAYOUT_H_
#define TANDEM_TRANSFER_LORA_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/type/v1/common.pb.h"
#include "tandem/weightstore/v1/weight_store.pb.h"

namespace tandem::transfer {

// Stands for the expert id in the name of a per-expert canonical tensor.
inline constexpr absl::string_view kExpertPlaceholder = "{e}";

// Bytes per element; 0 for DTYPE_UNSPECIFIED and values outside the enum.
int64_t ElementSize(type::v1::Dtype dtype);

// `lora` with LoraConfig's defaults written out, the one place they are decided: expert layout
// UNSPECIFIED -> PER_EXPERT, alpha 0 -> rank, no target_modules -> all seven.
type::v1::LoraConfig WithLoraDefaults(type::v1::LoraConfig lora);

// OK iff the config obeys LoraConfig's rules with expert_layout set (as a Manifest requires):
// rank 1..1024, alpha finite >= 0, dropout in [0, 1), target modules allowed and unique.
absl::Status ValidateLoraConfig(const type::v1::LoraConfig& lora);

// The dimension that tensor parallelism splits: dim 0 of lora_B of a column-parallel base
// (q, k, v, gate, up), dim 1 of lora_A of a row-parallel base (o, down). -1 when every TP rank
// holds the tensor whole: the other LoRA side, names that are no LoRA projection, and shapes
// without that dimension.
int TpSplitDim(const type::v1::TensorSpec& spec);

// True for tensors of the routed experts (per-expert and shared side, "...mlp.experts..."), which
// follow the expert TP group rather than the attention/dense one.
bool IsRoutedExpertTensor(absl::string_view name);

// The up_proj tensor fused with a gate_proj tensor: the name with "gate_proj" -> "up_proj";
// nullopt for names without "gate_proj".
std::optional<std::string> UpProjName(absl::string_view gate_name);

// Whether a gate_proj tensor and its up_proj tensor can be fused: same dtype, shape and experts,
// and at least one dimension to concatenate along.
bool CanFuseGateUp(const weightstore::v1::CanonicalTensor& gate,
                   const weightstore::v1::CanonicalTensor& up);

// A box [begin, begin + size) of a tensor's extended index space: [experts] ++ shape, where a
// tensor that is not per expert has a single pseudo expert, so all tensors are handled alike.
struct TensorBox {
  std::vector<int64_t> begin;
  std::vector<int64_t> size;
};

// [max(num_experts, 1)] ++ shape.
std::vector<int64_t> ExtendedShape(const weightstore::v1::CanonicalTensor& tensor);

// The part of `tensor` that TP rank tp_rank of tp_size and EP rank ep_rank of ep_size hold: the
// TpSplitDim dimension cut into tp_size equal parts and, for per-expert tensors, experts
// [ep_rank*E/ep_size, (ep_rank+1)*E/ep_size). INVALID_ARGUMENT when a size does not divide.
absl::StatusOr<TensorBox> RankBox(const weightstore::v1::CanonicalTensor& tensor, int tp_rank,
                                  int tp_size, int ep_rank, int ep_size);

// Dimensions of the base model the adapter targets.
struct ModelShape {
  // Layers [0, num_dense_layers) and those listed in other_dense_layers have a dense MLP, the
  // rest an MoE.
  int num_layers = 0;
  int num_dense_layers = 0;
  std::vector<int> other_dense_layers;
  // d_model.
  int64_t hidden = 0;
  // q_proj out features (= o_proj in features) and k_proj/v_proj out features.
  int64_t q_out = 0;
  int64_t kv_out = 0;
  // Intermediate size of the dense MLP and of one expert.
  int64_t dense_ffn = 0;
  int64_t expert_ffn = 0;
  int num_experts = 0;

  bool IsDenseLayer(int layer) const;
};

// The canonical tensors (PEFT names, unscaled, in `dtype`) of a LoRA config on that model, sorted
// by name. Expert projections get a per-expert side ("model.layers.{l}.mlp.experts.{e}.P...",
// num_experts = E) or a shared side ("model.layers.{l}.mlp.experts.P...") as lora.expert_layout
// says. lora_A is [r, in], lora_B is [out, r]. INVALID_ARGUMENT for a bad config or shape.
absl::StatusOr<std::vector<weightstore::v1::CanonicalTensor>> CanonicalTensorsFor(
    const ModelShape& model, const type::v1::LoraConfig& lora, type::v1::Dtype dtype);

// One producer's (trainer rank's) layout. The producer's TP applies to expert tensors too.
struct ProducerLayout {
  int tp_rank = 0;
  int tp_size = 1;
  int ep_rank = 0;
  int ep_size = 1;
  // gate_proj and up_proj of a layer in one piece, concatenated along canonical dim 0.
  bool fuse_gate_up = true;
  // All local experts of a tensor in one piece; one piece per expert otherwise.
  bool stack_experts = true;
};

// The shard of one producer rank and its bytes (pieces packed back to back in tensor name order).
// Each canonical tensor is cut by the TP rules (see TpSplitDim) and, if per-expert, by EP (rank r
// holds experts [r*E/ep_size, (r+1)*E/ep_size)). So that the shards of all producer ranks cover
// every element exactly once, a part that several ranks hold identical copies of is published by
// the lowest of them only: tensors whole under TP by tp_rank 0, tensors that are not per-expert by
// ep_rank 0. A rank left with nothing gets an empty shard (byte_size 0), which the caller leaves
// out of the manifest. `canonical` maps every tensor name to its full bytes (for "{e}" tensors
// the E tensors stacked, [E, ...]). INVALID_ARGUMENT for a bad layout, sizes that do not divide
// evenly, or missing or mis-sized bytes.
absl::StatusOr<std::pair<weightstore::v1::Shard, std::string>> BuildProducerShard(
    const std::vector<weightstore::v1::CanonicalTensor>& tensors,
    const absl::flat_hash_map<std::string, std::string>& canonical, const ProducerLayout& layout,
    int producer_rank);

}  // namespace tandem::transfer

#endif  // TANDEM_TRANSFER_LORA_LAYOUT_H_
