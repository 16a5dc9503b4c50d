// zero3/ckpt/save_dir_lock.hpp: one holder per save directory, refused with the holder named, released
// when the holder goes away, including when its process is killed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "zero3/ckpt/save_dir_lock.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using zero3::ckpt::SaveDirInUse;
using zero3::ckpt::SaveDirLock;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("zero3-save-dir-lock-" + std::to_string(::getpid()));
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::string refusal(const fs::path& dir) {
  try {
    SaveDirLock second(dir, "the second");
  } catch (const SaveDirInUse& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a second holder of a save directory is refused, naming the directory and the first") {
  const TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  std::optional<SaveDirLock> first;
  first.emplace(dir, "pid 4242 on host somewhere");
  CHECK(fs::is_directory(dir));
  const std::string why = refusal(dir);
  CHECK_THAT(why, Contains(dir.string()));
  CHECK_THAT(why, Contains("pid 4242 on host somewhere"));
  CHECK_THAT(why, Contains("another job"));
  first.reset();
  CHECK(refusal(dir).empty());
  SaveDirLock moved = SaveDirLock(dir, "third");
  SaveDirLock target = std::move(moved);
  CHECK(target.dir() == dir);
  CHECK_FALSE(refusal(dir).empty());
}

TEST_CASE("the lock dies with its process, kill -9 included") {
  const TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      const SaveDirLock held(dir, zero3::ckpt::describe_owner(2));
      (void)::write(ready[1], "x", 1);
      ::pause();
    } catch (...) {
    }
    ::_exit(1);
  }
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  const std::string why = refusal(dir);
  CHECK_THAT(why, Contains("pid " + std::to_string(child) + " on host"));
  CHECK_THAT(why, Contains("rank 0 of 2"));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK(refusal(dir).empty());
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_CASE("a save directory that cannot be made is a ConfigError, not a refusal") {
  const TempDir tmp;
  fs::create_directories(tmp.path);
  std::ofstream(tmp.path / "file") << "x";
  try {
    SaveDirLock lock(tmp.path / "file" / "ckpt", "me");
    FAIL("no error");
  } catch (const SaveDirInUse&) {
    FAIL("reported as in use");
  } catch (const zero3::ConfigError& e) {
    CHECK_THAT(std::string(e.what()), Contains("cannot create the directory"));
  }
}
