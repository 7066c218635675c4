#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_ROUTE_TESTING_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_ROUTE_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "services/router_replay/client/route_wire.h"

namespace tandem::router_replay {

// Valid synthetic routes [rows, layers, top_k] with skewed (Zipf-like, exponent `skew`) expert
// popularity per layer, the shape real routers produce; skew 0 is uniform. Rows whose index is
// a multiple of `missing_every` (if > 0) are all -1 in layer 0.
inline std::vector<int16_t> SyntheticRoutes(const RouteShape& shape, int64_t rows, uint64_t seed,
                                            double skew = 1.0, int64_t missing_every = 0) {
  std::mt19937_64 rng(seed);
  const int layers = static_cast<int>(shape.layers.size());
  const int k = shape.top_k;
  const int experts = shape.num_experts;
  std::vector<std::discrete_distribution<int>> popularity;
  for (int l = 0; l < layers; ++l) {
    std::vector<double> weights(experts);
    std::vector<int> rank(experts);
    std::iota(rank.begin(), rank.end(), 1);
    std::shuffle(rank.begin(), rank.end(), rng);  // A different hot set per layer.
    for (int e = 0; e < experts; ++e) weights[e] = 1.0 / std::pow(rank[e], skew);
    popularity.emplace_back(weights.begin(), weights.end());
  }
  std::vector<int16_t> out(rows * layers * k);
  for (int64_t r = 0; r < rows; ++r) {
    for (int l = 0; l < layers; ++l) {
      int16_t* ids = out.data() + (r * layers + l) * k;
      if (missing_every > 0 && r % missing_every == 0 && l == 0) {
        std::fill_n(ids, k, int16_t{-1});
        continue;
      }
      for (int s = 0; s < k;) {
        const auto id = static_cast<int16_t>(popularity[l](rng));
        if (std::find(ids, ids + s, id) == ids + s) ids[s++] = id;
      }
    }
  }
  return out;
}

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_ROUTE_TESTING_H_
