#include "kernels/cuda/loss.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/loss.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

class LossTest : public CudaTest, public ::testing::WithParamInterface<std::pair<int, int>> {};

// Rows x vocab: one row of a tiny vocabulary, odd sizes, Qwen3's vocabulary.
INSTANTIATE_TEST_SUITE_P(Shapes, LossTest,
                         ::testing::Values(std::pair{1, 3}, std::pair{37, 1001},
                                           std::pair{9, 151936}));

TEST_P(LossTest, LogProbsAndTheirGradientMatchTheCpu) {
  const auto [rows, vocab] = GetParam();
  const size_t n = static_cast<size_t>(rows) * vocab;
  const std::vector<float> logits = RandomFloats(n, 71, -20.0f, 20.0f);
  const std::vector<int> targets = RandomInts(rows, 72, vocab);
  std::vector<float> dlogprob = RandomFloats(rows, 73);
  dlogprob[0] = 0.0f;  // A masked token: its row must be left alone.
  std::vector<float> logp(n), token_logp(rows), lse(rows), dlogits = RandomFloats(n, 74);
  DeviceArray<float> logits_d = Upload(logits), dlogprob_d = Upload(dlogprob);
  DeviceArray<int> targets_d = Upload(targets);
  DeviceArray<float> logp_d = DeviceZeros<float>(n), token_logp_d = DeviceZeros<float>(rows);
  DeviceArray<float> lse_d = DeviceZeros<float>(rows), dlogits_d = Upload(dlogits);

  cpu::LogSoftmax(logits.data(), logp.data(), rows, vocab);
  cpu::TokenLogProbs(logits.data(), targets.data(), token_logp.data(), lse.data(), rows, vocab);
  cpu::TokenLogProbsBackward(logits.data(), targets.data(), dlogprob.data(), dlogits.data(), rows,
                             vocab);
  ASSERT_TRUE(LogSoftmax(logits_d.data(), logp_d.data(), rows, vocab).ok());
  ASSERT_TRUE(TokenLogProbs(logits_d.data(), targets_d.data(), token_logp_d.data(), lse_d.data(),
                            rows, vocab)
                  .ok());
  ASSERT_TRUE(TokenLogProbsBackward(logits_d.data(), targets_d.data(), dlogprob_d.data(),
                                    dlogits_d.data(), rows, vocab)
                  .ok());
  // Values reach |40|; the GPU's float sum of exps is within ~1e-6 relative of the CPU's double.
  ExpectAllNear(Download(lse_d), lse, 1e-5f, 1e-6f);
  ExpectAllNear(Download(logp_d), logp, 2e-5f, 1e-6f);
  ExpectAllNear(Download(token_logp_d), token_logp, 2e-5f, 1e-6f);
  ExpectAllNear(Download(dlogits_d), dlogits, 1e-6f, 1e-5f);
}

TEST_P(LossTest, VocabularyChunksFoldToTheWholeRowsLogProbsAndGradient) {
  const auto [rows, vocab] = GetParam();
  const size_t n = static_cast<size_t>(rows) * vocab;
  const std::vector<float> logits = RandomFloats(n, 81, -20.0f, 20.0f);
  const std::vector<int> targets = RandomInts(rows, 82, vocab);
  std::vector<float> dlogprob = RandomFloats(rows, 83);
  dlogprob[0] = 0.0f;
  std::vector<float> token_logp(rows), lse(rows), dlogits(n, 0.0f);
  cpu::TokenLogProbs(logits.data(), targets.data(), token_logp.data(), lse.data(), rows, vocab);
  cpu::TokenLogProbsBackward(logits.data(), targets.data(), dlogprob.data(), dlogits.data(), rows,
                             vocab);

  const int width = (vocab + 2) / 3;  // Three chunks, the last one shorter (or empty of rows).
  DeviceArray<int> targets_d = Upload(targets);
  DeviceArray<float> dlogprob_d = Upload(dlogprob);
  DeviceArray<float> lse_d = Upload(std::vector<float>(rows, -INFINITY));
  DeviceArray<float> target_logit_d = DeviceZeros<float>(rows);
  std::vector<float> chunk_dlogits(n);
  for (int pass = 0; pass < 2; ++pass) {  // Fold every chunk, then backpropagate each.
    for (int first = 0; first < vocab; first += width) {
      const int columns = std::min(width, vocab - first);
      std::vector<float> chunk(static_cast<size_t>(rows) * columns);
      for (int r = 0; r < rows; ++r) {
        std::copy_n(&logits[static_cast<size_t>(r) * vocab + first], columns,
                    &chunk[static_cast<size_t>(r) * columns]);
      }
      DeviceArray<float> chunk_d = Upload(chunk), dchunk_d = DeviceZeros<float>(chunk.size());
      if (pass == 0) {
        ASSERT_TRUE(FoldLogSumExp(chunk_d.data(), targets_d.data(), lse_d.data(),
                                  target_logit_d.data(), rows, first, columns)
                        .ok());
        continue;
      }
      ASSERT_TRUE(TokenLogProbsChunkBackward(chunk_d.data(), targets_d.data(), lse_d.data(),
                                             dlogprob_d.data(), dchunk_d.data(), rows, first,
                                             columns)
                      .ok());
      const std::vector<float> dchunk = Download(dchunk_d);
      for (int r = 0; r < rows; ++r) {
        std::copy_n(&dchunk[static_cast<size_t>(r) * columns], columns,
                    &chunk_dlogits[static_cast<size_t>(r) * vocab + first]);
      }
    }
  }
  const std::vector<float> folded = Download(lse_d), target_logit = Download(target_logit_d);
  std::vector<float> chunk_logp(rows);
  for (int r = 0; r < rows; ++r) chunk_logp[r] = target_logit[r] - folded[r];
  ExpectAllNear(folded, lse, 1e-5f, 1e-6f);
  ExpectAllNear(chunk_logp, token_logp, 2e-5f, 1e-6f);
  ExpectAllNear(chunk_dlogits, dlogits, 1e-6f, 1e-5f);
}

TEST_F(CudaTest, LossKernelsWithoutRowsAreNoOps) {
  EXPECT_TRUE(LogSoftmax(nullptr, nullptr, 0, 10).ok());
  EXPECT_TRUE(TokenLogProbs(nullptr, nullptr, nullptr, nullptr, 0, 10).ok());
  EXPECT_TRUE(TokenLogProbsBackward(nullptr, nullptr, nullptr, nullptr, 0, 10).ok());
}

}  // namespace
}  // namespace tandem::cuda
