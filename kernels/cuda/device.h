#ifndef TANDEM_KERNELS_CUDA_DEVICE_H_
#define TANDEM_KERNELS_CUDA_DEVICE_H_

// Host-side view of the CUDA runtime; callers need no CUDA headers.
namespace tandem::cuda {

// Number of usable GPUs. Without a GPU the runtime reports an error (for example
// "driver version is insufficient") rather than zero devices, so any error counts as none.
int VisibleDeviceCount();

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_DEVICE_H_
