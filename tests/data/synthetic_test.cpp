#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "data/synthetic.h"

using namespace gossamer::data;

TEST_CASE("synthetic language: vocabulary, determinism, byte alphabet") {
  SyntheticOptions o;
  SyntheticLanguage a(o), b(o);
  CHECK(a.vocabulary() == b.vocabulary());
  CHECK(a.vocabulary().size() == 64);
  CHECK(std::set<std::string>(a.vocabulary().begin(), a.vocabulary().end()).size() == 64);
  const std::string t1 = a.generate(5000, 3), t2 = b.generate(5000, 3), t3 = a.generate(5000, 4);
  CHECK(t1.size() == 5000);
  CHECK(t1 == t2);
  CHECK(t1 != t3);
  for (char ch : t1) CHECK(((ch >= 'a' && ch <= 'z') || ch == ' '));
}

TEST_CASE("stationary distribution sums to one and matches generated word frequencies") {
  SyntheticOptions o;
  o.words = 20;
  o.classes = 3;
  SyntheticLanguage lang(o);
  double sum = 0;
  for (double p : lang.stationary()) sum += p;
  CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
  std::istringstream in(lang.generate(2'000'000, 9));
  std::map<std::string, double> counts;
  std::string w;
  double n = 0;
  while (in >> w) counts[w] += 1, n += 1;
  for (std::size_t i = 0; i < lang.vocabulary().size(); ++i) {
    const double expected = lang.stationary()[i];
    const double got = counts[lang.vocabulary()[i]] / n;
    CHECK(got == doctest::Approx(expected).epsilon(0.05).scale(0.002));
  }
}

TEST_CASE("entropy rate equals the empirical code length of the true model") {
  // The exact rate is H_zipf / E[bytes per word]. Check it against the average of -log p(next word)
  // over a long sample, divided by the bytes that sample spans.
  SyntheticOptions o;
  o.words = 16;
  o.classes = 2;
  o.zipf_exponent = 1.0;
  SyntheticLanguage lang(o);
  double h = 0, z = 0;
  for (int r = 1; r <= 16; ++r) z += 1.0 / r;
  for (int r = 1; r <= 16; ++r) h -= (1.0 / r / z) * std::log(1.0 / r / z);
  CHECK(lang.entropy_per_word_nats() == doctest::Approx(h).epsilon(1e-12));
  const std::string text = lang.generate(3'000'000, 1);
  std::istringstream in(text);
  std::string w;
  double words = 0;
  while (in >> w) words += 1;
  const double empirical_bytes_per_word = static_cast<double>(text.size()) / words;
  CHECK(lang.mean_bytes_per_word() == doctest::Approx(empirical_bytes_per_word).epsilon(0.01));
  CHECK(lang.entropy_rate_nats_per_byte() == doctest::Approx(h / empirical_bytes_per_word).epsilon(0.01));
  CHECK(lang.entropy_rate_nats_per_byte() > 0.1);
  CHECK(lang.entropy_rate_nats_per_byte() < std::log(27.0));
}
