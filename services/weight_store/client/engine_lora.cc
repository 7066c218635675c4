#include "services/weight_store/client/engine_lora.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/dtype.h"
#include "common/status.h"
#include "transfer/dtype_conversion.h"

namespace tandem::weight_store {
namespace {

constexpr char kExperts[] = ".experts.";

// Canonical name of an engine parameter: stacked per-expert tensors get the "{e}" segment.
std::string CanonicalName(const std::string& name, const engine::Parameter& parameter) {
  if (!parameter.stacked_experts) return name;
  std::string canonical = name;
  const size_t at = canonical.find(kExperts);
  canonical.insert(at + std::strlen(kExperts), absl::StrCat(transfer::kExpertPlaceholder, "."));
  return canonical;
}

std::string ValueBytes(const std::vector<float>& values, type::v1::Dtype dtype) {
  std::string bytes;
  if (dtype == type::v1::DTYPE_BF16) {
    bytes.resize(values.size() * sizeof(BFloat16));
    auto* out = reinterpret_cast<BFloat16*>(bytes.data());
    for (size_t i = 0; i < values.size(); ++i) out[i] = ToBFloat16(values[i]);
  } else {
    bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  return bytes;
}

type::v1::ExpertLayout ExpertLayoutToProto(engine::ExpertLayout layout) {
  switch (layout) {
    case engine::ExpertLayout::kPerExpert:
      return type::v1::EXPERT_LAYOUT_PER_EXPERT;
    case engine::ExpertLayout::kShared:
      return type::v1::EXPERT_LAYOUT_SHARED;
    case engine::ExpertLayout::kSharedOuter:
      return type::v1::EXPERT_LAYOUT_SHARED_OUTER;
  }
  return type::v1::EXPERT_LAYOUT_UNSPECIFIED;
}

}  // namespace

transfer::ModelShape ModelShapeOf(const engine::ModelConfig& config) {
  transfer::ModelShape shape{.num_layers = config.num_layers,
                             .num_dense_layers = config.num_dense_layers,
                             .hidden = config.d_model,
                             .q_out = config.attention_out_dim(),  // q_proj out, o_proj in.
                             .kv_out = config.kv_dim(),
                             .dense_ffn = config.dense_ffn_dim,
                             .expert_ffn = config.expert_ffn_dim,
                             .num_experts = config.num_experts};
  for (int layer = config.num_dense_layers; layer < config.num_layers; ++layer) {
    if (!config.IsMoeLayer(layer)) shape.other_dense_layers.push_back(layer);
  }
  return shape;
}

type::v1::LoraConfig LoraConfigToProto(const engine::LoraConfig& config) {
  type::v1::LoraConfig proto;
  proto.set_rank(config.rank);
  proto.set_alpha(config.alpha);
  for (const std::string& module : config.targets) proto.add_target_modules(module);
  proto.set_expert_layout(ExpertLayoutToProto(config.expert_layout));
  return proto;
}

absl::StatusOr<engine::LoraConfig> LoraConfigFromProto(const type::v1::LoraConfig& given) {
  const type::v1::LoraConfig proto = transfer::WithLoraDefaults(given);
  engine::LoraConfig config;
  config.rank = proto.rank();
  config.alpha = proto.alpha();
  config.targets.assign(proto.target_modules().begin(), proto.target_modules().end());
  switch (proto.expert_layout()) {
    case type::v1::EXPERT_LAYOUT_PER_EXPERT:
      config.expert_layout = engine::ExpertLayout::kPerExpert;
      break;
    case type::v1::EXPERT_LAYOUT_SHARED:
      config.expert_layout = engine::ExpertLayout::kShared;
      break;
    case type::v1::EXPERT_LAYOUT_SHARED_OUTER:
      config.expert_layout = engine::ExpertLayout::kSharedOuter;
      break;
    default:
      return InvalidRequest("UNSUPPORTED_LORA_CONFIG",
                            absl::StrCat("unknown expert_layout ", proto.expert_layout()));
  }
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  return config;
}

namespace {

// Splits tensors (in manifest order) into `writers` contiguous runs of about equal bytes: a
// tensor goes to the run its middle byte falls in ([w, w + 1) * total / writers), but never
// skipping a run (a tensor larger than a run's share would) nor leaving later runs without one.
absl::StatusOr<std::vector<std::vector<weightstore::v1::CanonicalTensor>>> SplitAmongWriters(
    const std::vector<weightstore::v1::CanonicalTensor>& tensors,
    const absl::flat_hash_map<std::string, std::string>& canonical, int writers) {
  const int count = static_cast<int>(tensors.size());
  if (writers < 1 || writers > count) {
    return InvalidRequest("BAD_WRITER_PLACEMENT",
                          absl::StrCat("an adapter of ", count, " tensors cannot be published by ",
                                       writers, " writers (each needs a tensor of its own)"));
  }
  double total = 0;
  for (const weightstore::v1::CanonicalTensor& tensor : tensors) {
    total += static_cast<double>(canonical.at(tensor.spec().name()).size());
  }
  std::vector<std::vector<weightstore::v1::CanonicalTensor>> runs(writers);
  double before = 0;
  int run = 0;
  for (int i = 0; i < count; ++i) {
    const double bytes = static_cast<double>(canonical.at(tensors[i].spec().name()).size());
    const int by_bytes = static_cast<int>(writers * (before + bytes / 2) / total);
    const int earliest = writers - (count - i);  // Later runs each still need a tensor.
    if (i > 0) run = std::clamp(by_bytes, std::max(run, earliest), std::min(run + 1, writers - 1));
    before += bytes;
    runs[run].push_back(tensors[i]);
  }
  return runs;
}

}  // namespace

namespace {

// An adapter's canonical tensors, with the bytes of each: per-expert ones full size, the experts
// the adapter holds (all, or a shard's) at their place and zeros for the others.
struct CanonicalAdapter {
  type::v1::LoraConfig lora;
  std::vector<weightstore::v1::CanonicalTensor> tensors;
  absl::flat_hash_map<std::string, std::string> bytes;
};

absl::StatusOr<CanonicalAdapter> Canonical(const engine::LoraAdapter& adapter,
                                           const engine::ModelConfig& model_config,
                                           type::v1::Dtype dtype) {
  if (dtype != type::v1::DTYPE_F32 && dtype != type::v1::DTYPE_BF16) {
    return InvalidRequest("UNSUPPORTED_DTYPE", "adapters are published as F32 or BF16");
  }
  CanonicalAdapter canonical{.lora = LoraConfigToProto(adapter.config())};
  auto tensors = transfer::CanonicalTensorsFor(ModelShapeOf(model_config), canonical.lora, dtype);
  if (!tensors.ok()) return tensors.status();
  canonical.tensors = *std::move(tensors);
  const engine::ParameterSet& parameters = adapter.parameters();
  std::vector<float> whole;
  for (const std::string& name : parameters.names()) {
    const engine::Parameter& parameter = *parameters.Find(name);
    const std::vector<float>* values = &parameter.value;
    if (parameter.stacked_experts && !parameter.experts.empty()) {
      whole = parameter.PlaceExperts(parameter.value, model_config.num_experts);
      values = &whole;
    }
    canonical.bytes[CanonicalName(name, parameter)] = ValueBytes(*values, dtype);
  }
  if (canonical.bytes.size() != canonical.tensors.size()) {
    return InvalidRequest("ADAPTER_MISMATCH",
                          absl::StrCat("adapter has ", canonical.bytes.size(),
                                       " tensors; its config names ", canonical.tensors.size()));
  }
  return canonical;
}

AdapterVersion VersionOf(const CanonicalAdapter& canonical, const engine::ModelConfig& model_config,
                         absl::string_view adapter_name, int64_t version) {
  AdapterVersion published;
  weightstore::v1::Manifest& manifest = published.manifest;
  manifest.set_adapter_name(std::string(adapter_name));
  manifest.set_version(version);
  *manifest.mutable_lora() = canonical.lora;
  (*manifest.mutable_labels())[kNumExpertsLabel] = absl::StrCat(model_config.num_experts);
  manifest.mutable_tensors()->Add(canonical.tensors.begin(), canonical.tensors.end());
  return published;
}

// `second` appended to `first`: its pieces move up by first's bytes, and the checksum is the
// whole's.
void Append(std::pair<weightstore::v1::Shard, std::string> second,
            std::pair<weightstore::v1::Shard, std::string>& first) {
  const uint64_t offset = first.second.size();
  for (weightstore::v1::ShardPiece& piece : *second.first.mutable_pieces()) {
    piece.set_byte_offset(piece.byte_offset() + offset);
    *first.first.add_pieces() = std::move(piece);
  }
  first.second += second.second;
  first.first.set_byte_size(first.second.size());
  first.first.set_xxh3_64(Xxh3Checksum(first.second));
}

}  // namespace

absl::StatusOr<AdapterVersion> BuildAdapterVersion(const engine::LoraAdapter& adapter,
                                                   const engine::ModelConfig& model_config,
                                                   absl::string_view adapter_name, int64_t version,
                                                   type::v1::Dtype dtype, int writers) {
  auto canonical = Canonical(adapter, model_config, dtype);
  if (!canonical.ok()) return canonical.status();
  auto runs = SplitAmongWriters(canonical->tensors, canonical->bytes, writers);
  if (!runs.ok()) return runs.status();
  AdapterVersion published = VersionOf(*canonical, model_config, adapter_name, version);
  for (int w = 0; w < writers; ++w) {
    auto shard =
        transfer::BuildProducerShard((*runs)[w], canonical->bytes, transfer::ProducerLayout{}, w);
    if (!shard.ok()) return shard.status();
    *published.manifest.add_shards() = std::move(shard->first);
    published.shards.push_back(std::move(shard->second));
  }
  return published;
}

absl::StatusOr<AdapterVersion> BuildExpertParallelVersion(
    const engine::LoraAdapter& adapter, const engine::ModelConfig& model_config,
    absl::string_view adapter_name, int64_t version, const placement::LayerPlacements& placements,
    int copies, int writer) {
  const int group = placements.ranks(), writers = group * copies;
  if (absl::Status status = placement::ValidatePlacements(placements, model_config.num_experts,
                                                          group, model_config.num_moe_layers());
      !status.ok()) {
    return status;
  }
  if (copies < 1 || writer < 0 || writer >= writers || model_config.num_experts % writers != 0) {
    return InvalidRequest(
        "BAD_WRITER_PLACEMENT",
        absl::StrCat("writer ", writer, " of ", copies, " copies of ", group,
                     " expert-parallel ranks: ", model_config.num_experts,
                     " experts per layer cannot be shared by ", writers, " writers evenly"));
  }
  auto canonical = Canonical(adapter, model_config, type::v1::DTYPE_F32);
  if (!canonical.ok()) return canonical.status();
  // The per-expert tensors by MoE layer: each layer places its experts in its own way.
  std::vector<weightstore::v1::CanonicalTensor> whole;
  std::map<int, std::vector<weightstore::v1::CanonicalTensor>> per_expert;
  for (const weightstore::v1::CanonicalTensor& tensor : canonical->tensors) {
    if (tensor.num_experts() == 0) {
      whole.push_back(tensor);
      continue;
    }
    per_expert[model_config.MoeIndex(engine::LayerOfName(tensor.spec().name()))].push_back(tensor);
  }
  auto runs = SplitAmongWriters(whole, canonical->bytes, writers);
  if (!runs.ok()) return runs.status();
  AdapterVersion published = VersionOf(*canonical, model_config, adapter_name, version);
  const int share = model_config.num_experts / writers;
  for (int w = 0; w < writers; ++w) {
    auto shard =
        transfer::BuildProducerShard((*runs)[w], canonical->bytes, transfer::ProducerLayout{}, w);
    if (!shard.ok()) return shard.status();
    // Writer w, copy w / group of group rank w % group, puts its share of that rank's experts
    // of each MoE layer, a piece per expert.
    for (const auto& [layer, tensors] : per_expert) {
      if (layer < 0) {
        return InvalidRequest("ADAPTER_MISMATCH",
                              absl::StrCat("per-expert tensor '", tensors.front().spec().name(),
                                           "' lies in no MoE layer of the model"));
      }
      const std::vector<int>& held = placements.layers[layer].experts[w % group];
      for (int i = (w / group) * share; i < (w / group + 1) * share; ++i) {
        if (w == writer && adapter.parameters().StackedIndex(layer, held[i]) < 0) {
          return InvalidRequest(
              "BAD_WRITER_PLACEMENT",
              absl::StrCat("writer ", writer, " publishes expert ", held[i], " of MoE layer ",
                           layer, ", which its adapter does not hold"));
        }
        const transfer::ProducerLayout one_expert{.ep_rank = held[i],
                                                  .ep_size = model_config.num_experts};
        auto expert_shard = transfer::BuildProducerShard(tensors, canonical->bytes, one_expert, w);
        if (!expert_shard.ok()) return expert_shard.status();
        Append(*std::move(expert_shard), *shard);
      }
    }
    *published.manifest.add_shards() = std::move(shard->first);
    published.shards.push_back(w == writer ? std::move(shard->second) : std::string());
  }
  return published;
}

weightstore::v1::TargetLayout EngineTargetLayout() {
  weightstore::v1::TargetLayout layout;
  layout.set_naming(weightstore::v1::TENSOR_NAMING_ENGINE_NATIVE);
  layout.set_stack_experts(true);
  return layout;
}

absl::StatusOr<engine::LoraAdapter> AdapterFromFetched(const engine::ModelConfig& model_config,
                                                       const type::v1::LoraConfig& lora,
                                                       const FetchedAdapter& fetched) {
  auto config = LoraConfigFromProto(lora);
  if (!config.ok()) return config.status();
  auto adapter = engine::LoraAdapter::Zeros(model_config, *config);
  if (!adapter.ok()) return adapter.status();
  engine::ParameterSet& parameters = adapter->parameters();
  if (fetched.tensors.size() != parameters.names().size()) {
    return InvalidRequest("ADAPTER_MISMATCH",
                          absl::StrCat("fetched ", fetched.tensors.size(),
                                       " tensors; the adapter has ", parameters.names().size()));
  }
  for (const FetchedTensor& tensor : fetched.tensors) {
    const std::string& name = tensor.tensor.spec().name();
    engine::Parameter* parameter = parameters.Find(name);
    if (parameter == nullptr) {
      return InvalidRequest("ADAPTER_MISMATCH", absl::StrCat("unexpected tensor '", name, "'"));
    }
    const type::v1::Dtype dtype = tensor.tensor.spec().dtype();
    const int64_t element_size = transfer::ElementSize(dtype);
    if (element_size == 0 ||
        tensor.bytes.size() != parameter->value.size() * static_cast<size_t>(element_size)) {
      return InvalidRequest("ADAPTER_MISMATCH",
                            absl::StrCat("tensor '", name, "' has ", tensor.bytes.size(),
                                         " bytes of ", type::v1::Dtype_Name(dtype), "; expected ",
                                         parameter->value.size(), " values"));
    }
    auto values = transfer::ConvertFloats(tensor.bytes, dtype, type::v1::DTYPE_F32);
    if (!values.ok()) return values.status();
    std::memcpy(parameter->value.data(), values->data(), values->size());
  }
  return adapter;
}

}  // namespace tandem::weight_store
