#include "common/json_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem {

absl::StatusOr<nlohmann::json> ReadJsonObject(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream contents;
  contents << file.rdbuf();
  nlohmann::json json = nlohmann::json::parse(contents.str(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return InvalidRequest("BAD_JSON_FILE", absl::StrCat(path, " is not a JSON object"));
  }
  return json;
}

}  // namespace tandem
