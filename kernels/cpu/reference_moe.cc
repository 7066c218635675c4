#include "kernels/cpu/reference_moe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace tandem::cpu::reference {
namespace {

std::vector<double> ScoresRow(const float* logits, int E, kernels::ScoringFunction scoring) {
  std::vector<double> s(E);
  if (scoring == kernels::ScoringFunction::kSigmoid) {
    for (int e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-double{logits[e]}));
    return s;
  }
  double max = -std::numeric_limits<double>::infinity();
  for (int e = 0; e < E; ++e) max = std::max(max, double{logits[e]});
  double sum = 0.0;
  for (int e = 0; e < E; ++e) sum += s[e] = std::exp(logits[e] - max);
  for (int e = 0; e < E; ++e) s[e] /= sum;
  return s;
}

// d s_n / d l_m.
double ScoreJacobian(const std::vector<double>& s, int n, int m, kernels::ScoringFunction scoring) {
  if (scoring == kernels::ScoringFunction::kSigmoid) return n == m ? s[n] * (1.0 - s[n]) : 0.0;
  return s[n] * ((n == m ? 1.0 : 0.0) - s[m]);
}

// d g_i / d s_n for the selected expert n = ids[j]; g does not depend on unselected scores.
double GateJacobian(const std::vector<double>& s, const int16_t* ids, int k, int i, int j,
                    bool normalize) {
  const double delta = i == j ? 1.0 : 0.0;
  if (!normalize) return delta;
  double z = 0.0;
  for (int q = 0; q < k; ++q) z += s[ids[q]];
  return (delta * z - s[ids[i]]) / (z * z);
}

// The same key the contract defines: the float sum, with NaN ranked lowest.
float Key(const float* scores, const float* bias, int e) {
  const float key = bias == nullptr ? scores[e] : scores[e] + bias[e];
  return std::isnan(key) ? -std::numeric_limits<float>::infinity() : key;
}

int PositionOfSlot(const ExpertPermutation& permutation, int slot) {
  for (size_t p = 0; p < permutation.source.size(); ++p) {
    if (permutation.source[p] == slot) return static_cast<int>(p);
  }
  return -1;
}

const float* GroupA(const kernels::GroupedLoraWeights& lora, int g) {
  return lora.a + g * lora.a_group_stride;
}
const float* GroupB(const kernels::GroupedLoraWeights& lora, int g) {
  return lora.b + g * lora.b_group_stride;
}

}  // namespace

void RouterScores(const float* logits, float* scores, int T, int E,
                  kernels::ScoringFunction scoring) {
  for (int t = 0; t < T; ++t) {
    const std::vector<double> s = ScoresRow(logits + t * E, E, scoring);
    for (int e = 0; e < E; ++e) scores[t * E + e] = static_cast<float>(s[e]);
  }
}

void TopK(const float* scores, const float* selection_bias, int T, int E, int k, int16_t* ids,
          const kernels::GroupLimit& limit) {
  const int size = E / limit.groups;
  for (int t = 0; t < T; ++t) {
    std::vector<float> keys(E);
    for (int e = 0; e < E; ++e) keys[e] = Key(scores + t * E, selection_bias, e);
    if (limit.groups > 1) {
      std::vector<std::pair<float, int>> ranked;  // (-group score, group): ascending = best first.
      for (int g = 0; g < limit.groups; ++g) {
        std::vector<float> group(keys.begin() + g * size, keys.begin() + (g + 1) * size);
        std::sort(group.begin(), group.end(), std::greater<float>());
        ranked.emplace_back(-(group[0] + group[1]), g);
      }
      std::sort(ranked.begin(), ranked.end());
      for (int i = limit.kept_groups; i < limit.groups; ++i) {
        const int g = ranked[i].second;
        for (int e = g * size; e < (g + 1) * size; ++e) keys[e] = 0.0f;
      }
    }
    std::vector<bool> taken(E, false);
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        // Strictly greater keeps the first (lowest) id among equal keys.
        if (!taken[e] && (best < 0 || keys[e] > keys[best])) best = e;
      }
      taken[best] = true;
      ids[t * k + j] = static_cast<int16_t>(best);
    }
  }
}

void GateWeights(const float* scores, const int16_t* ids, int T, int E, int k, bool normalize,
                 float* gates) {
  for (int t = 0; t < T; ++t) {
    double z = 0.0;
    for (int j = 0; j < k; ++j) z += scores[t * E + ids[t * k + j]];
    for (int j = 0; j < k; ++j) {
      const double s = scores[t * E + ids[t * k + j]];
      gates[t * k + j] = static_cast<float>(normalize ? s / z : s);
    }
  }
}

void RouterGatesBackward(const float* logits, const float* /*scores*/, const int16_t* ids,
                         const float* dgates, float* dlogits, int T, int E, int k, bool normalize,
                         kernels::ScoringFunction scoring) {
  for (int t = 0; t < T; ++t) {
    const std::vector<double> s = ScoresRow(logits + t * E, E, scoring);
    const int16_t* row_ids = ids + t * k;
    for (int m = 0; m < E; ++m) {
      double sum = 0.0;
      for (int i = 0; i < k; ++i) {
        for (int j = 0; j < k; ++j) {
          sum += dgates[t * k + i] * GateJacobian(s, row_ids, k, i, j, normalize) *
                 ScoreJacobian(s, row_ids[j], m, scoring);
        }
      }
      dlogits[t * E + m] += static_cast<float>(sum);
    }
  }
}

std::string ValidateRoutes(const int16_t* ids, int T, int k, int E) {
  if (T < 0) return "token count " + std::to_string(T) + " is negative";
  if (k < 1 || k > 64) return "top-k " + std::to_string(k) + " out of range [1, 64]";
  if (E < 1 || E > 32767) return "expert count " + std::to_string(E) + " out of range [1, 32767]";
  if (k > E) return "top-k " + std::to_string(k) + " exceeds expert count " + std::to_string(E);
  for (int t = 0; t < T; ++t) {
    const std::string token = "token " + std::to_string(t);
    int missing = 0;
    for (int j = 0; j < k; ++j) {
      const int v = ids[t * k + j];
      if (v == -1) ++missing;
      if (v != -1 && (v < 0 || v >= E)) {
        return token + " slot " + std::to_string(j) + ": expert " + std::to_string(v) +
               " out of range [0, " + std::to_string(E) + ")";
      }
    }
    if (missing == k) continue;
    if (missing > 0) return token + ": mixes -1 and expert ids";
    std::set<int> seen;
    for (int j = 0; j < k; ++j) {
      if (!seen.insert(ids[t * k + j]).second) {
        return token + ": expert " + std::to_string(ids[t * k + j]) + " appears twice";
      }
    }
  }
  return "";
}

ExpertPermutation BuildPermutation(const int16_t* ids, int T, int k, int E) {
  ExpertPermutation permutation;
  permutation.k = k;
  permutation.offsets.push_back(0);
  for (int e = 0; e < E; ++e) {
    for (int s = 0; s < T * k; ++s) {
      if (ids[s] == e) permutation.source.push_back(s);
    }
    permutation.offsets.push_back(static_cast<int>(permutation.source.size()));
  }
  return permutation;
}

void PermuteRows(const float* x, const ExpertPermutation& permutation, float* out, int d) {
  for (size_t p = 0; p < permutation.source.size(); ++p) {
    const int t = permutation.source[p] / permutation.k;
    for (int c = 0; c < d; ++c) out[p * d + c] = x[t * d + c];
  }
}

void PermuteRowsBackward(const float* dout, const ExpertPermutation& permutation, float* dx,
                         int d) {
  const int slots = static_cast<int>(permutation.source.size());
  for (int s = 0; s < slots; ++s) {
    const int p = PositionOfSlot(permutation, s);
    const int t = s / permutation.k;
    for (int c = 0; c < d; ++c) dx[t * d + c] += dout[p * d + c];
  }
}

void UnpermuteAdd(const float* y, const ExpertPermutation& permutation, const float* gates,
                  float* out, int d) {
  const int k = permutation.k;
  const int tokens = static_cast<int>(permutation.source.size()) / k;
  for (int t = 0; t < tokens; ++t) {
    for (int c = 0; c < d; ++c) {
      double sum = out[t * d + c];
      for (int j = 0; j < k; ++j) {
        const int p = PositionOfSlot(permutation, t * k + j);
        sum += double{gates[t * k + j]} * y[p * d + c];
      }
      out[t * d + c] = static_cast<float>(sum);
    }
  }
}

void UnpermuteAddBackward(const float* y, const ExpertPermutation& permutation, const float* gates,
                          const float* dout, float* dy, float* dgates, int d) {
  const int slots = static_cast<int>(permutation.source.size());
  for (int s = 0; s < slots; ++s) {
    const int p = PositionOfSlot(permutation, s);
    const int t = s / permutation.k;
    double dot = 0.0;
    for (int c = 0; c < d; ++c) {
      if (dy != nullptr) dy[p * d + c] += gates[s] * dout[t * d + c];
      dot += double{y[p * d + c]} * dout[t * d + c];
    }
    if (dgates != nullptr) dgates[s] += static_cast<float>(dot);
  }
}

void GroupedLoraForward(const float* x, const int* offsets, int groups, int in, int out,
                        const kernels::GroupedLoraWeights& lora, float* h, float* y) {
  const int r = lora.rank;
  for (int g = 0; g < groups; ++g) {
    const float* a = GroupA(lora, g);
    const float* b = GroupB(lora, g);
    for (int i = offsets[g]; i < offsets[g + 1]; ++i) {
      std::vector<double> hi(r, 0.0);
      for (int q = 0; q < r; ++q) {
        for (int c = 0; c < in; ++c) hi[q] += double{x[i * in + c]} * a[q * in + c];
        h[i * r + q] = static_cast<float>(hi[q]);
      }
      for (int o = 0; o < out; ++o) {
        double sum = 0.0;
        for (int q = 0; q < r; ++q) sum += hi[q] * b[o * r + q];
        y[i * out + o] += static_cast<float>(lora.scale * sum);
      }
    }
  }
}

void GroupedLoraBackward(const float* x, const int* offsets, int groups, int in, int out,
                         const kernels::GroupedLoraWeights& lora, const float* h, const float* dy,
                         float* dx, float* da, float* db) {
  const int r = lora.rank;
  for (int g = 0; g < groups; ++g) {
    const float* a = GroupA(lora, g);
    const float* b = GroupB(lora, g);
    const int lo = offsets[g];
    const int hi = offsets[g + 1];
    std::vector<double> dh((hi - lo) * r, 0.0);
    for (int i = lo; i < hi; ++i) {
      for (int q = 0; q < r; ++q) {
        for (int o = 0; o < out; ++o) {
          dh[(i - lo) * r + q] += lora.scale * double{dy[i * out + o]} * b[o * r + q];
        }
      }
    }
    for (int o = 0; o < out && db != nullptr; ++o) {
      for (int q = 0; q < r; ++q) {
        double sum = 0.0;
        for (int i = lo; i < hi; ++i) sum += double{dy[i * out + o]} * h[i * r + q];
        db[g * lora.b_group_stride + o * r + q] += static_cast<float>(lora.scale * sum);
      }
    }
    for (int q = 0; q < r && da != nullptr; ++q) {
      for (int c = 0; c < in; ++c) {
        double sum = 0.0;
        for (int i = lo; i < hi; ++i) sum += dh[(i - lo) * r + q] * x[i * in + c];
        da[g * lora.a_group_stride + q * in + c] += static_cast<float>(sum);
      }
    }
    for (int i = lo; i < hi && dx != nullptr; ++i) {
      for (int c = 0; c < in; ++c) {
        double sum = 0.0;
        for (int q = 0; q < r; ++q) sum += dh[(i - lo) * r + q] * a[q * in + c];
        dx[i * in + c] += static_cast<float>(sum);
      }
    }
  }
}

}  // namespace tandem::cpu::reference
