#include "zero3/data/token_source.hpp"

#include <fmt/format.h>

#include <string_view>

#include "zero3/core/error.hpp"
#include "zero3/data/markov.hpp"
#include "zero3/data/token_file.hpp"

namespace zero3::data {

const char* split_name(Split split) {
  return split == Split::train ? "train" : "held-out";
}

std::unique_ptr<TokenSource> make_token_source(const TokenSourceOptions& options) {
  const std::string_view source = options.source;
  if (source == "synthetic:markov") {
    return std::make_unique<MarkovSource>(MarkovOptions{.vocab_size = options.vocab_size,
                                                        .markov_order = options.markov_order,
                                                        .seed = options.seed,
                                                        .heldout_fraction = options.heldout_fraction,
                                                        .corpus_tokens = options.markov_corpus_tokens});
  }
  constexpr std::string_view kTokensScheme = "tokens:";
  constexpr std::string_view kRaw16Scheme = "raw16:";
  const bool raw16 = source.starts_with(kRaw16Scheme);
  if (source.starts_with(kTokensScheme) || raw16) {
    const std::string_view path = source.substr(raw16 ? kRaw16Scheme.size() : kTokensScheme.size());
    if (path.empty()) {
      throw ConfigError(fmt::format("zero3.data.source: \"{}\" needs a file path, as in \"{}/data/train.bin\"",
                                    raw16 ? kRaw16Scheme : kTokensScheme, raw16 ? kRaw16Scheme : kTokensScheme));
    }
    auto file = std::make_unique<TokenFile>(raw16 ? TokenFile::open_raw16(std::string(path), options.heldout_fraction)
                                                  : TokenFile::open(std::string(path), options.heldout_fraction));
    if (file->vocab_size() > options.vocab_size) {
      throw ConfigError(fmt::format(
          "zero3.data.source: token file '{}' has {} {}, larger than zero3.model.vocab_size {}: its ids would index "
          "past the embedding",
          path, file->format() == TokenFileFormat::zero3 ? "vocab_size" : "ids up to",
          file->format() == TokenFileFormat::zero3 ? file->vocab_size() : file->vocab_size() - 1, options.vocab_size));
    }
    return file;
  }
  throw ConfigError(fmt::format(
      "zero3.data.source: unknown source \"{}\"; expected \"synthetic:markov\", \"tokens:<file>\" (zero3 or llm.c) or "
      "\"raw16:<file>\" (headerless uint16)",
      options.source));
}

}  // namespace zero3::data
