#include "kernels/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace tandem::cpu {
namespace {

void SoftmaxRow(const float* logits, float* scores, int E) {
  // Subtracting the max keeps exp from overflowing without changing the result.
  const float max = *std::max_element(logits, logits + E);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    scores[e] = std::exp(logits[e] - max);
    sum += scores[e];
  }
  const float inv = 1.0f / sum;
  for (int e = 0; e < E; ++e) scores[e] *= inv;
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Selection keys for one row. NaN would break the strict weak ordering that partial_sort needs
// (and could select an id twice), so it ranks lowest.
void SelectionKeys(const float* scores, const float* bias, int E, float* keys) {
  for (int e = 0; e < E; ++e) {
    const float key = bias == nullptr ? scores[e] : scores[e] + bias[e];
    keys[e] = std::isnan(key) ? -std::numeric_limits<float>::infinity() : key;
  }
}

float SelectedSum(const float* scores, const int16_t* ids, int k) {
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += scores[ids[j]];
  return sum;
}

// dlogits for one row. ds holds d(loss)/d(score) of the selected experts, slot-aligned with ids.
void ScoreBackwardRow(const float* logits, const float* scores, const int16_t* ids, const float* ds,
                      float* dlogits, int E, int k, kernels::ScoringFunction scoring) {
  if (scoring == kernels::ScoringFunction::kSigmoid) {
    // 1 - sigmoid(l) taken as sigmoid(-l) keeps precision where the score is close to 1.
    for (int j = 0; j < k; ++j) {
      const int e = ids[j];
      dlogits[e] += ds[j] * scores[e] * Sigmoid(-logits[e]);
    }
    return;
  }
  // Softmax: dl_m = s_m (ds_m - sum_n s_n ds_n); ds is zero off the selected set.
  float dot = 0.0f;
  for (int j = 0; j < k; ++j) dot += scores[ids[j]] * ds[j];
  for (int e = 0; e < E; ++e) dlogits[e] -= scores[e] * dot;
  for (int j = 0; j < k; ++j) dlogits[ids[j]] += scores[ids[j]] * ds[j];
}

// Pulls dgates back through g_i = s_i / Z into ds (slot-aligned).
void NormalizeBackwardRow(const float* scores, const int16_t* ids, const float* dgates, int k,
                          float* ds) {
  const float inv_z = 1.0f / SelectedSum(scores, ids, k);
  float dot = 0.0f;  // sum_j g_j dg_j
  for (int j = 0; j < k; ++j) dot += scores[ids[j]] * inv_z * dgates[j];
  for (int j = 0; j < k; ++j) ds[j] = (dgates[j] - dot) * inv_z;
}

// Normalizing a softmax over the selected set cancels the full partition function, so the gates
// are a softmax of the selected logits alone (R3's formula): dl_i = g_i (dg_i - sum_j g_j dg_j) on
// the selected set and exactly zero elsewhere, where chaining through the full softmax Jacobian
// would leave rounding residue on every expert.
void SelectedSoftmaxBackwardRow(const float* scores, const int16_t* ids, const float* dgates,
                                float* dlogits, int k) {
  const float inv_z = 1.0f / SelectedSum(scores, ids, k);
  float dot = 0.0f;
  for (int j = 0; j < k; ++j) dot += scores[ids[j]] * inv_z * dgates[j];
  for (int j = 0; j < k; ++j) dlogits[ids[j]] += scores[ids[j]] * inv_z * (dgates[j] - dot);
}

// Zeroes the keys of every group outside the kept ones (see kernels::GroupLimit).
void MaskWeakGroups(const kernels::GroupLimit& limit, int E, float* keys) {
  const int size = E / limit.groups;
  std::vector<float> group_scores(limit.groups);
  for (int g = 0; g < limit.groups; ++g) {
    const float* group = keys + g * size;
    const int best = static_cast<int>(std::max_element(group, group + size) - group);
    float second = -std::numeric_limits<float>::infinity();
    for (int e = 0; e < size; ++e) {
      if (e != best) second = std::max(second, group[e]);
    }
    group_scores[g] = group[best] + second;
  }
  std::vector<int> groups(limit.groups);
  std::iota(groups.begin(), groups.end(), 0);
  std::partial_sort(
      groups.begin(), groups.begin() + limit.kept_groups, groups.end(), [&](int a, int b) {
        return group_scores[a] > group_scores[b] || (group_scores[a] == group_scores[b] && a < b);
      });
  std::vector<bool> kept(limit.groups, false);
  for (int i = 0; i < limit.kept_groups; ++i) kept[groups[i]] = true;
  for (int g = 0; g < limit.groups; ++g) {
    if (!kept[g]) std::fill(keys + g * size, keys + (g + 1) * size, 0.0f);
  }
}

}  // namespace

void RouterScores(const float* logits, float* scores, int T, int E,
                  kernels::ScoringFunction scoring) {
  if (scoring == kernels::ScoringFunction::kSoftmax) {
    for (int t = 0; t < T; ++t) SoftmaxRow(logits + int64_t{t} * E, scores + int64_t{t} * E, E);
    return;
  }
  const int64_t n = int64_t{T} * E;
  for (int64_t i = 0; i < n; ++i) scores[i] = Sigmoid(logits[i]);
}

void TopK(const float* scores, const float* selection_bias, int T, int E, int k, int16_t* ids,
          const kernels::GroupLimit& limit) {
  std::vector<float> keys(E);
  std::vector<int> order(E);
  const auto better = [&keys](int a, int b) {
    return keys[a] > keys[b] || (keys[a] == keys[b] && a < b);
  };
  for (int t = 0; t < T; ++t) {
    SelectionKeys(scores + int64_t{t} * E, selection_bias, E, keys.data());
    if (limit.groups > 1) MaskWeakGroups(limit, E, keys.data());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
    for (int j = 0; j < k; ++j) ids[int64_t{t} * k + j] = static_cast<int16_t>(order[j]);
  }
}

void GateWeights(const float* scores, const int16_t* ids, int T, int E, int k, bool normalize,
                 float* gates) {
  for (int t = 0; t < T; ++t) {
    const float* row = scores + int64_t{t} * E;
    const int16_t* row_ids = ids + int64_t{t} * k;
    const float inv_z = normalize ? 1.0f / SelectedSum(row, row_ids, k) : 1.0f;
    for (int j = 0; j < k; ++j) gates[int64_t{t} * k + j] = row[row_ids[j]] * inv_z;
  }
}

void RouterGatesBackward(const float* logits, const float* scores, const int16_t* ids,
                         const float* dgates, float* dlogits, int T, int E, int k, bool normalize,
                         kernels::ScoringFunction scoring) {
  std::vector<float> ds(k);
  for (int t = 0; t < T; ++t) {
    const int64_t row = int64_t{t} * E;
    const int16_t* row_ids = ids + int64_t{t} * k;
    const float* row_dgates = dgates + int64_t{t} * k;
    if (normalize && scoring == kernels::ScoringFunction::kSoftmax) {
      SelectedSoftmaxBackwardRow(scores + row, row_ids, row_dgates, dlogits + row, k);
      continue;
    }
    if (normalize) {
      NormalizeBackwardRow(scores + row, row_ids, row_dgates, k, ds.data());
    } else {
      std::copy(row_dgates, row_dgates + k, ds.begin());
    }
    ScoreBackwardRow(logits + row, scores + row, row_ids, ds.data(), dlogits + row, E, k, scoring);
  }
}

}  // namespace tandem::cpu
