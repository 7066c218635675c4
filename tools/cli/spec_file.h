#ifndef TANDEM_TOOLS_CLI_SPEC_FILE_H_
#define TANDEM_TOOLS_CLI_SPEC_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::cli {

// A JobSpec from a JSON or YAML file (proto3 JSON field names, either snake_case or camelCase;
// enums by name, e.g. algorithm: ALGORITHM_GRPO). YAML is recognized by a .yaml/.yml suffix.
// INVALID_ARGUMENT naming the file and the problem.
absl::StatusOr<trainer::v1::JobSpec> ReadJobSpec(const std::string& path);

// The same from text already read; `yaml` selects the syntax.
absl::StatusOr<trainer::v1::JobSpec> ParseJobSpec(const std::string& text, bool yaml);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_CLI_SPEC_FILE_H_
