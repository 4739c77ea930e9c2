// SyntheticLanguage: a seeded word-level Markov language whose entropy rate is known exactly, so a
// fresh machine has training data and a report can draw the floor no model can beat.
//
// The language: `words` distinct lowercase words (lengths in [min_word_len, max_word_len]), each
// followed by one space. Every word belongs to one of `classes` classes. The next word depends only on
// the class c of the current word: it is the word of rank r in a class-specific permutation sigma_c,
// drawn with Zipf probability (r+1)^-s / Z. The byte stream maps one-to-one onto the word sequence
// (split on spaces), so its entropy rate per byte is exactly
//     H = H_zipf(words, s) / E_pi[len(w) + 1]   nats per byte,
// where pi is the stationary distribution of the word chain (computed by solving the class chain).
//
// Threading: a const SyntheticLanguage is safe to share; generate() does not mutate it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gossamer::data {

struct SyntheticOptions {
  std::int64_t words = 64;
  std::int64_t classes = 4;
  double zipf_exponent = 1.1;
  std::int64_t min_word_len = 2;
  std::int64_t max_word_len = 7;
  std::uint64_t seed = 1;
};

class SyntheticLanguage {
 public:
  explicit SyntheticLanguage(const SyntheticOptions& options);

  // n_bytes of text (whole words; the last word may be cut), drawn from the chain started in its
  // stationary distribution with the given stream seed.
  std::string generate(std::int64_t n_bytes, std::uint64_t stream_seed) const;

  double entropy_rate_nats_per_byte() const { return entropy_per_byte_; }
  double entropy_per_word_nats() const { return entropy_per_word_; }
  double mean_bytes_per_word() const { return mean_bytes_per_word_; }
  const std::vector<std::string>& vocabulary() const { return vocab_; }
  const std::vector<double>& stationary() const { return stationary_; }  // pi over words

 private:
  SyntheticOptions options_;
  std::vector<std::string> vocab_;
  std::vector<int> word_class_;
  std::vector<std::vector<int>> perm_;  // perm_[c][rank] = word
  std::vector<double> zipf_cdf_;
  std::vector<double> stationary_;
  double entropy_per_word_ = 0.0;
  double mean_bytes_per_word_ = 0.0;
  double entropy_per_byte_ = 0.0;
};

}  // namespace gossamer::data
