#include "services/weight_store/version_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/checksum.h"
#include "common/checksummed_message.h"
#include "common/errno_status.h"
#include "services/weight_store/reshard.h"

namespace tandem::weight_store {
namespace {

namespace fs = std::filesystem;

constexpr char kPartialSuffix[] = ".partial";
constexpr char kManifestFile[] = "manifest.binpb";
// manifest.binpb is EncodeChecksummed("TMAN", manifest): an edit on disk (say, alpha 16 ->
// 15.94) is refused rather than served.
constexpr absl::string_view kManifestMagic = "TMAN";
constexpr absl::string_view kCorruptSuffix = ".corrupt";
// <version>.announced beside the version directories: the manifest of a version announced
// before its files were durable (see RecordAnnouncement).
constexpr absl::string_view kAnnouncedSuffix = ".announced";
// A retired version's directory, set aside for the next write (not a number: recovery deletes
// it).
constexpr char kRetiredDir[] = "retired";

std::string AdapterDir(const std::string& data_dir, const std::string& adapter) {
  return (fs::path(data_dir) / absl::StrReplaceAll(adapter, {{"/", "%2F"}, {":", "%3A"}})).string();
}

std::string ShardFile(int index) { return absl::StrCat("shard-", index, ".bin"); }

std::string AnnouncementFile(const std::string& adapter_dir, int64_t version) {
  return (fs::path(adapter_dir) / absl::StrCat(version, kAnnouncedSuffix)).string();
}

// Writes `bytes` at the file's offset; false with errno set on failure.
bool WriteAll(int fd, absl::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

bool SetDirectIo(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT) == 0;
}

// The longest prefix of `bytes` to write with O_DIRECT: whole 4 KiB blocks from page-aligned
// memory (a UCX store's shards), for files of at least 1 MiB. The device then reads the bytes
// from memory without the page cache's copy, which costs ~15 ms of CPU per 59 MiB on these
// machines -- CPU that replicas fetching the version, announced before it is durable, need --
// while the write and fsync take about as long as through the page cache (~30 ms).
size_t DirectIoPrefix(absl::string_view bytes) {
  constexpr size_t kBlock = 4096;
  constexpr size_t kMinBytes = size_t{1} << 20;
  const bool aligned = reinterpret_cast<uintptr_t>(bytes.data()) % kBlock == 0;
  return aligned && bytes.size() >= kMinBytes ? bytes.size() / kBlock * kBlock : 0;
}

// A file written whole, its writeback started but not waited for: a version's files are all
// written before any is fsynced, so the disk works on every file at once instead of one
// write-and-wait after another (2-4x faster for a 59 MiB version on these machines).
class UnsyncedFile {
 public:
  // Writes over the file if it exists (keeping its blocks), truncated to `bytes`.
  static absl::StatusOr<UnsyncedFile> Write(const std::string& path, absl::string_view bytes) {
    UnsyncedFile file(path,
                      ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (file.fd_ < 0) return ErrnoStatus("cannot create", path);
    size_t done = 0;
    // Where the filesystem takes no O_DIRECT (tmpfs before Linux 6.6) or refuses the request,
    // everything goes through the page cache.
    if (const size_t direct = DirectIoPrefix(bytes); direct > 0 && SetDirectIo(file.fd_, true)) {
      if (WriteAll(file.fd_, bytes.substr(0, direct))) {
        done = direct;
      } else if (errno != EINVAL) {
        return ErrnoStatus("cannot write", path);
      } else if (::lseek(file.fd_, 0, SEEK_SET) != 0) {
        return ErrnoStatus("cannot seek", path);
      }
      if (!SetDirectIo(file.fd_, false)) return ErrnoStatus("cannot clear O_DIRECT on", path);
    }
    if (!WriteAll(file.fd_, bytes.substr(done))) return ErrnoStatus("cannot write", path);
    if (::ftruncate(file.fd_, static_cast<off_t>(bytes.size())) != 0) {
      return ErrnoStatus("cannot truncate", path);
    }
    // Only a hint: fsync is what makes the bytes durable, so a failure here changes nothing.
    ::sync_file_range(file.fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
    return file;
  }

  UnsyncedFile(UnsyncedFile&& other) noexcept
      : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}
  UnsyncedFile& operator=(UnsyncedFile&&) = delete;
  ~UnsyncedFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Waits until the file's bytes are on disk.
  absl::Status Sync() const {
    return ::fsync(fd_) == 0 ? absl::OkStatus() : ErrnoStatus("cannot fsync", path_);
  }

 private:
  UnsyncedFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_;
};

absl::Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path);
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  return synced ? absl::OkStatus() : ErrnoStatus("cannot fsync", path);
}

absl::Status ReadInto(const std::string& path, char* out, size_t length) {
  std::ifstream in(path, std::ios::binary);
  in.read(out, static_cast<std::streamsize>(length));
  if (!in || in.peek() != std::ifstream::traits_type::eof()) {
    return absl::DataLossError(absl::StrCat(path, " is not ", length, " bytes"));
  }
  return absl::OkStatus();
}

// Renames a damaged version directory to <dir>.corrupt; says what happened.
std::string MoveAside(const std::string& dir) {
  const std::string aside = absl::StrCat(dir, kCorruptSuffix);
  std::error_code error;
  fs::remove_all(aside, error);
  fs::rename(dir, aside, error);
  if (error) return absl::StrCat("could not move it to ", aside, ": ", error.message());
  return absl::StrCat("moved to ", aside);
}

// A file written with EncodeChecksummed(kManifestMagic, manifest); DATA_LOSS if damaged.
absl::StatusOr<weightstore::v1::Manifest> ReadManifest(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  if (!in || !(bytes << in.rdbuf()) || bytes.str().empty()) {
    return absl::DataLossError(absl::StrCat("no readable manifest in ", path.string()));
  }
  weightstore::v1::Manifest manifest;
  if (absl::Status status = DecodeChecksummed(kManifestMagic, bytes.str(), manifest);
      !status.ok()) {
    return absl::DataLossError(absl::StrCat(path.string(), ": ", status.message()));
  }
  return manifest;
}

absl::StatusOr<std::unique_ptr<CommittedVersion>> ReadVersion(const fs::path& dir,
                                                              transfer::UcxWorker* ucx) {
  auto version = std::make_unique<CommittedVersion>();
  absl::StatusOr<weightstore::v1::Manifest> manifest = ReadManifest(dir / kManifestFile);
  if (!manifest.ok()) return manifest.status();
  version->manifest = *std::move(manifest);
  for (int i = 0; i < version->manifest.shards_size(); ++i) {
    const weightstore::v1::Shard& shard = version->manifest.shards(i);
    absl::StatusOr<std::unique_ptr<ShardBuffer>> buffer =
        ShardBuffer::Allocate(ucx, shard.byte_size());
    if (!buffer.ok()) return buffer.status();
    if (absl::Status status =
            ReadInto((dir / ShardFile(i)).string(), (*buffer)->data(), shard.byte_size());
        !status.ok()) {
      return status;
    }
    if (Xxh3Checksum((*buffer)->bytes()) != shard.xxh3_64()) {
      return absl::DataLossError(absl::StrCat(dir.string(), ": shard ", i, " checksum mismatch"));
    }
    version->shards.push_back(*std::move(buffer));
  }
  if (ucx != nullptr) version->layout_key = PlanLayoutKey(version->manifest);
  return version;
}

// Makes `partial_dir` (absent on entry) from the adapter's retired files if any are set aside,
// keeping only the files a version of `shards` shards overwrites; else an empty directory.
absl::Status ReuseRetiredFiles(const std::string& adapter_dir, const std::string& partial_dir,
                               size_t shards) {
  std::error_code error;
  fs::rename(fs::path(adapter_dir) / kRetiredDir, partial_dir, error);
  if (!error) {
    bool kept_only_files_to_overwrite = true;
    for (const fs::directory_entry& entry : fs::directory_iterator(partial_dir, error)) {
      const std::string name = entry.path().filename().string();
      bool overwritten = name == kManifestFile;
      for (size_t i = 0; i < shards && !overwritten; ++i) overwritten = name == ShardFile(i);
      std::error_code removed;
      // Not a symlink: a write through one would land outside the data directory.
      const bool regular = entry.symlink_status(removed).type() == fs::file_type::regular;
      if (!overwritten || !regular) fs::remove_all(entry.path(), removed);
      kept_only_files_to_overwrite &= !removed;
    }
    if (!error && kept_only_files_to_overwrite) return absl::OkStatus();
    fs::remove_all(partial_dir, error);  // Reused in part: start afresh instead.
  }
  if (!fs::create_directories(partial_dir, error) && error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", partial_dir, ": ", error.message()));
  }
  return absl::OkStatus();
}

// The manifests of the announcement records at `paths` whose versions never became durable; the
// other records are deleted: those of versions on disk or below one (their number can never be
// published again), and damaged ones (a record is synced before its version is announced, so a
// damaged one was never announced).
std::vector<weightstore::v1::Manifest> UnwrittenAnnouncements(
    const std::string& data_dir, const std::vector<fs::path>& paths,
    const std::vector<std::unique_ptr<CommittedVersion>>& committed) {
  absl::flat_hash_map<std::string, int64_t> newest;
  for (const auto& version : committed) {
    int64_t& number = newest[version->manifest.adapter_name()];
    number = std::max(number, version->manifest.version());
  }
  std::vector<weightstore::v1::Manifest> unwritten;
  for (const fs::path& path : paths) {
    absl::StatusOr<weightstore::v1::Manifest> manifest = ReadManifest(path);
    const bool current = manifest.ok() &&
                         path == AnnouncementFile(AdapterDir(data_dir, manifest->adapter_name()),
                                                  manifest->version()) &&
                         manifest->version() > newest[manifest->adapter_name()];
    if (current) {
      unwritten.push_back(*std::move(manifest));
    } else {
      std::error_code error;
      fs::remove(path, error);
    }
  }
  return unwritten;
}

}  // namespace

weightstore::v1::VersionInfo CommittedVersion::Info() const { return VersionInfoOf(manifest); }

weightstore::v1::VersionInfo VersionInfoOf(const weightstore::v1::Manifest& manifest) {
  weightstore::v1::VersionInfo info;
  info.set_adapter_name(manifest.adapter_name());
  info.set_version(manifest.version());
  info.set_total_bytes(manifest.total_bytes());
  *info.mutable_commit_time() = manifest.commit_time();
  info.set_name(
      absl::StrCat("adapters/", manifest.adapter_name(), "/versions/", manifest.version()));
  return info;
}

absl::Status WriteVersion(const std::string& data_dir, const CommittedVersion& version) {
  const std::string adapter_dir = AdapterDir(data_dir, version.manifest.adapter_name());
  const std::string final_dir =
      (fs::path(adapter_dir) / absl::StrCat(version.manifest.version())).string();
  const std::string partial_dir = final_dir + kPartialSuffix;
  std::error_code error;
  fs::remove_all(partial_dir, error);
  if (absl::Status status = ReuseRetiredFiles(adapter_dir, partial_dir, version.shards.size());
      !status.ok()) {
    return status;
  }
  std::vector<UnsyncedFile> files;
  const auto write = [&](const std::string& name, absl::string_view bytes) {
    absl::StatusOr<UnsyncedFile> file =
        UnsyncedFile::Write((fs::path(partial_dir) / name).string(), bytes);
    if (file.ok()) files.push_back(*std::move(file));
    return file.status();
  };
  for (size_t i = 0; i < version.shards.size(); ++i) {
    if (absl::Status status = write(ShardFile(i), version.shards[i]->bytes()); !status.ok()) {
      return status;
    }
  }
  if (absl::Status status =
          write(kManifestFile, EncodeChecksummed(kManifestMagic, version.manifest));
      !status.ok()) {
    return status;
  }
  for (const UnsyncedFile& file : files) {
    if (absl::Status status = file.Sync(); !status.ok()) return status;
  }
  if (absl::Status status = SyncDirectory(partial_dir); !status.ok()) return status;
  fs::rename(partial_dir, final_dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", partial_dir, ": ", error.message()));
  }
  if (absl::Status status = SyncDirectory(adapter_dir); !status.ok()) return status;
  // Durable now, so the record has done its work; one left behind is dropped by recovery.
  ForgetAnnouncement(data_dir, version.manifest.adapter_name(), version.manifest.version());
  return absl::OkStatus();
}

absl::Status RecordAnnouncement(const std::string& data_dir,
                                const weightstore::v1::Manifest& manifest) {
  const std::string adapter_dir = AdapterDir(data_dir, manifest.adapter_name());
  std::error_code error;
  const bool created = fs::create_directories(adapter_dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", adapter_dir, ": ", error.message()));
  }
  // Written aside and renamed over: a record published again is replaced whole or not at all.
  const std::string path = AnnouncementFile(adapter_dir, manifest.version());
  const std::string written = path + ".tmp";
  absl::StatusOr<UnsyncedFile> record =
      UnsyncedFile::Write(written, EncodeChecksummed(kManifestMagic, manifest));
  if (!record.ok()) return record.status();
  if (absl::Status status = record->Sync(); !status.ok()) return status;
  fs::rename(written, path, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", written, ": ", error.message()));
  }
  if (created) {  // A new adapter's directory must itself survive a crash.
    if (absl::Status status = SyncDirectory(data_dir); !status.ok()) return status;
  }
  return SyncDirectory(adapter_dir);
}

void ForgetAnnouncement(const std::string& data_dir, const std::string& adapter, int64_t version) {
  std::error_code error;
  fs::remove(AnnouncementFile(AdapterDir(data_dir, adapter), version), error);
}

absl::Status DeleteVersion(const std::string& data_dir, const std::string& adapter,
                           int64_t version) {
  std::error_code error;
  fs::remove_all(fs::path(AdapterDir(data_dir, adapter)) / absl::StrCat(version), error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot delete ", adapter, "@", version));
  return absl::OkStatus();
}

absl::Status RetireVersion(const std::string& data_dir, const std::string& adapter,
                           int64_t version) {
  const fs::path adapter_dir = AdapterDir(data_dir, adapter);
  std::error_code error;
  // Fails if files are set aside already: the rename never replaces a non-empty directory.
  fs::rename(adapter_dir / absl::StrCat(version), adapter_dir / kRetiredDir, error);
  if (error) return DeleteVersion(data_dir, adapter, version);
  // Durable before a write reuses the blocks: a crash must not leave a numbered directory
  // holding another version's bytes (recovery would move it aside as corrupt).
  return SyncDirectory(adapter_dir.string());
}

absl::StatusOr<StoredVersions> ReadVersions(const std::string& data_dir, transfer::UcxWorker* ucx) {
  StoredVersions stored;
  std::vector<fs::path> announcements;
  std::error_code error;
  fs::create_directories(data_dir, error);
  for (const fs::directory_entry& adapter : fs::directory_iterator(data_dir, error)) {
    if (!adapter.is_directory()) continue;
    for (const fs::directory_entry& entry : fs::directory_iterator(adapter.path(), error)) {
      const std::string name = entry.path().filename().string();
      if (absl::EndsWith(name, kCorruptSuffix)) continue;  // Kept for inspection.
      if (absl::EndsWith(name, kAnnouncedSuffix)) {
        announcements.push_back(entry.path());
        continue;
      }
      int64_t number = 0;
      if (!absl::SimpleAtoi(name, &number)) {  // An interrupted write (".partial") or junk.
        fs::remove_all(entry.path(), error);
        continue;
      }
      absl::StatusOr<std::unique_ptr<CommittedVersion>> version = ReadVersion(entry.path(), ucx);
      if (absl::IsDataLoss(version.status())) {
        // Damaged on disk: moved aside (kept for inspection), so the number can be published
        // again. Anything else (memory, UCX registration) is no verdict on the files.
        stored.skipped.push_back(
            absl::StrCat(version.status().message(), "; ", MoveAside(entry.path().string())));
        continue;
      }
      if (!version.ok()) return version.status();
      const weightstore::v1::Manifest& manifest = (*version)->manifest;
      if (manifest.version() != number ||
          AdapterDir(data_dir, manifest.adapter_name()) != adapter.path().string()) {
        stored.skipped.push_back(absl::StrCat(entry.path().string(), " holds ",
                                              manifest.adapter_name(), "@", manifest.version(),
                                              "; ", MoveAside(entry.path().string())));
        continue;
      }
      stored.committed.push_back(*std::move(version));
    }
  }
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot list ", data_dir, ": ", error.message()));
  }
  stored.unwritten = UnwrittenAnnouncements(data_dir, announcements, stored.committed);
  return stored;
}

}  // namespace tandem::weight_store
