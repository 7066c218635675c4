#ifndef TANDEM_KERNELS_CUDA_ROW_TILES_CUH_
#define TANDEM_KERNELS_CUDA_ROW_TILES_CUH_

namespace tandem::cuda {

// Which group and which of its row tiles block `tile` (counted over all groups) computes;
// false past the last tile. Groups are at most a few hundred: a scan beats a host round trip.
template <int kTile>
__device__ bool FindRowTile(const int* offsets, int groups, int tile, int& group, int& first_row,
                            int& last_row) {
  for (int g = 0; g < groups; ++g) {
    const int rows = offsets[g + 1] - offsets[g];
    const int tiles = (rows + kTile - 1) / kTile;
    if (tile < tiles) {
      group = g;
      first_row = offsets[g] + tile * kTile;
      last_row = offsets[g + 1];
      return true;
    }
    tile -= tiles;
  }
  return false;
}

// Row tiles a launch over `groups` groups of `max_rows` rows in all needs at most:
// Σ_g ceil(rows_g / kTile) <= max_rows / kTile + groups (blocks past the last tile exit).
template <int kTile>
int64_t RowTileBound(int max_rows, int groups) {
  return max_rows / kTile + groups;
}

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_ROW_TILES_CUH_
