#ifndef TANDEM_KERNELS_CPU_EMBEDDING_H_
#define TANDEM_KERNELS_CPU_EMBEDDING_H_

#include <cstdint>

namespace tandem::cpu {

// out[r] = table[ids[r]] for `rows` rows of `dim` floats; ids must be in [0, vocab).
void EmbeddingGather(const float* table, const int* ids, float* out, int rows, int dim);

// dtable[ids[r]] += dout[r]: the gather's gradient (rows sharing an id add up).
void EmbeddingBackward(const float* dout, const int* ids, float* dtable, int rows, int dim);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_EMBEDDING_H_
