#ifndef TANDEM_COMMON_VERSION_H_
#define TANDEM_COMMON_VERSION_H_

namespace tandem {

// Reported by tandem_build_info and every binary's --version.
inline constexpr char kTandemVersion[] = "0.1.0";

}  // namespace tandem

#endif  // TANDEM_COMMON_VERSION_H_
