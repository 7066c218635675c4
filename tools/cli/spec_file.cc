#include "tools/cli/spec_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace tandem::cli {
namespace {

// YAML scalars are untyped; JSON needs true/false and numbers unquoted where the proto expects
// them (quoted numbers are accepted by proto3 JSON anyway).
nlohmann::json ToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) object[entry.first.as<std::string>()] = ToJson(entry.second);
      return object;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& item : node) array.push_back(ToJson(item));
      return array;
    }
    case YAML::NodeType::Scalar: {
      const std::string text = node.Scalar();
      if (node.Tag() != "!") {  // Unquoted.
        if (text == "true" || text == "false") return text == "true";
        double number = 0;
        if (absl::SimpleAtod(text, &number)) return number;
      }
      return text;
    }
    default:
      return nullptr;
  }
}

}  // namespace

absl::StatusOr<trainer::v1::JobSpec> ParseJobSpec(const std::string& text, bool yaml) {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("not UTF-8 text");
  std::string json = text;
  if (yaml) {
    try {
      json = ToJson(YAML::Load(text)).dump();
    } catch (const YAML::Exception& error) {
      return absl::InvalidArgumentError(absl::StrCat("YAML: ", error.what()));
    } catch (const nlohmann::json::exception& error) {
      // An escape such as "\x86" yields a byte that is no UTF-8, which JSON cannot carry.
      return absl::InvalidArgumentError(absl::StrCat("YAML string is not UTF-8: ", error.what()));
    }
  }
  trainer::v1::JobSpec spec;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &spec);
  if (!status.ok()) return absl::InvalidArgumentError(std::string(status.message()));
  return spec;
}

absl::StatusOr<trainer::v1::JobSpec> ReadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read spec file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  const bool yaml = path.ends_with(".yaml") || path.ends_with(".yml");
  auto spec = ParseJobSpec(text.str(), yaml);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace tandem::cli
