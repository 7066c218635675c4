#include "services/weight_store/client/peft_export.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/tensor.h"
#include "engine/module_names.h"
#include "engine/peft_adapter.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"
#include "transfer/dtype_conversion.h"

namespace tandem::weight_store {
namespace {

constexpr absl::Duration kManifestTimeout = absl::Seconds(30);

// The fetched tensors under their canonical names, as F32 tensors.
absl::StatusOr<std::map<std::string, Tensor>> CanonicalTensors(const FetchedAdapter& fetched) {
  std::map<std::string, Tensor> tensors;
  for (const FetchedTensor& fetched_tensor : fetched.tensors) {
    const type::v1::TensorSpec& spec = fetched_tensor.tensor.spec();
    auto values = transfer::ConvertFloats(fetched_tensor.bytes, spec.dtype(), type::v1::DTYPE_F32);
    if (!values.ok()) return values.status();
    auto tensor = Tensor::FromBytes(
        DType::kF32, std::vector<int64_t>(spec.shape().begin(), spec.shape().end()),
        absl::MakeConstSpan(reinterpret_cast<const std::byte*>(values->data()), values->size()));
    if (!tensor.ok()) {
      // Fetched bytes that do not fill their own spec's shape.
      return absl::DataLossError(
          absl::StrCat("tensor ", spec.name(), ": ", tensor.status().message()));
    }
    tensors[spec.name()] = *std::move(tensor);
  }
  return tensors;
}

// Experts per MoE layer: what per-expert tensors hold, else the label the trainer sets. A side
// shared by all experts is copied to each of them, so their count must be known.
absl::StatusOr<int> NumExperts(const weightstore::v1::Manifest& manifest) {
  int num_experts = 0;
  bool shared_sides = false;
  for (const weightstore::v1::CanonicalTensor& tensor : manifest.tensors()) {
    num_experts = std::max(num_experts, tensor.num_experts());
    shared_sides |=
        absl::StrContains(tensor.spec().name(), ".mlp.experts.") && tensor.num_experts() == 0;
  }
  if (num_experts > 0 || !shared_sides) return num_experts;
  const auto label = manifest.labels().find(kNumExpertsLabel);
  if (label == manifest.labels().end() || !absl::SimpleAtoi(label->second, &num_experts) ||
      num_experts < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("version ", manifest.version(),
                     " shares LoRA sides between experts but does not say how "
                     "many experts there are (label '",
                     kNumExpertsLabel,
                     "'), which PEFT's per-expert "
                     "tensors need"));
  }
  return num_experts;
}

}  // namespace

absl::StatusOr<int64_t> ExportPeftAdapter(const WeightStoreStubs& store,
                                          absl::string_view adapter, int64_t version,
                                          const std::string& directory,
                                          const std::string& base_model_name_or_path) {
  auto manifest = GetManifest(store, adapter, version, kManifestTimeout);
  if (!manifest.ok()) return manifest.status();
  auto lora = LoraConfigFromProto(manifest->lora());
  if (!lora.ok()) return lora.status();
  FetchOptions options;
  options.target.set_naming(weightstore::v1::TENSOR_NAMING_CANONICAL);
  options.target.set_dtype(type::v1::DTYPE_F32);
  auto fetched = FetchAdapter(store, adapter, manifest->version(), options);
  if (!fetched.ok()) return fetched.status();
  auto tensors = CanonicalTensors(*fetched);
  if (!tensors.ok()) return tensors.status();
  auto num_experts = NumExperts(*manifest);
  if (!num_experts.ok()) return num_experts.status();
  const auto architecture = manifest->labels().find(kArchitectureLabel);
  const engine::MoeModuleNames names =
      engine::ModuleNamesOf(architecture == manifest->labels().end() ? "" : architecture->second);
  if (absl::Status status = engine::WritePeftDirectory(*tensors, *lora, *num_experts, directory,
                                                       base_model_name_or_path, names);
      !status.ok()) {
    return status;
  }
  return manifest->version();
}

}  // namespace tandem::weight_store
