#include "kernels/cpu/embedding.h"

#include <algorithm>

namespace tandem::cpu {

void EmbeddingGather(const float* table, const int* ids, float* out, int rows, int dim) {
  for (int r = 0; r < rows; ++r) {
    std::copy_n(table + int64_t{ids[r]} * dim, dim, out + int64_t{r} * dim);
  }
}

void EmbeddingBackward(const float* dout, const int* ids, float* dtable, int rows, int dim) {
  for (int r = 0; r < rows; ++r) {
    float* target = dtable + int64_t{ids[r]} * dim;
    const float* source = dout + int64_t{r} * dim;
    for (int i = 0; i < dim; ++i) target[i] += source[i];
  }
}

}  // namespace tandem::cpu
