#ifndef TANDEM_COMMON_FLAG_CHECK_H_
#define TANDEM_COMMON_FLAG_CHECK_H_

#include "absl/status/status.h"

namespace tandem {

// Checks every --flag of a command line the way absl::ParseCommandLine will read it -- the flag
// exists and its value parses -- and INVALID_ARGUMENT (reason INVALID_FLAG) naming the first one
// that does not.
// absl::ParseCommandLine itself ends the process with status 1 on such a flag; the services
// promise status 2 for bad flags, so they check first. Values from --flagfile are left to absl,
// as are unknown flags when --undefok is given.
absl::Status CheckCommandLineFlags(int argc, char** argv);

}  // namespace tandem

#endif  // TANDEM_COMMON_FLAG_CHECK_H_
