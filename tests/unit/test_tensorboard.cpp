// TensorBoard event files (zero3/train/tensorboard.hpp): CRC-32C against the check values published for it
// (the CRC catalogue's "123456789" -> 0xE3069283; RFC 3720 appendix B.4's 32 zero bytes and 32 0xFF bytes),
// TFRecord's mask, and a writer's file name and framing. The contents are read back by the tensorboard
// package in tests/mpi/tensorboard_test.sh.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/train/tensorboard.hpp"

namespace fs = std::filesystem;
using zero3::train::crc32c;
using zero3::train::masked_crc32c;
using zero3::train::TensorBoardWriter;

namespace {

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace

TEST_CASE("tensorboard: CRC-32C matches the published check values", "[train][tensorboard]") {
  REQUIRE(crc32c(bytes_of("123456789")) == 0xE3069283u);
  REQUIRE(crc32c(bytes_of(std::string(32, '\0'))) == 0x8A9136AAu);
  REQUIRE(crc32c(bytes_of(std::string(32, '\xff'))) == 0x62A8AB43u);
  // TFRecord's mask: rotate right by 15, add 0xa282ead8.
  const std::uint32_t crc = 0xE3069283u;
  REQUIRE(masked_crc32c(bytes_of("123456789")) == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST_CASE("tensorboard: a writer's file is named as TensorBoard finds it and framed record by record",
          "[train][tensorboard]") {
  const fs::path dir = fs::temp_directory_path() / ("zero3_tb_" + std::to_string(::getpid())) / "job";
  fs::remove_all(dir.parent_path());
  {
    TensorBoardWriter writer(dir);
    writer.scalar("Train/Samples/train_loss", 2.5, 16);
    writer.flush();
    REQUIRE(writer.path().parent_path() == dir);
    REQUIRE(writer.path().filename().string().rfind("events.out.tfevents.", 0) == 0);
  }
  std::vector<fs::path> files(fs::directory_iterator(dir), fs::directory_iterator{});
  REQUIRE(files.size() == 1);
  std::ifstream in(files[0], std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Two records (file_version, then the scalar), each: u64 length, masked CRC of those 8 bytes, payload,
  // masked CRC of the payload; nothing after them.
  std::size_t at = 0;
  int records = 0;
  while (at < data.size()) {
    REQUIRE(at + 12 <= data.size());
    std::uint64_t length = 0;
    std::memcpy(&length, data.data() + at, 8);
    std::uint32_t length_crc = 0;
    std::memcpy(&length_crc, data.data() + at + 8, 4);
    REQUIRE(length_crc == masked_crc32c(bytes_of(data.substr(at, 8))));
    REQUIRE(at + 16 + length <= data.size());
    std::uint32_t payload_crc = 0;
    std::memcpy(&payload_crc, data.data() + at + 12 + length, 4);
    REQUIRE(payload_crc == masked_crc32c(bytes_of(data.substr(at + 12, length))));
    if (records == 0) REQUIRE(data.substr(at + 12, length).find("brain.Event:2") != std::string::npos);
    if (records == 1) REQUIRE(data.substr(at + 12, length).find("Train/Samples/train_loss") != std::string::npos);
    at += 16 + length;
    ++records;
  }
  REQUIRE(records == 2);
  fs::remove_all(dir.parent_path());

  REQUIRE_THROWS_AS(TensorBoardWriter("/proc/no/such/dir"), zero3::ConfigError);
}
