#include "common/token_file.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/server_options.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

std::string Source(const std::string& path) { return absl::StrCat("auth token file '", path, "'"); }

}  // namespace

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path,
                                                           absl::Duration interval) {
  absl::StatusOr<std::unique_ptr<WatchedFiles>> file = WatchedFiles::Open({path}, interval);
  if (!file.ok()) return file.status();
  std::string token(absl::StripAsciiWhitespace((*file)->Contents()[0]));
  if (absl::Status valid = CheckAuthToken(token, Source(path)); !valid.ok()) return valid;
  return std::unique_ptr<TokenFile>(new TokenFile(path, *std::move(file), std::move(token)));
}

TokenFile::Token TokenFile::Current() {
  absl::MutexLock lock(&mutex_);
  const int64_t file_generation = file_->generation();
  if (file_generation == file_generation_) return token_;
  file_generation_ = file_generation;
  std::string token(absl::StripAsciiWhitespace(file_->Contents()[0]));
  if (absl::Status valid = CheckAuthToken(token, Source(path_)); !valid.ok()) {
    spdlog::warn("{} after it changed; keeping the last valid token", std::string(valid.message()));
  } else if (token != token_.value) {
    token_ = {.value = std::move(token), .generation = token_.generation + 1};
  }
  return token_;
}

}  // namespace tandem
