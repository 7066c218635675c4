#include "kernels/routes.h"

#include <cstdint>
#include <string>

namespace tandem::kernels {
namespace {

std::string TokenPrefix(int t) { return "token " + std::to_string(t); }

std::string CheckShape(int T, int k, int E) {
  if (T < 0) return "token count " + std::to_string(T) + " is negative";
  if (k < 1 || k > 64) return "top-k " + std::to_string(k) + " out of range [1, 64]";
  if (E < 1 || E > 32767) return "expert count " + std::to_string(E) + " out of range [1, 32767]";
  if (k > E) return "top-k " + std::to_string(k) + " exceeds expert count " + std::to_string(E);
  return "";
}

std::string CheckRow(const int16_t* row, int t, int k, int E) {
  int missing = 0;
  for (int j = 0; j < k; ++j) {
    if (row[j] == -1) {
      ++missing;
    } else if (row[j] < 0 || row[j] >= E) {
      return TokenPrefix(t) + " slot " + std::to_string(j) + ": expert " + std::to_string(row[j]) +
             " out of range [0, " + std::to_string(E) + ")";
    }
  }
  if (missing == k) return "";
  if (missing > 0) return TokenPrefix(t) + ": mixes -1 and expert ids";
  // k <= 64, so the quadratic scan is cheaper than any set.
  for (int j = 1; j < k; ++j) {
    for (int i = 0; i < j; ++i) {
      if (row[i] == row[j]) {
        return TokenPrefix(t) + ": expert " + std::to_string(row[j]) + " appears twice";
      }
    }
  }
  return "";
}

}  // namespace

std::string ValidateRoutes(const int16_t* ids, int T, int k, int E) {
  if (std::string error = CheckShape(T, k, E); !error.empty()) return error;
  for (int t = 0; t < T; ++t) {
    if (std::string error = CheckRow(ids + int64_t{t} * k, t, k, E); !error.empty()) return error;
  }
  return "";
}

}  // namespace tandem::kernels
