#ifndef TANDEM_SERVICES_WEIGHT_STORE_MANIFEST_H_
#define TANDEM_SERVICES_WEIGHT_STORE_MANIFEST_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tandem/weightstore/v1/weight_store.pb.h"

namespace tandem::weight_store {

// Tensor names (TensorSpec.name) are 1..512 bytes; a longer name can name no tensor.
inline constexpr size_t kMaxTensorNameBytes = 512;
// A manifest's labels: at most 64, keys of up to 256 bytes (common/string_limits.h's names),
// values of up to 4 KiB (its text).
inline constexpr int kMaxLabels = 64;

// OK iff `manifest` obeys every rule of weight_store.proto: identifiers, version, LoRA config,
// canonical tensors, shards and pieces, and every element of every canonical tensor covered by
// exactly one piece; base_model and labels within their sizes. Otherwise INVALID_ARGUMENT naming
// the adapter@version, the tensor, shard or piece, and the bad value, whose details name the
// field by its path from the request root, `path` being the manifest's (e.g.
// "manifest.shards[1].pieces[0].byte_length", `manifest.labels["note"]`). Output-only fields
// (total_bytes, commit_time) are not checked.
absl::Status ValidateManifest(const weightstore::v1::Manifest& manifest,
                              absl::string_view path = "manifest");

// A read (FetchTensors, a read plan) names one committed version: an adapter name that is an
// identifier and a version >= 1 (the requests' adapter_name and version fields).
absl::Status ValidateVersionOf(absl::string_view adapter_name, int64_t version);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_MANIFEST_H_
