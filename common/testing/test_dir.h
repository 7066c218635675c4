#ifndef TANDEM_COMMON_TESTING_TEST_DIR_H_
#define TANDEM_COMMON_TESTING_TEST_DIR_H_

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace tandem::testing {

// An empty directory of its own for the running test: <test tmpdir>/<prefix>_<test name>,
// emptied first (a rerun in the same sandbox starts clean).
inline std::string FreshTestDir(const std::string& prefix) {
  const std::string dir = ::testing::TempDir() + "/" + prefix + "_" +
                          ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Damages a file as a disk fault would: flips bits `mask` of the byte at `offset` (counted from
// `from`). False if the file cannot be read or written there.
inline bool FlipByte(const std::string& path, std::streamoff offset,
                     std::ios::seekdir from = std::ios::beg, char mask = 0x40) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  char byte = 0;
  file.seekg(offset, from);
  file.read(&byte, 1);
  file.seekp(offset, from);
  byte ^= mask;
  file.write(&byte, 1);
  return file.good();
}

}  // namespace tandem::testing

#endif  // TANDEM_COMMON_TESTING_TEST_DIR_H_
