#ifndef TANDEM_KERNELS_CUDA_LOSS_H_
#define TANDEM_KERNELS_CUDA_LOSS_H_

#include "absl/status/status.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// Device twins of kernels/cpu/loss.h, same contracts: lse may be null; the backward accumulates
// into dlogits and skips rows whose upstream gradient is zero. Targets must be in [0, vocab).
absl::Status LogSoftmax(const float* logits, float* logp, int rows, int vocab,
                        Stream stream = nullptr);
absl::Status TokenLogProbs(const float* logits, const int* targets, float* out, float* lse,
                           int rows, int vocab, Stream stream = nullptr);
absl::Status TokenLogProbsBackward(const float* logits, const int* targets, const float* dlogprob,
                                   float* dlogits, int rows, int vocab, Stream stream = nullptr);
// One chunk of the vocabulary at a time (kernels/cpu/loss.h's contracts; lse folds in float).
absl::Status FoldLogSumExp(const float* logits, const int* targets, float* lse, float* target_logit,
                           int rows, int first_column, int width, Stream stream = nullptr);
absl::Status TokenLogProbsChunkBackward(const float* logits, const int* targets, const float* lse,
                                        const float* dlogprob, float* dlogits, int rows,
                                        int first_column, int width, Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_LOSS_H_
