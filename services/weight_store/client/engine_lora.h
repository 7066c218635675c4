#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_ENGINE_LORA_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_ENGINE_LORA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/config.h"
#include "engine/model.h"
#include "placement/expert_placement.h"
#include "services/weight_store/client/adapter_client.h"
#include "tandem/weightstore/v1/weight_store.pb.h"
#include "transfer/lora_layout.h"

// Conversions between the embedded engine's LoRA adapters and weight-store versions: what the
// trainer publishes and what a rollout replica builds from a fetch.
namespace tandem::weight_store {

// Dimensions of the engine model as the layout code sees them.
transfer::ModelShape ModelShapeOf(const engine::ModelConfig& config);

type::v1::LoraConfig LoraConfigToProto(const engine::LoraConfig& config);
// INVALID_ARGUMENT for values the engine cannot run (rank, alpha, unknown modules).
absl::StatusOr<engine::LoraConfig> LoraConfigFromProto(const type::v1::LoraConfig& config);

// Manifest label of the base model's experts per MoE layer, which a side shared by all experts
// stands for (a PEFT export copies it to each); set by BuildAdapterVersion.
inline constexpr char kNumExpertsLabel[] = "num_experts";
// The base model's config.json architecture, which says how PEFT names its MoE modules; set by
// the trainer for Hugging Face base models.
inline constexpr char kArchitectureLabel[] = "architecture";

// One version ready for PublishAdapter.
struct AdapterVersion {
  weightstore::v1::Manifest manifest;
  std::vector<std::string> shards;

  std::vector<absl::string_view> shard_views() const { return {shards.begin(), shards.end()}; }
};

// The manifest and shards of `adapter` as trainer ranks that each hold every tensor (TP 1, EP
// 1: one rank, or data-parallel ranks) publish it, in `dtype` (F32, or BF16 rounded to nearest
// even): `writers` shards, shard w (producer rank w) holding a contiguous run of the tensors in
// name order of about 1/writers of the bytes, so each replicated tensor is put by one writer.
// INVALID_ARGUMENT when there are fewer tensors than writers.
absl::StatusOr<AdapterVersion> BuildAdapterVersion(const engine::LoraAdapter& adapter,
                                                   const engine::ModelConfig& model_config,
                                                   absl::string_view adapter_name, int64_t version,
                                                   type::v1::Dtype dtype = type::v1::DTYPE_F32,
                                                   int writers = 1);

// The manifest and this writer's shard of an expert-parallel job's version, as writer `writer`
// of the job's ranks builds it from its `adapter`: `copies` data-parallel copies of the
// placements' group (rank r is copy r / group of group rank r % group, which holds
// placements.layers[m].experts[r % group] of each MoE layer m). Each rank holds the tensors that
// are not per expert whole (they are split among the writers as BuildAdapterVersion splits them)
// and the per-expert ones for its experts only (LoraAdapter::ExpertShard, then moved). Copy c of a
// group rank publishes its experts [c·E/writers, (c+1)·E/writers) of each layer in that layer's
// placement order, a piece per expert. F32. Every writer's pieces are in the manifest, but only
// this writer's bytes (the other shards are empty) and checksum: the others' xxh3_64 are the
// caller's to gather. INVALID_ARGUMENT for placements ValidatePlacements refuses, experts per
// layer that are not a multiple of the writers, an adapter lacking an expert it publishes, or
// fewer tensors that are not per expert than writers.
absl::StatusOr<AdapterVersion> BuildExpertParallelVersion(
    const engine::LoraAdapter& adapter, const engine::ModelConfig& model_config,
    absl::string_view adapter_name, int64_t version, const placement::LayerPlacements& placements,
    int copies, int writer);

// The layout the engine consumes: one rank, its own parameter names (experts stacked), stored
// dtype (the UCX path never converts; AdapterFromFetched does).
weightstore::v1::TargetLayout EngineTargetLayout();

// Builds the engine adapter of `lora` from tensors fetched in EngineTargetLayout(), in any
// float dtype (converted to F32).
// INVALID_ARGUMENT naming the first missing, unexpected or mis-sized tensor.
absl::StatusOr<engine::LoraAdapter> AdapterFromFetched(const engine::ModelConfig& model_config,
                                                       const type::v1::LoraConfig& lora,
                                                       const FetchedAdapter& fetched);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_ENGINE_LORA_H_
