#ifndef TANDEM_COMMON_TESTING_TEST_DIR_H_
#define TANDEM_COMMON_TESTING_TEST_DIR_H_

#include <filesystem>
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

}  // namespace tandem::testing

#endif  // TANDEM_COMMON_TESTING_TEST_DIR_H_
