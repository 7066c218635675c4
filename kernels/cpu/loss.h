#ifndef TANDEM_KERNELS_CPU_LOSS_H_
#define TANDEM_KERNELS_CPU_LOSS_H_

namespace tandem::cpu {

// All three subtract the row maximum before exponentiating, so logits of any finite size give
// finite results.

// logp[rows, vocab] = log_softmax(logits) row-wise (max-subtracted).
void LogSoftmax(const float* logits, float* logp, int rows, int vocab);

// out[r] = log_softmax(logits[r])[targets[r]]; lse[r] (log-sum-exp) saved if non-null.
// targets[r] must lie in [0, vocab).
void TokenLogProbs(const float* logits, const int* targets, float* out, float* lse, int rows,
                   int vocab);

// dlogits[r, j] += dlogprob[r] * (1[j == targets[r]] - softmax(logits[r])_j). Cross-entropy is
// -logprob, so this is its backward too.
void TokenLogProbsBackward(const float* logits, const int* targets, const float* dlogprob,
                           float* dlogits, int rows, int vocab);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_LOSS_H_
