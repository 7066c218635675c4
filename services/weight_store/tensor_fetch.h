#ifndef TANDEM_SERVICES_WEIGHT_STORE_TENSOR_FETCH_H_
#define TANDEM_SERVICES_WEIGHT_STORE_TENSOR_FETCH_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/weight_store/adapter_store.h"
#include "tandem/internal/v1/weight_store_ucx.pb.h"
#include "tandem/weightstore/v1/weight_store.pb.h"

namespace tandem::weight_store {

// The chunk sizes a FetchTensors stream may be asked for (max_chunk_bytes; 0: the largest).
inline constexpr size_t kMinFetchChunkBytes = size_t{1} << 20;
inline constexpr size_t kMaxFetchChunkBytes = size_t{4} << 20;

// One FetchTensors call apart from its stream (the core of the gRPC data path, as ReadPlanner is
// of the UCX one): the version found, the reads planned for the consumer's layout with every
// refusal made before any byte goes out, then each tensor in turn assembled, converted to the
// asked dtype and checksummed.
class TensorFetch {
 public:
  // INVALID_ARGUMENT for a bad chunk size, version, layout, tensor name or a dtype a tensor
  // cannot be converted to; NOT_FOUND for a version the store does not hold.
  static absl::StatusOr<TensorFetch> Start(AdapterStore& store,
                                           const weightstore::v1::FetchTensorsRequest& request);

  struct Tensor {
    weightstore::v1::TargetTensor header;  // Its spec in the asked dtype, byte size, checksum.
    std::string bytes;
  };
  bool done() const { return next_ >= plan_.size(); }
  // The next tensor of the plan; call while !done().
  absl::StatusOr<Tensor> Next();

  size_t chunk_bytes() const { return chunk_bytes_; }

 private:
  TensorFetch() = default;

  std::shared_ptr<const CommittedVersion> version_;  // Held while the stream runs.
  std::vector<internal::v1::PlannedTensor> plan_;
  type::v1::Dtype target_dtype_ = type::v1::DTYPE_UNSPECIFIED;
  size_t chunk_bytes_ = kMaxFetchChunkBytes;
  size_t next_ = 0;
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_TENSOR_FETCH_H_
