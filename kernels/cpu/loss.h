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

// The two above over one chunk of the vocabulary at a time, so that no row's whole logits need
// exist: `logits` [rows, width] are columns [first_column, first_column + width) of each row.
// FoldLogSumExp folds them into each row's running log-sum-exp `lse` (−inf before the row's
// first chunk) and writes target_logit[r] where targets[r] lies among them; after the last chunk
// log p = target_logit − lse. With one chunk, lse equals TokenLogProbs' bit for bit.
void FoldLogSumExp(const float* logits, const int* targets, float* lse, float* target_logit,
                   int rows, int first_column, int width);
// dlogits[r, j] = dlogprob[r] * (1[first_column + j == targets[r]] - exp(logits[r, j] - lse[r]))
// with the final `lse`; rows whose dlogprob is 0 get zeros.
void TokenLogProbsChunkBackward(const float* logits, const int* targets, const float* lse,
                                const float* dlogprob, float* dlogits, int rows, int first_column,
                                int width);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_LOSS_H_
