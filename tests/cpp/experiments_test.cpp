// Tests of the experiment framework's own pieces (not of any scientific result): tables, the
// registry, and the Tagger encoder's input checks and permutation equivariance without positions.
#include <gtest/gtest.h>

#include <cmath>

#include "../../src/experiments/tagger.h"
#include "qkv/experiments/experiment.h"

namespace qkv::experiments {
namespace {

TEST(Table, TextAlignsColumnsAndMarkdownHasOneRowPerLine) {
  Table t;
  t.header = {"a", "long header"};
  t.rows = {{"x", "1"}, {"yyyy", "22"}};
  EXPECT_EQ(t.text(), "a     long header\n-----------------\nx     1\nyyyy  22\n");
  EXPECT_EQ(t.markdown(), "| a | long header |\n|---|--:|\n| x | 1 |\n| yyyy | 22 |\n");
}

TEST(Registry, NamesEveryClaimAndRejectsUnknownNames) {
  std::vector<std::string> names;
  for (const auto& e : registry()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"bottleneck", "parallelism", "alignment", "scaling", "heads",
                                             "permutation", "positional", "components", "translation"}));
  try {
    find_experiment("nope");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[experiment] unknown experiment 'nope' (choose bottleneck"),
              std::string::npos);
  }
  Options o;
  EXPECT_THROW(run_experiment("parallelism", o), std::invalid_argument);  // no output directory
}

TEST(Tagger, WithoutPositionsShufflingTheInputShufflesTheOutput) {
  TaggerConfig c;
  c.vocab_in = c.vocab_out = 12;
  c.pos = PosKind::kNone;
  Rng rng(1);
  Tagger m(c, rng);
  const Ids a{{4, 5, 6, 7, 8}, {1, 5}}, b{{8, 4, 6, 5, 7}, {1, 5}};  // b[t] = a[perm[t]], perm = 4 0 2 1 3
  const Tensor ya = tagger_logits(m, a), yb = tagger_logits(m, b);
  const int64_t perm[5] = {4, 0, 2, 1, 3};
  double dev = 0, scale = 0;
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t v = 0; v < 12; ++v) {
      dev = std::max(dev, std::fabs(double(yb.at({0, t, v})) - ya.at({0, perm[t], v})));
      scale = std::max(scale, std::fabs(double(ya.at({0, t, v}))));
    }
  EXPECT_LT(dev, 1e-5 * scale);
}

TEST(Tagger, BadConfigAndInputsThrow) {
  TaggerConfig c;
  c.vocab_in = c.vocab_out = 12;
  c.heads = 3;  // 64 is not divisible by 3
  Rng rng(1);
  EXPECT_THROW(Tagger(c, rng), std::invalid_argument);
  c.heads = 4;
  c.pos = PosKind::kLearned;
  c.max_len = 4;
  Tagger m(c, rng);
  try {
    tagger_logits(m, Ids{{4, 5, 6, 7, 8}, {1, 5}});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[Tagger] length 5 exceeds"), std::string::npos);
  }
  TaggerRun run;
  run.head_mask = {1.0f};
  EXPECT_THROW(tagger_logits(m, Ids{{4, 5}, {1, 2}}, run), std::invalid_argument);
}

}  // namespace
}  // namespace qkv::experiments
