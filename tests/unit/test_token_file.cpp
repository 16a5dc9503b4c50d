// Token files: write/open round trips at both widths, window layout and splits, atomic writes, and every
// validation error naming the file (missing, bad magic, version, width, truncated, trailing bytes, id out of
// vocabulary with its index and value, context longer than the data), plus the source factory; llm.c shards
// (both of llm.c's header variants) and headerless uint16 files written here byte by byte, read back, and
// their bad headers named.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "scratch_dir.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/data/token_file.hpp"

namespace fs = std::filesystem;
using zero3::data::Split;
using zero3::data::TokenFile;
using zero3::data::TokenId;
using zero3::data::write_token_file;

namespace {

using zero3::test::ScratchDir;

std::vector<TokenId> random_ids(std::int64_t count, std::int64_t vocab, std::uint64_t seed) {
  const zero3::CounterRng rng(seed, zero3::hash_name("token_file_test"));
  std::vector<TokenId> ids(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<TokenId>(rng.bits(i) % vocab);
  return ids;
}

// Overwrites bytes of a file in place.
void patch(const fs::path& path, std::size_t offset, const std::vector<unsigned char>& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

// Writes raw bytes: an llm.c shard or a raw16 file, byte by byte as their writers lay them out.
void write_bytes(const fs::path& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

void put_le(std::vector<unsigned char>& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>((value >> (8 * i)) & 0xffu));
}

// llm.c's dev/data/data_common.py layout: 256 int32 (magic, version, token count, zeros), then the ids.
std::vector<unsigned char> llmc_shard(std::int32_t magic, std::int32_t version, std::int64_t count_in_header,
                                      const std::vector<TokenId>& ids, int width) {
  std::vector<unsigned char> out;
  put_le(out, static_cast<std::uint32_t>(magic), 4);
  put_le(out, static_cast<std::uint32_t>(version), 4);
  put_le(out, static_cast<std::uint32_t>(count_in_header), 4);
  out.resize(256 * 4, 0);
  for (TokenId id : ids) put_le(out, static_cast<std::uint32_t>(id), width);
  return out;
}

template <class Fn>
std::string config_error(Fn fn) {
  try {
    fn();
  } catch (const zero3::ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError thrown");
  return {};
}

}  // namespace

TEST_CASE("token file: round trip at 2 and 4 bytes per token, windows stride by the context", "[data][token_file]") {
  ScratchDir dir;
  for (int width : {2, 4}) {
    const std::int64_t vocab = width == 2 ? 50257 : 100000;
    const auto ids = random_ids(10'000, vocab, static_cast<std::uint64_t>(width));
    const fs::path path = dir / ("ids" + std::to_string(width) + ".tok");
    write_token_file(path, ids, vocab, width);
    REQUIRE(fs::file_size(path) == 32 + ids.size() * static_cast<std::size_t>(width));
    for (const auto& entry : fs::directory_iterator(dir.path())) {  // the temporary was renamed away
      REQUIRE(entry.path().string().find(".tmp.") == std::string::npos);
    }

    const TokenFile file = TokenFile::open(path, 0.1);
    REQUIRE(file.vocab_size() == vocab);
    REQUIRE(file.token_count() == 10'000);
    REQUIRE(file.bytes_per_token() == width);
    REQUIRE(file.split_tokens(Split::train) == 9'000);
    REQUIRE(file.split_tokens(Split::heldout) == 1'000);
    for (std::int64_t i = 0; i < 10'000; ++i) REQUIRE(file.at(i) == ids[static_cast<std::size_t>(i)]);

    const std::int64_t context = 64;
    REQUIRE(file.num_samples(Split::train, context) == (9'000 - 1) / 64);
    REQUIRE(file.num_samples(Split::heldout, context) == (1'000 - 1) / 64);
    std::vector<TokenId> window(context + 1, -1);
    for (std::int64_t i : {std::int64_t{0}, std::int64_t{5}, file.num_samples(Split::train, context) - 1}) {
      file.tokens(Split::train, i, context, window);
      for (std::int64_t t = 0; t <= context; ++t) {
        REQUIRE(window[static_cast<std::size_t>(t)] == ids[static_cast<std::size_t>(i * context + t)]);
      }
    }
    // Held-out windows start at the split boundary and stay inside the held-out tokens.
    const std::int64_t last = file.num_samples(Split::heldout, context) - 1;
    for (std::int64_t i : {std::int64_t{0}, last}) {
      file.tokens(Split::heldout, i, context, window);
      REQUIRE(9'000 + i * context + context < 10'000);
      for (std::int64_t t = 0; t <= context; ++t) {
        REQUIRE(window[static_cast<std::size_t>(t)] == ids[static_cast<std::size_t>(9'000 + i * context + t)]);
      }
    }
    REQUIRE_THROWS_AS(file.tokens(Split::heldout, last + 1, context, window), zero3::UsageError);
  }
}

TEST_CASE("token file: a moved file stays usable and rewriting replaces it whole", "[data][token_file]") {
  ScratchDir dir;
  const fs::path path = dir / "a.tok";
  write_token_file(path, random_ids(100, 10, 1), 10, 2);
  TokenFile first = TokenFile::open(path);
  const TokenId first_token = first.at(0);
  TokenFile moved = std::move(first);
  REQUIRE(moved.at(0) == first_token);
  // The open mapping keeps the old contents even after an atomic rewrite.
  write_token_file(path, std::vector<TokenId>(50, 3), 10, 4);
  REQUIRE(moved.at(0) == first_token);
  REQUIRE(moved.token_count() == 100);
  const TokenFile reopened = TokenFile::open(path);
  REQUIRE(reopened.token_count() == 50);
  REQUIRE(reopened.at(49) == 3);
}

TEST_CASE("token file: validation errors name the file and what is wrong", "[data][token_file]") {
  ScratchDir dir;
  const auto ids = random_ids(1000, 100, 7);
  const auto fresh = [&](const std::string& name) {
    const fs::path path = dir / name;
    write_token_file(path, ids, 100, 2);
    return path;
  };

  const fs::path missing = dir / "missing.tok";
  REQUIRE_THAT(config_error([&] { TokenFile::open(missing); }),
               Catch::Contains(missing.string()) && Catch::Contains("No such file or directory"));

  const fs::path magic = fresh("magic.tok");
  patch(magic, 0, {'G', 'P', 'T'});
  REQUIRE_THAT(config_error([&] { TokenFile::open(magic); }),
               Catch::Contains(magic.string()) && Catch::Contains("bad magic \"GPTO3TOK\""));

  const fs::path version = fresh("version.tok");
  patch(version, 8, {2, 0, 0, 0});
  REQUIRE_THAT(config_error([&] { TokenFile::open(version); }), Catch::Contains("unsupported version 2"));

  const fs::path width = fresh("width.tok");
  patch(width, 12, {3, 0, 0, 0});
  REQUIRE_THAT(config_error([&] { TokenFile::open(width); }), Catch::Contains("unsupported bytes_per_token 3"));

  const fs::path truncated = fresh("truncated.tok");
  fs::resize_file(truncated, 32 + 2 * 1000 - 1);
  REQUIRE_THAT(config_error([&] { TokenFile::open(truncated); }),
               Catch::Contains(truncated.string()) && Catch::Contains("1000 tokens x 2 bytes") &&
                   Catch::Contains("1999 bytes") && Catch::Contains("truncated"));

  const fs::path trailing = fresh("trailing.tok");
  fs::resize_file(trailing, 32 + 2 * 1000 + 2);
  REQUIRE_THAT(config_error([&] { TokenFile::open(trailing); }), Catch::Contains("trailing bytes"));

  const fs::path stub = fresh("stub.tok");
  fs::resize_file(stub, 20);
  REQUIRE_THAT(config_error([&] { TokenFile::open(stub); }), Catch::Contains("shorter than the 32-byte header"));

  // Two ids out of range: the first is reported, with its index and value.
  const fs::path out_of_vocab = fresh("vocab.tok");
  patch(out_of_vocab, 32 + 2 * 777, {150, 0});
  patch(out_of_vocab, 32 + 2 * 900, {0, 1});
  REQUIRE_THAT(config_error([&] { TokenFile::open(out_of_vocab); }), Catch::Contains(out_of_vocab.string()) &&
                                                                         Catch::Contains("token 777 has id 150") &&
                                                                         Catch::Contains("vocab_size = 100"));

  const TokenFile file = TokenFile::open(fresh("ok.tok"), 0.1);  // 900 train, 100 held-out tokens
  REQUIRE_NOTHROW(file.check_context(99));
  REQUIRE_THAT(config_error([&] { file.check_context(100); }),
               Catch::Contains("ok.tok") && Catch::Contains("context length 100") && Catch::Contains("101 tokens") &&
                   Catch::Contains("900 train and 100 held-out"));
  REQUIRE(file.num_samples(Split::heldout, 100) == 0);
  REQUIRE_THROWS_AS(TokenFile::open(fresh("fraction.tok"), 1.0), zero3::ConfigError);
}

TEST_CASE("token file: the writer refuses ids and widths that do not fit", "[data][token_file]") {
  ScratchDir dir;
  const fs::path path = dir / "w.tok";
  REQUIRE_THAT(config_error([&] {
                 write_token_file(path, std::vector<TokenId>{1, 2, 12}, 10, 2);
               }),
               Catch::Contains("token 2 has id 12"));
  REQUIRE_THAT(config_error([&] { write_token_file(path, std::vector<TokenId>{1}, 70000, 2); }),
               Catch::Contains("vocab_size 70000 does not fit 2 bytes"));
  REQUIRE_THROWS_AS(write_token_file(path, std::vector<TokenId>{1}, 10, 3), zero3::ConfigError);
  REQUIRE_THROWS_AS(write_token_file(dir / "no_such_dir" / "w.tok", std::vector<TokenId>{1}, 10, 2),
                    zero3::ConfigError);
  REQUIRE_FALSE(fs::exists(path));  // nothing half-written was left behind
}

TEST_CASE("token source factory: schemes, vocabulary and errors", "[data][token_file]") {
  using zero3::data::make_token_source;
  using zero3::data::TokenSourceOptions;
  ScratchDir dir;
  const fs::path path = dir / "f.tok";
  write_token_file(path, random_ids(5000, 300, 2), 300, 2);

  const auto file = make_token_source(
      TokenSourceOptions{.source = "tokens:" + path.string(), .vocab_size = 512, .heldout_fraction = 0.2});
  REQUIRE(file->vocab_size() == 300);
  REQUIRE(file->num_samples(Split::heldout, 10) == (1000 - 1) / 10);
  REQUIRE_FALSE(file->entropy_floor().has_value());

  const auto markov = make_token_source(TokenSourceOptions{
      .source = "synthetic:markov", .vocab_size = 32, .markov_order = 2, .markov_corpus_tokens = 1 << 12});
  REQUIRE(markov->vocab_size() == 32);
  REQUIRE(markov->entropy_floor().has_value());
  REQUIRE_THAT(markov->describe(), Catch::Contains("synthetic:markov"));

  REQUIRE_THAT(config_error([&] {
                 make_token_source(TokenSourceOptions{.source = "tokens:" + path.string(), .vocab_size = 256});
               }),
               Catch::Contains("vocab_size 300") && Catch::Contains("zero3.model.vocab_size 256"));
  REQUIRE_THAT(config_error([] { make_token_source(TokenSourceOptions{.source = "hf:wikitext", .vocab_size = 8}); }),
               Catch::Contains("zero3.data.source") && Catch::Contains("hf:wikitext"));
  REQUIRE_THAT(config_error([] { make_token_source(TokenSourceOptions{.source = "tokens:", .vocab_size = 8}); }),
               Catch::Contains("zero3.data.source"));
}

TEST_CASE("token file: llm.c shards and headerless uint16 files read back the ids written", "[data][token_file]") {
  ScratchDir dir;
  const auto gpt2_ids = random_ids(5000, 50257, 11);
  const fs::path gpt2 = dir / "fineweb_train_000001.bin";
  write_bytes(gpt2, llmc_shard(20240520, 1, 5000, gpt2_ids, 2));
  const TokenFile shard = TokenFile::open(gpt2, 0.2);
  REQUIRE(shard.format() == zero3::data::TokenFileFormat::llmc);
  REQUIRE(shard.bytes_per_token() == 2);
  REQUIRE(shard.token_count() == 5000);
  REQUIRE(shard.split_tokens(Split::heldout) == 1000);
  TokenId largest = 0;
  for (std::int64_t i = 0; i < 5000; ++i) {
    REQUIRE(shard.at(i) == gpt2_ids[static_cast<std::size_t>(i)]);
    largest = std::max(largest, gpt2_ids[static_cast<std::size_t>(i)]);
  }
  REQUIRE(shard.vocab_size() == largest + 1);  // no vocabulary in the file: the largest id bounds it
  std::vector<TokenId> window(33);
  shard.tokens(Split::heldout, 2, 32, window);
  for (std::size_t t = 0; t < window.size(); ++t) REQUIRE(window[t] == gpt2_ids[4000 + 64 + t]);
  REQUIRE_THAT(shard.describe(), Catch::Contains("llm.c"));

  const std::vector<TokenId> llama_ids = {0, 128000, 9906, 1917, 128255, 13};  // beyond 16 bits
  const fs::path llama = dir / "llama3.bin";
  write_bytes(llama, llmc_shard(20240801, 7, 6, llama_ids, 4));
  const TokenFile wide = TokenFile::open(llama, 0.5);
  REQUIRE(wide.bytes_per_token() == 4);
  for (std::int64_t i = 0; i < 6; ++i) REQUIRE(wide.at(i) == llama_ids[static_cast<std::size_t>(i)]);
  REQUIRE(wide.vocab_size() == 128256);

  std::vector<unsigned char> raw_bytes;
  const auto raw_ids = random_ids(777, 65536, 5);
  for (TokenId id : raw_ids) put_le(raw_bytes, static_cast<std::uint32_t>(id), 2);
  const fs::path raw = dir / "train.bin";
  write_bytes(raw, raw_bytes);
  const TokenFile headerless = TokenFile::open_raw16(raw, 0.1);
  REQUIRE(headerless.format() == zero3::data::TokenFileFormat::raw16);
  REQUIRE(headerless.token_count() == 777);
  for (std::int64_t i = 0; i < 777; ++i) REQUIRE(headerless.at(i) == raw_ids[static_cast<std::size_t>(i)]);
  REQUIRE_THAT(headerless.describe(), Catch::StartsWith("raw16:"));
}

TEST_CASE("token file: bad llm.c headers and raw16 files are named errors", "[data][token_file]") {
  ScratchDir dir;
  const auto ids = random_ids(100, 1000, 3);
  const fs::path version = dir / "version.bin";
  write_bytes(version, llmc_shard(20240520, 2, 100, ids, 2));
  REQUIRE_THAT(config_error([&] { TokenFile::open(version); }),
               Catch::Contains(version.string()) && Catch::Contains("llm.c magic 20240520 with version 2"));

  const fs::path truncated = dir / "truncated.bin";
  write_bytes(truncated, llmc_shard(20240520, 1, 101, ids, 2));  // the header claims one token more
  REQUIRE_THAT(config_error([&] { TokenFile::open(truncated); }), Catch::Contains("101 tokens x 2 bytes") &&
                                                                      Catch::Contains("1024-byte header") &&
                                                                      Catch::Contains("truncated"));

  const fs::path negative = dir / "negative.bin";
  write_bytes(negative, llmc_shard(20240520, 1, -5, ids, 2));
  REQUIRE_THAT(config_error([&] { TokenFile::open(negative); }), Catch::Contains("token count -5"));

  const fs::path stub = dir / "stub.bin";
  auto stub_bytes = llmc_shard(20240520, 1, 0, {}, 2);
  stub_bytes.resize(100);
  write_bytes(stub, stub_bytes);
  REQUIRE_THAT(config_error([&] { TokenFile::open(stub); }), Catch::Contains("shorter than llm.c's 1024-byte header"));

  const fs::path empty_shard = dir / "empty.bin";
  write_bytes(empty_shard, llmc_shard(20240520, 1, 0, {}, 2));
  REQUIRE_THAT(config_error([&] { TokenFile::open(empty_shard); }), Catch::Contains("holds no tokens"));

  const fs::path wide = dir / "wide.bin";
  write_bytes(wide, llmc_shard(20240801, 7, 3, {1, -1, 2}, 4));  // 0xffffffff: beyond any TokenId
  REQUIRE_THAT(config_error([&] { TokenFile::open(wide); }), Catch::Contains("token 1 has id 4294967295"));

  // A headerless file is not guessed: tokens: names the raw16 scheme instead.
  std::vector<unsigned char> raw_bytes;
  for (TokenId id : ids) put_le(raw_bytes, static_cast<std::uint32_t>(id), 2);
  const fs::path raw = dir / "val.bin";
  write_bytes(raw, raw_bytes);
  REQUIRE_THAT(config_error([&] { TokenFile::open(raw); }),
               Catch::Contains("bad magic") && Catch::Contains("raw16:" + raw.string()));
  raw_bytes.push_back(7);
  write_bytes(raw, raw_bytes);
  REQUIRE_THAT(config_error([&] { TokenFile::open_raw16(raw); }), Catch::Contains("201 bytes, an odd count"));
  write_bytes(raw, {});
  REQUIRE_THAT(config_error([&] { TokenFile::open_raw16(raw); }), Catch::Contains("empty"));
}

TEST_CASE("token source factory: raw16 and llm.c files against the model's vocabulary", "[data][token_file]") {
  using zero3::data::make_token_source;
  using zero3::data::TokenSourceOptions;
  ScratchDir dir;
  std::vector<unsigned char> raw_bytes;
  for (TokenId id : random_ids(3000, 256, 9)) put_le(raw_bytes, static_cast<std::uint32_t>(id), 2);
  const fs::path raw = dir / "bytes.bin";
  write_bytes(raw, raw_bytes);
  const auto source = make_token_source(
      TokenSourceOptions{.source = "raw16:" + raw.string(), .vocab_size = 256, .heldout_fraction = 0.1});
  REQUIRE(source->num_samples(Split::train, 10) == (2700 - 1) / 10);
  REQUIRE_THAT(config_error([&] {
                 make_token_source(TokenSourceOptions{.source = "raw16:" + raw.string(), .vocab_size = 200});
               }),
               Catch::Contains("ids up to 255") && Catch::Contains("zero3.model.vocab_size 200"));
  REQUIRE_THAT(config_error([] { make_token_source(TokenSourceOptions{.source = "raw16:", .vocab_size = 8}); }),
               Catch::Contains("zero3.data.source"));
}
