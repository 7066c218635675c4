#include "kernels/cuda/attention.h"

#include <algorithm>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

struct AttentionCase {
  int tokens;
  kernels::AttentionShape shape;
};

class AttentionTest : public CudaTest, public ::testing::WithParamInterface<AttentionCase> {};

// One token of one head of width 1; grouped-query with an odd length; latent attention's wider
// queries and keys than values with its own scale; a long sequence of 128-wide heads.
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(
        AttentionCase{1, kernels::AttentionShape::Standard(1, 1, 1)},
        AttentionCase{37, kernels::AttentionShape::Standard(8, 2, 32)},
        AttentionCase{29, {.heads = 4, .kv_heads = 4, .qk_dim = 48, .v_dim = 32, .scale = 0.11f}},
        AttentionCase{300, kernels::AttentionShape::Standard(4, 1, 128)}));

TEST_P(AttentionTest, ForwardBackwardAndDecodeMatchTheCpu) {
  const int T = GetParam().tokens;
  const kernels::AttentionShape s = GetParam().shape;
  const size_t q_size = size_t{1} * T * s.heads * s.qk_dim;
  const size_t k_size = size_t{1} * T * s.kv_heads * s.qk_dim;
  const size_t v_size = size_t{1} * T * s.kv_heads * s.v_dim;
  const size_t out_size = size_t{1} * T * s.heads * s.v_dim;
  const size_t probs_size = size_t{1} * s.heads * T * T;
  const std::vector<float> q = RandomFloats(q_size, 101), k = RandomFloats(k_size, 102);
  const std::vector<float> v = RandomFloats(v_size, 103), dout = RandomFloats(out_size, 104);
  std::vector<float> out(out_size), probs(probs_size);
  std::vector<float> dq = RandomFloats(q_size, 105), dk = RandomFloats(k_size, 106);
  std::vector<float> dv = RandomFloats(v_size, 107);
  DeviceArray<float> q_d = Upload(q), k_d = Upload(k), v_d = Upload(v), dout_d = Upload(dout);
  DeviceArray<float> out_d = DeviceZeros<float>(out_size);
  DeviceArray<float> probs_d = DeviceZeros<float>(probs_size);
  DeviceArray<float> dq_d = Upload(dq), dk_d = Upload(dk), dv_d = Upload(dv);
  DeviceArray<float> workspace = DeviceZeros<float>(AttentionBackwardWorkspaceFloats(T, s));

  cpu::CausalAttention(q.data(), k.data(), v.data(), out.data(), probs.data(), T, s);
  cpu::CausalAttentionBackward(q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(),
                               dk.data(), dv.data(), T, s);
  ASSERT_TRUE(
      cuda::CausalAttention(q_d.data(), k_d.data(), v_d.data(), out_d.data(), probs_d.data(), T, s)
          .ok());
  ASSERT_TRUE(cuda::CausalAttentionBackward(q_d.data(), k_d.data(), v_d.data(), probs_d.data(),
                                            dout_d.data(), dq_d.data(), dk_d.data(), dv_d.data(), T,
                                            s, workspace.data())
                  .ok());
  ExpectAllNear(Download(probs_d), probs, 1e-6f, 1e-5f);
  ExpectAllNear(Download(out_d), out, 1e-5f, 1e-5f);
  // Gradients sum up to T·group terms in a different order than BLAS.
  ExpectAllNear(Download(dq_d), dq, 1e-5f, 1e-4f);
  ExpectAllNear(Download(dk_d), dk, 1e-5f, 1e-4f);
  ExpectAllNear(Download(dv_d), dv, 1e-5f, 1e-4f);

  // Decode of the last token over the whole sequence as its cache.
  const size_t last_q = size_t{1} * (T - 1) * s.heads * s.qk_dim;
  std::vector<float> decoded(size_t{1} * s.heads * s.v_dim), scratch(T);
  cpu::DecodeAttention(q.data() + last_q, k.data(), v.data(), T, decoded.data(), s, scratch.data());
  DeviceArray<float> decoded_d = DeviceZeros<float>(decoded.size());
  DeviceArray<float> scratch_d = DeviceZeros<float>(size_t{1} * s.heads * T);
  ASSERT_TRUE(cuda::DecodeAttention(q_d.data() + last_q, k_d.data(), v_d.data(), T,
                                    decoded_d.data(), s, scratch_d.data())
                  .ok());
  ExpectAllNear(Download(decoded_d), decoded, 1e-5f, 1e-5f);
}

// Sequences of different lengths decoded in one launch, each over its own cache, against the
// CPU's decode of each; then each row's key and value appended to its cache in one launch.
TEST_F(CudaTest, BatchedDecodeAndAppendMatchTheCpuRowByRow) {
  const kernels::AttentionShape s = kernels::AttentionShape::Standard(8, 2, 16);
  const std::vector<int> lens = {1, 7, 33, 2, 64};
  const int rows = static_cast<int>(lens.size()), max_len = 64;
  const int q_width = s.heads * s.qk_dim, k_width = s.kv_heads * s.qk_dim;
  const int v_width = s.kv_heads * s.v_dim, out_width = s.heads * s.v_dim;
  const std::vector<float> q = RandomFloats(size_t{1} * rows * q_width, 111);
  std::vector<std::vector<float>> keys, values;
  std::vector<DeviceArray<float>> keys_d, values_d;
  std::vector<float> expected(size_t{1} * rows * out_width), scratch(max_len);
  for (int r = 0; r < rows; ++r) {
    keys.push_back(RandomFloats(size_t{1} * (lens[r] + 1) * k_width, 112 + r));
    values.push_back(RandomFloats(size_t{1} * (lens[r] + 1) * v_width, 212 + r));
    keys_d.push_back(Upload(keys[r]));
    values_d.push_back(Upload(values[r]));
    cpu::DecodeAttention(q.data() + r * q_width, keys[r].data(), values[r].data(), lens[r],
                         expected.data() + r * out_width, s, scratch.data());
  }
  std::vector<const float*> key_pointers, value_pointers;
  std::vector<float*> key_targets, value_targets;
  for (int r = 0; r < rows; ++r) {
    key_pointers.push_back(keys_d[r].data());
    value_pointers.push_back(values_d[r].data());
    key_targets.push_back(keys_d[r].data());
    value_targets.push_back(values_d[r].data());
  }
  DeviceArray<const float*> key_table = Upload(key_pointers), value_table = Upload(value_pointers);
  DeviceArray<int> lens_d = Upload(lens);
  DeviceArray<float> q_d = Upload(q), out_d = DeviceZeros<float>(expected.size());
  DeviceArray<float> scratch_d = DeviceZeros<float>(size_t{1} * rows * s.heads * max_len);
  ASSERT_TRUE(BatchedDecodeAttention(q_d.data(), key_table.data(), value_table.data(),
                                     lens_d.data(), rows, max_len, out_d.data(), s,
                                     scratch_d.data())
                  .ok());
  ExpectAllNear(Download(out_d), expected, 1e-5f, 1e-5f);

  // Append at position lens[r] (the slot after the cached ones).
  const std::vector<float> k = RandomFloats(size_t{1} * rows * k_width, 311);
  const std::vector<float> v = RandomFloats(size_t{1} * rows * v_width, 312);
  DeviceArray<float*> key_target_table = Upload(key_targets);
  DeviceArray<float*> value_target_table = Upload(value_targets);
  DeviceArray<float> k_d = Upload(k), v_d = Upload(v);
  ASSERT_TRUE(AppendToCaches(k_d.data(), v_d.data(), key_target_table.data(),
                             value_target_table.data(), lens_d.data(), rows, k_width, v_width)
                  .ok());
  for (int r = 0; r < rows; ++r) {
    std::copy_n(k.begin() + r * k_width, k_width, keys[r].begin() + lens[r] * k_width);
    std::copy_n(v.begin() + r * v_width, v_width, values[r].begin() + lens[r] * v_width);
    ExpectAllNear(Download(keys_d[r]), keys[r], 0.0f);
    ExpectAllNear(Download(values_d[r]), values[r], 0.0f);
  }
}

TEST_F(CudaTest, AttentionRejectsABadShapeOrAnEmptyCache) {
  const kernels::AttentionShape bad =
      kernels::AttentionShape::Standard(6, 4, 8);  // 4 does not divide 6.
  EXPECT_EQ(cuda::CausalAttention(nullptr, nullptr, nullptr, nullptr, nullptr, 3, bad).code(),
            absl::StatusCode::kInvalidArgument);
  const kernels::AttentionShape good = kernels::AttentionShape::Standard(4, 2, 8);
  EXPECT_EQ(cuda::DecodeAttention(nullptr, nullptr, nullptr, 0, nullptr, good, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cuda::CausalAttention(nullptr, nullptr, nullptr, nullptr, nullptr, 0, good).ok());
}

}  // namespace
}  // namespace tandem::cuda
