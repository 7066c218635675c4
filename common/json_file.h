#ifndef TANDEM_COMMON_JSON_FILE_H_
#define TANDEM_COMMON_JSON_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

// The JSON object in the file at `path` (config.json, adapter_config.json, ...). NOT_FOUND
// naming the path when it cannot be read; INVALID_ARGUMENT naming it when it is not one JSON
// object.
absl::StatusOr<nlohmann::json> ReadJsonObject(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_COMMON_JSON_FILE_H_
