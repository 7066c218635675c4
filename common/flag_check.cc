#include "common/flag_check.h"

#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace tandem {
namespace {

// Flags absl's usage machinery answers itself (help, version), whatever the binary defines.
bool IsUsageFlag(absl::string_view name) {
  return name == "help" || name == "helpfull" || name == "helpshort" || name == "helppackage" ||
         name == "helpon" || name == "helpmatch" || name == "version" || name == "only_check_args";
}

// The flag named on the command line, and whether the name was a bool's "no" form.
struct NamedFlag {
  absl::CommandLineFlag* flag = nullptr;
  bool negated = false;
};

NamedFlag FindFlag(absl::string_view name) {
  if (absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name)) return {flag, false};
  if (absl::ConsumePrefix(&name, "no")) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && flag->IsOfType<bool>()) return {flag, true};
  }
  return {};
}

}  // namespace

absl::Status CheckCommandLineFlags(int argc, char** argv) {
  bool unknown_allowed = false;
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--undefok")) unknown_allowed = true;
  }
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // Everything after it is positional.
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    const size_t equals = arg.find('=');
    const absl::string_view name = arg.substr(0, equals);
    if (IsUsageFlag(name) || name == "flagfile" || name == "fromenv" || name == "tryfromenv" ||
        name == "undefok") {
      continue;
    }
    const NamedFlag named = FindFlag(name);
    if (named.flag == nullptr) {
      if (unknown_allowed) continue;
      return InvalidRequest("INVALID_FLAG", absl::StrCat("unknown command line flag '", name, "'"));
    }
    std::string value;
    if (equals != absl::string_view::npos) {
      if (named.negated) {
        return InvalidRequest("INVALID_FLAG", absl::StrCat("--", name, " takes no value: set --",
                                                           named.flag->Name(), "=false"));
      }
      value = std::string(arg.substr(equals + 1));
    } else if (named.flag->IsOfType<bool>()) {
      value = named.negated ? "false" : "true";
    } else if (i + 1 < argc) {
      value = argv[++i];  // "--flag value": absl reads the next argument as the value.
    } else {
      return InvalidRequest("INVALID_FLAG", absl::StrCat("--", name, " is missing its value"));
    }
    // Setting the flag here is harmless: ParseCommandLine sets the same value again.
    std::string error;
    if (!named.flag->ParseFrom(value, &error)) {
      return InvalidRequest("INVALID_FLAG",
                            absl::StrCat("--", named.flag->Name(), "=", value, ": ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
