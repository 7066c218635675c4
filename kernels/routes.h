#ifndef TANDEM_KERNELS_ROUTES_H_
#define TANDEM_KERNELS_ROUTES_H_

#include <cstdint>
#include <string>

namespace tandem::kernels {

// Validates replayed routes for use in place of TopK: each row either all -1 ("use live routing
// for this token and layer") or k distinct ids in [0, E). Returns "" if fine, else a message
// naming the token, the slot and the value, e.g. "token 3 slot 1: expert 300 out of range
// [0, 256)", "token 5: expert 7 appears twice", "token 2: mixes -1 and expert ids".
std::string ValidateRoutes(const int16_t* ids, int T, int k, int E);

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_ROUTES_H_
