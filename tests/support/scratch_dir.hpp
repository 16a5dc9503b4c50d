// A fresh directory for one test case, removed with everything in it when the test case's scope ends, for
// single-process tests that write files (tests of the checkpoint format, of token files).
#pragma once

#include <unistd.h>  // getpid

#include <filesystem>
#include <string>
#include <system_error>

namespace zero3::test {

class ScratchDir {
 public:
  ScratchDir()
      : path_(std::filesystem::temp_directory_path() /
              ("zero3_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

}  // namespace zero3::test
