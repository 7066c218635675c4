#include "kernels/cpu/loss.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tandem::cpu {
namespace {

// log Σ exp(x_j), with the sum in double so that wide vocabularies do not lose the tail.
float LogSumExp(const float* x, int n) {
  const float max = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int j = 0; j < n; ++j) sum += std::exp(x[j] - max);
  return max + static_cast<float>(std::log(sum));
}

// log(exp(a) + exp(b)), exact when either is −inf (nothing folded in yet).
float AddLogSumExps(float a, float b) {
  if (std::isinf(a) && a < 0) return b;
  if (std::isinf(b) && b < 0) return a;
  const float high = std::max(a, b);
  return high + std::log1p(std::exp(std::min(a, b) - high));
}

}  // namespace

void LogSoftmax(const float* logits, float* logp, int rows, int vocab) {
  for (int r = 0; r < rows; ++r) {
    const float* x = logits + static_cast<int64_t>(r) * vocab;
    float* y = logp + static_cast<int64_t>(r) * vocab;
    const float lse = LogSumExp(x, vocab);
    for (int j = 0; j < vocab; ++j) y[j] = x[j] - lse;
  }
}

void TokenLogProbs(const float* logits, const int* targets, float* out, float* lse, int rows,
                   int vocab) {
  for (int r = 0; r < rows; ++r) {
    const float* x = logits + static_cast<int64_t>(r) * vocab;
    const float row_lse = LogSumExp(x, vocab);
    out[r] = x[targets[r]] - row_lse;
    if (lse != nullptr) lse[r] = row_lse;
  }
}

void TokenLogProbsBackward(const float* logits, const int* targets, const float* dlogprob,
                           float* dlogits, int rows, int vocab) {
  for (int r = 0; r < rows; ++r) {
    const float g = dlogprob[r];
    // A zero upstream gradient (masked or padded token) contributes nothing; skip the exps.
    if (g == 0.0f) continue;
    const float* x = logits + static_cast<int64_t>(r) * vocab;
    float* dx = dlogits + static_cast<int64_t>(r) * vocab;
    const float row_lse = LogSumExp(x, vocab);
    for (int j = 0; j < vocab; ++j) dx[j] -= g * std::exp(x[j] - row_lse);
    dx[targets[r]] += g;
  }
}

void FoldLogSumExp(const float* logits, const int* targets, float* lse, float* target_logit,
                   int rows, int first_column, int width) {
  for (int r = 0; r < rows; ++r) {
    const float* x = logits + static_cast<int64_t>(r) * width;
    lse[r] = AddLogSumExps(lse[r], LogSumExp(x, width));
    const int column = targets[r] - first_column;
    if (column >= 0 && column < width) target_logit[r] = x[column];
  }
}

void TokenLogProbsChunkBackward(const float* logits, const int* targets, const float* lse,
                                const float* dlogprob, float* dlogits, int rows, int first_column,
                                int width) {
  for (int r = 0; r < rows; ++r) {
    const float g = dlogprob[r];
    float* dx = dlogits + static_cast<int64_t>(r) * width;
    if (g == 0.0f) {
      std::fill(dx, dx + width, 0.0f);
      continue;
    }
    const float* x = logits + static_cast<int64_t>(r) * width;
    for (int j = 0; j < width; ++j) dx[j] = -(g * std::exp(x[j] - lse[r]));
    const int column = targets[r] - first_column;
    if (column >= 0 && column < width) dx[column] += g;
  }
}

}  // namespace tandem::cpu
