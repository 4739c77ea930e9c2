#include "data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "core/check.h"

namespace gossamer::data {

namespace {

// Solves A x = b (n x n, dense, partial pivoting). n is the number of classes: tiny.
std::vector<double> solve(std::vector<std::vector<double>> a, std::vector<double> b) {
  const std::size_t n = b.size();
  for (std::size_t col = 0; col < n; ++col) {
    std::size_t pivot = col;
    for (std::size_t r = col + 1; r < n; ++r) {
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    }
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    GOSSAMER_CHECK(std::abs(a[col][col]) > 1e-300, "singular system while solving the class chain");
    for (std::size_t r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (std::size_t k = col; k < n; ++k) a[r][k] -= f * a[col][k];
      b[r] -= f * b[col];
    }
  }
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = b[i] / a[i][i];
  return x;
}

}  // namespace

SyntheticLanguage::SyntheticLanguage(const SyntheticOptions& o) : options_(o) {
  GOSSAMER_CHECK(o.words >= 2, "synthetic language needs at least 2 words");
  GOSSAMER_CHECK(o.classes >= 1 && o.classes <= o.words, "synthetic classes must be in [1, words]");
  GOSSAMER_CHECK(o.min_word_len >= 1 && o.max_word_len >= o.min_word_len, "bad synthetic word lengths");
  GOSSAMER_CHECK(o.zipf_exponent >= 0.0, "zipf exponent must be >= 0");
  const auto V = static_cast<std::size_t>(o.words);
  const auto K = static_cast<std::size_t>(o.classes);
  double capacity = 0;
  for (auto len = o.min_word_len; len <= o.max_word_len; ++len) capacity += std::pow(26.0, static_cast<double>(len));
  GOSSAMER_CHECK(capacity >= 2.0 * static_cast<double>(V), "synthetic word lengths too short for that many distinct words");

  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<std::int64_t> len_dist(o.min_word_len, o.max_word_len);
  std::uniform_int_distribution<int> letter('a', 'z');
  std::set<std::string> seen;
  while (vocab_.size() < V) {
    std::string w(static_cast<std::size_t>(len_dist(rng)), 'a');
    for (auto& ch : w) ch = static_cast<char>(letter(rng));
    if (seen.insert(w).second) vocab_.push_back(w);
  }

  // Classes: a shuffled round-robin assignment, so every class is non-empty.
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  word_class_.assign(V, 0);
  for (std::size_t i = 0; i < V; ++i) word_class_[static_cast<std::size_t>(order[i])] = static_cast<int>(i % K);

  perm_.assign(K, std::vector<int>(V));
  for (auto& p : perm_) {
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
  }

  // Zipf over ranks.
  std::vector<double> zipf(V);
  double z = 0;
  for (std::size_t r = 0; r < V; ++r) z += zipf[r] = std::pow(static_cast<double>(r + 1), -o.zipf_exponent);
  entropy_per_word_ = 0;
  zipf_cdf_.resize(V);
  double acc = 0;
  for (std::size_t r = 0; r < V; ++r) {
    zipf[r] /= z;
    entropy_per_word_ -= zipf[r] * std::log(zipf[r]);
    acc += zipf[r];
    zipf_cdf_[r] = acc;
  }
  zipf_cdf_.back() = 1.0;

  // Class chain: Q[c][c'] = sum of Zipf mass that class c's permutation puts on words of class c'.
  std::vector<std::vector<double>> q(K, std::vector<double>(K, 0.0));
  for (std::size_t c = 0; c < K; ++c) {
    for (std::size_t r = 0; r < V; ++r) q[c][static_cast<std::size_t>(word_class_[static_cast<std::size_t>(perm_[c][r])])] += zipf[r];
  }
  // Stationary rho: rho (Q - I) = 0 with sum(rho) = 1. Replace the last equation by the normalization.
  std::vector<std::vector<double>> a(K, std::vector<double>(K, 0.0));
  std::vector<double> b(K, 0.0);
  for (std::size_t i = 0; i < K; ++i) {
    for (std::size_t j = 0; j < K; ++j) a[i][j] = q[j][i] - (i == j ? 1.0 : 0.0);  // transpose
  }
  for (std::size_t j = 0; j < K; ++j) a[K - 1][j] = 1.0;
  b[K - 1] = 1.0;
  const std::vector<double> rho = solve(a, b);

  // Word stationary distribution: pi_w = sum_c rho_c * Zipf_c(w).
  stationary_.assign(V, 0.0);
  for (std::size_t c = 0; c < K; ++c) {
    for (std::size_t r = 0; r < V; ++r) stationary_[static_cast<std::size_t>(perm_[c][r])] += rho[c] * zipf[r];
  }
  mean_bytes_per_word_ = 0;
  for (std::size_t w = 0; w < V; ++w) mean_bytes_per_word_ += stationary_[w] * static_cast<double>(vocab_[w].size() + 1);
  entropy_per_byte_ = entropy_per_word_ / mean_bytes_per_word_;
}

std::string SyntheticLanguage::generate(std::int64_t n_bytes, std::uint64_t stream_seed) const {
  GOSSAMER_CHECK(n_bytes >= 0, "generate: n_bytes must be >= 0");
  std::mt19937_64 rng(stream_seed ^ (options_.seed * 0x9E3779B97F4A7C15ull));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  // Start from the stationary distribution.
  double x = u(rng), acc = 0;
  std::size_t word = stationary_.size() - 1;
  for (std::size_t w = 0; w < stationary_.size(); ++w) {
    acc += stationary_[w];
    if (x < acc) {
      word = w;
      break;
    }
  }
  std::string out;
  out.reserve(static_cast<std::size_t>(n_bytes) + static_cast<std::size_t>(options_.max_word_len) + 1);
  while (static_cast<std::int64_t>(out.size()) < n_bytes) {
    out += vocab_[word];
    out.push_back(' ');
    const auto& perm = perm_[static_cast<std::size_t>(word_class_[word])];
    const double r = u(rng);
    const auto rank = static_cast<std::size_t>(std::lower_bound(zipf_cdf_.begin(), zipf_cdf_.end(), r) - zipf_cdf_.begin());
    word = static_cast<std::size_t>(perm[std::min(rank, perm.size() - 1)]);
  }
  out.resize(static_cast<std::size_t>(n_bytes));
  return out;
}

}  // namespace gossamer::data
