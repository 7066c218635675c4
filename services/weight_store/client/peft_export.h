#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_PEFT_EXPORT_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_PEFT_EXPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/weight_store/client/adapter_client.h"

namespace tandem::weight_store {

// Fetches `version` of `adapter` (0: the newest) from weight-store over gRPC, in the canonical
// layout as F32, and writes it into `directory` as a PEFT LoRA adapter (see
// engine/peft_adapter.h: sides shared between experts are copied to every expert). Returns the
// version written. The store's errors as it gives them (NOT_FOUND for an unknown adapter or
// version); INVALID_ARGUMENT for a LoRA config the engine does not know.
absl::StatusOr<int64_t> ExportPeftAdapter(const WeightStoreStubs& store,
                                          absl::string_view adapter, int64_t version,
                                          const std::string& directory,
                                          const std::string& base_model_name_or_path);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_PEFT_EXPORT_H_
