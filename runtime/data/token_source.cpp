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
  if (source.starts_with(kTokensScheme)) {
    const std::string_view path = source.substr(kTokensScheme.size());
    if (path.empty()) {
      throw ConfigError("zero3.data.source: \"tokens:\" needs a file path, as in \"tokens:/data/train.tok\"");
    }
    auto file = std::make_unique<TokenFile>(TokenFile::open(std::string(path), options.heldout_fraction));
    if (file->vocab_size() > options.vocab_size) {
      throw ConfigError(fmt::format(
          "zero3.data.source: token file '{}' has vocab_size {}, larger than zero3.model.vocab_size {}: its ids "
          "would index past the embedding",
          path, file->vocab_size(), options.vocab_size));
    }
    return file;
  }
  throw ConfigError(fmt::format(
      "zero3.data.source: unknown source \"{}\"; expected \"synthetic:markov\" or \"tokens:<file>\"", options.source));
}

}  // namespace zero3::data
