#include "engine/model_ops.h"

#include <algorithm>

namespace tandem::engine {

bool BackendCapabilities::Accepts(WeightFormat format) const {
  return std::find(weight_formats.begin(), weight_formats.end(), format) != weight_formats.end();
}

LoraProjection LoraProjection::FromGroup(int first_group) const {
  LoraProjection moved = *this;
  moved.a = a + first_group * a_group_stride;
  moved.b = b + first_group * b_group_stride;
  return moved;
}

void ModelOps::AppendAndAttend(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                               const std::vector<Ref<float>>& k_caches,
                               const std::vector<Ref<float>>& v_caches, const int* positions,
                               Ref<float> out, const kernels::AttentionShape& shape) {
  const int q_width = shape.heads * shape.qk_dim, out_width = shape.heads * shape.v_dim;
  const int k_width = shape.kv_heads * shape.qk_dim, v_width = shape.kv_heads * shape.v_dim;
  for (size_t row = 0; row < k_caches.size(); ++row) {
    const int position = positions[row];
    Copy(k + row * k_width, k_caches[row] + int64_t{position} * k_width, k_width);
    Copy(v + row * v_width, v_caches[row] + int64_t{position} * v_width, v_width);
    DecodeAttention(q + row * q_width, k_caches[row], v_caches[row], position + 1,
                    out + row * out_width, shape);
  }
}

}  // namespace tandem::engine
