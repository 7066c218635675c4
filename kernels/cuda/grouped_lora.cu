#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_lora.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda {
namespace {

bool Degenerate(int groups, int in, int out, int rank, int max_rows) {
  return groups <= 0 || in <= 0 || out <= 0 || rank <= 0 || max_rows <= 0;
}

}  // namespace

absl::Status GroupedLoraForward(const float* x, const int* offsets, int groups, int max_rows,
                                int in, int out, const kernels::GroupedLoraWeights& lora, float* h,
                                float* y, Stream stream) {
  const int r = lora.rank;
  if (Degenerate(groups, in, out, r, max_rows)) return absl::OkStatus();
  // h = x_g · A_gᵀ, then y_g += scale · h_g · B_gᵀ.
  const RowGroupedGemm shrink{.a = x,
                              .lda = in,
                              .w = lora.a,
                              .w_group_stride = lora.a_group_stride,
                              .ldw = in,
                              .transpose_w = true,
                              .c = h,
                              .ldc = r,
                              .n = r,
                              .k = in};
  if (absl::Status status = GroupedGemm(shrink, offsets, groups, max_rows, stream); !status.ok()) {
    return status;
  }
  const RowGroupedGemm expand{.a = h,
                              .lda = r,
                              .w = lora.b,
                              .w_group_stride = lora.b_group_stride,
                              .ldw = r,
                              .transpose_w = true,
                              .c = y,
                              .ldc = out,
                              .n = out,
                              .k = r,
                              .alpha = lora.scale,
                              .beta = 1.0f};
  return GroupedGemm(expand, offsets, groups, max_rows, stream);
}

absl::Status GroupedLoraBackward(const float* x, const int* offsets, int groups, int max_rows,
                                 int in, int out, const kernels::GroupedLoraWeights& lora,
                                 const float* h, const float* dy, float* dx, float* da, float* db,
                                 float* dh_workspace, Stream stream) {
  const int r = lora.rank;
  if (Degenerate(groups, in, out, r, max_rows)) return absl::OkStatus();
  if (db != nullptr) {  // dB_g += scale · dy_gᵀ · h_g
    const ReductionGroupedGemm grad_b{.a = dy,
                                      .lda = out,
                                      .b = h,
                                      .ldb = r,
                                      .c = db,
                                      .c_group_stride = lora.b_group_stride,
                                      .ldc = r,
                                      .m = out,
                                      .n = r,
                                      .alpha = lora.scale};
    if (absl::Status status = GroupedGemm(grad_b, offsets, groups, stream); !status.ok()) {
      return status;
    }
  }
  if (dx == nullptr && da == nullptr) return absl::OkStatus();
  // dh_g = scale · dy_g · B_g
  const RowGroupedGemm grad_h{.a = dy,
                              .lda = out,
                              .w = lora.b,
                              .w_group_stride = lora.b_group_stride,
                              .ldw = r,
                              .transpose_w = false,
                              .c = dh_workspace,
                              .ldc = r,
                              .n = r,
                              .k = out,
                              .alpha = lora.scale};
  if (absl::Status status = GroupedGemm(grad_h, offsets, groups, max_rows, stream); !status.ok()) {
    return status;
  }
  if (da != nullptr) {  // dA_g += dh_gᵀ · x_g
    const ReductionGroupedGemm grad_a{.a = dh_workspace,
                                      .lda = r,
                                      .b = x,
                                      .ldb = in,
                                      .c = da,
                                      .c_group_stride = lora.a_group_stride,
                                      .ldc = in,
                                      .m = r,
                                      .n = in};
    if (absl::Status status = GroupedGemm(grad_a, offsets, groups, stream); !status.ok()) {
      return status;
    }
  }
  if (dx == nullptr) return absl::OkStatus();
  // dx_g += dh_g · A_g
  const RowGroupedGemm grad_x{.a = dh_workspace,
                              .lda = r,
                              .w = lora.a,
                              .w_group_stride = lora.a_group_stride,
                              .ldw = in,
                              .transpose_w = false,
                              .c = dx,
                              .ldc = in,
                              .n = in,
                              .k = r,
                              .beta = 1.0f};
  return GroupedGemm(grad_x, offsets, groups, max_rows, stream);
}

}  // namespace tandem::cuda
